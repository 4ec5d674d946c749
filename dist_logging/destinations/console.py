"""ConsoleLogger: metrics on the terminal every N batches or epochs, in Composer's layout."""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any, Optional, TextIO, Union

from dist_logging._artifacts import table_json
from dist_logging._values import format_log_data_value
from dist_logging.destination import LoggerDestination

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import ResumeInfo, State

__all__ = ['ConsoleLogger', 'parse_log_interval']

_INTERVAL = re.compile(r'^\s*(\d+)\s*(ba|batch|batches|ep|epoch|epochs)\s*$', re.IGNORECASE)


def parse_log_interval(value: Union[int, str], owner: str = 'ConsoleLogger') -> tuple[int, str]:
    """``3`` -> ``(3, 'ba')``; Composer's strings ``'3ba'`` / ``'1ep'`` -> ``(3, 'ba')`` / ``(1, 'ep')``.

    Raises:
        ValueError: not an int >= 1 nor ``'<n>ba'`` / ``'<n>ep'`` with n >= 1 (names the value).
    """
    if isinstance(value, str):
        match = _INTERVAL.match(value)
        if match and int(match.group(1)) >= 1:
            return int(match.group(1)), 'ep' if match.group(2).lower().startswith('ep') else 'ba'
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value, 'ba'
    raise ValueError(
        f"{owner}: log_interval must be an int >= 1 (batches) or a string such as '10ba' or '1ep', got {value!r}"
    )


def _resolve_stream(stream: Union[str, TextIO, None]) -> Optional[TextIO]:
    if stream is None or not isinstance(stream, str):
        return stream
    if stream.lower() == 'stdout':
        return sys.stdout
    if stream.lower() == 'stderr':
        return sys.stderr
    raise ValueError(f"ConsoleLogger: stream must be 'stdout', 'stderr' or a text stream, got {stream!r}")


class ConsoleLogger(LoggerDestination):
    """Prints hyperparameters once, and the latest metrics every ``log_interval``, as Composer does.

    Each print is a progress line and one line per metric (and per table logged since the
    last print)::

        [epoch=1][batch=2]:
                 Train loss: 0.25
                 Train results: {"columns":["name","score"],"data":[["a",1]]}

    Metrics logged between prints are kept (latest value per name), so nothing logged is
    skipped: what is pending is printed at the next interval, at ``fit_end`` and at close.
    The first batch (or epoch) is always printed, as in Composer.

    Args:
        log_interval: an int (batches) or Composer's ``'<n>ba'`` / ``'<n>ep'``.
        progress_bar: show a ``tqdm`` bar of batches per epoch with the latest metrics.
        total_batches: batches per epoch, for the bar's length and the progress line (optional).
        log_traces: also print traces.
        stream: where to print: a text stream, ``'stdout'`` (the default) or ``'stderr'``.
        ranks: rank policy (default ``'zero'``).

    Attributes:
        tables: table name -> the latest table as JSON (``{"columns": [...], "data": [...]}``).

    Raises:
        ValueError: a bad ``log_interval`` or ``stream``.
    """

    def __init__(
        self,
        log_interval: Union[int, str] = 1,
        progress_bar: bool = False,
        total_batches: Optional[int] = None,
        log_traces: bool = False,
        stream: Union[str, TextIO, None] = None,
        ranks: str = 'zero',
        log_level: Any = None,
        optional: Optional[bool] = None,
    ):
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        self.log_interval, self.log_interval_unit = parse_log_interval(log_interval)
        self.progress_bar = progress_bar
        self.total_batches = total_batches
        self.should_log_traces = log_traces
        self.stream = _resolve_stream(stream)
        self.tables: dict[str, str] = {}
        self.logged_metrics: dict[str, Any] = {}
        self._metric_steps: dict[str, Optional[int]] = {}
        self._new_tables: list[str] = []
        self._printed_once = False
        self._last_printed_batch: Optional[int] = None
        self._batches_in_last_epoch = 0
        self._bar: Any = None

    def _write(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stdout
        if self._bar is not None:
            self._bar.write(text, file=stream)
        else:
            print(text, file=stream, flush=True)

    # ------------------------------------------------------------------ data hooks
    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        self._write('[hparams]: ' + format_log_data_value(hyperparameters))

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        self.logged_metrics.update(metrics)
        self._metric_steps.update(dict.fromkeys(metrics, step))

    def log_traces(self, traces: dict[str, Any]) -> None:
        if self.should_log_traces:
            for name, value in traces.items():
                self._write(f'[trace]: {name}:{format_log_data_value(value)}')

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = 'Table', step: Optional[int] = None
    ) -> None:
        self.tables[name] = table_json(columns, rows)
        if name not in self._new_tables:
            self._new_tables.append(name)

    def on_resume(self, info: 'ResumeInfo', state: 'State', logger: 'Logger') -> None:
        """Print one line: a console cannot take back what it printed, so it says where the new lines start."""
        self._write(
            f'[resume]: {info.describe()}; steps >= {info.superseded_from} printed before this line are superseded'
        )
        self._last_printed_batch = None

    # ------------------------------------------------------------------ printing
    def _progress(self, state: 'State') -> str:
        # Epochs are numbered from 1, as Composer prints them. At EPOCH_END the timestamp already
        # counts the finished epoch (batch_in_epoch is back at 0): show that epoch, complete.
        timestamp = state.timestamp
        epoch, batch = timestamp.epoch + 1, timestamp.batch_in_epoch
        if batch == 0 and timestamp.epoch > 0:
            epoch, batch = timestamp.epoch, self._batches_in_last_epoch
        total = f'/{self.total_batches}' if self.total_batches else ''
        return f'[epoch={epoch}][batch={batch}{total}]'

    def log_to_console(self, data: dict[str, Any], state: 'State', prefix: str = '', is_train: bool = True) -> None:
        """Print a progress line, then one line per entry of ``data`` and per table logged since the last print.

        Args:
            data: name -> value.
            state: the run state (for the progress line).
            prefix: put before each name (the periodic prints use ``'Train '``).
            is_train: accepted for Composer compatibility (there is no evaluation loop here).
        """
        del is_train
        text = self._progress(state) + (':' if data else '')
        for name, value in data.items():
            text += f'\n\t {prefix}{name}: {format_log_data_value(value)}'
        for name in self._new_tables:
            text += f'\n\t {prefix}{name}: {self.tables[name]}'
        self._new_tables = []
        self._write(text)

    def _print_pending(self, state: 'State') -> None:
        # The timestamp already counts the batch that ended, whose values carry step batch - 1.
        # Values reduced across ranks by an automatic flush may arrive a flush later than the
        # batch they belong to (the collective completes in the background): say which batch.
        current = state.timestamp.batch - 1
        data = {
            name: value
            if self._metric_steps.get(name) in (None, current)
            else f'{format_log_data_value(value)} (batch {self._metric_steps[name]})'
            for name, value in self.logged_metrics.items()
        }
        self.log_to_console(data, state, prefix='Train ')
        self.logged_metrics = {}
        self._metric_steps = {}
        self._printed_once = True
        self._last_printed_batch = state.timestamp.batch

    # ------------------------------------------------------------------ events
    def epoch_start(self, state: 'State', logger: 'Logger') -> None:
        if self.progress_bar:
            import tqdm

            if self._bar is not None:
                self._bar.close()
            self._bar = tqdm.tqdm(
                total=self.total_batches,
                desc=f'epoch {state.timestamp.epoch + 1}',
                file=self.stream if self.stream is not None else sys.stderr,
                dynamic_ncols=True,
            )

    def batch_end(self, state: 'State', logger: 'Logger') -> None:
        self._batches_in_last_epoch = state.timestamp.batch_in_epoch
        if self._bar is not None:
            self._bar.update(1)
            if self.logged_metrics:
                self._bar.set_postfix(
                    {k: format_log_data_value(v) for k, v in self.logged_metrics.items()}, refresh=False
                )
        if self.log_interval_unit == 'ba' and (
            state.timestamp.batch % self.log_interval == 0 or not self._printed_once
        ):
            self._print_pending(state)

    def epoch_end(self, state: 'State', logger: 'Logger') -> None:
        # The timestamp already counts the epoch that just ended (as in Composer).
        if self.log_interval_unit == 'ep' and (
            state.timestamp.epoch % self.log_interval == 0 or not self._printed_once
        ):
            self._print_pending(state)
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def fit_end(self, state: 'State', logger: 'Logger') -> None:
        if self._last_printed_batch != state.timestamp.batch and (self.logged_metrics or self._new_tables):
            self._print_pending(state)

    def close(self, state: 'State', logger: 'Logger') -> None:
        if self.logged_metrics or self._new_tables:
            self._print_pending(state)
        if self._bar is not None:
            self._bar.close()
            self._bar = None
