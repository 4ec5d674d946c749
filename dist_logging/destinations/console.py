"""ConsoleLogger: metrics on the terminal, every K batches and at epoch end."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional, TextIO

from dist_logging._values import format_log_data_value
from dist_logging.destination import LoggerDestination
from dist_logging.destinations._periodic import check_interval

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import State

__all__ = ['ConsoleLogger']


class ConsoleLogger(LoggerDestination):
    """Prints hyperparameters once, and metrics every ``log_interval`` batches and at each epoch end.

    Metrics logged between prints are kept (latest value per name) and printed
    together, so nothing logged is skipped from the printout; anything pending is
    printed at close.

    Args:
        log_interval: print every this many batches (>= 1).
        progress_bar: show a ``tqdm`` bar of batches per epoch with the latest metrics.
        total_batches: batches per epoch, for the bar's length (optional).
        log_traces: also print traces.
        stream: where to print (default ``sys.stdout``).
        ranks: rank policy (default ``'zero'``).

    Raises:
        ValueError: ``log_interval`` < 1.
    """

    def __init__(self, log_interval: int = 1, progress_bar: bool = False, total_batches: Optional[int] = None,
                 log_traces: bool = False, stream: Optional[TextIO] = None, ranks: str = 'zero',
                 log_level: Any = None, optional: Optional[bool] = None):
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        self.log_interval = check_interval('ConsoleLogger', 'log_interval', log_interval)
        self.progress_bar = progress_bar
        self.total_batches = total_batches
        self.should_log_traces = log_traces
        self.stream = stream
        self._pending: dict[str, Any] = {}
        self._pending_step: Optional[int] = None
        self._bar: Any = None

    def _write(self, line: str) -> None:
        stream = self.stream if self.stream is not None else sys.stdout
        if self._bar is not None:
            self._bar.write(line, file=stream)
        else:
            print(line, file=stream, flush=True)

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        self._write('[hparams]: ' + format_log_data_value(hyperparameters))

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        self._pending.update(metrics)
        if step is not None:
            self._pending_step = step

    def log_traces(self, traces: dict[str, Any]) -> None:
        if self.should_log_traces:
            for name, value in traces.items():
                self._write(f'[trace]: {name}: {format_log_data_value(value)}')

    def log_table(self, columns: list[str], rows: list[list[Any]], name: str = 'Table',
                  step: Optional[int] = None) -> None:
        widths = [max([len(str(c))] + [len(format_log_data_value(r[i])) for r in rows]) for i, c in enumerate(columns)]
        lines = [f'[table {name}]', ' | '.join(str(c).ljust(w) for c, w in zip(columns, widths))]
        lines += [' | '.join(format_log_data_value(v).ljust(w) for v, w in zip(row, widths)) for row in rows]
        self._write('\n'.join(lines))

    def _print_pending(self, state: 'State', where: str) -> None:
        if not self._pending:
            return
        step = self._pending_step if self._pending_step is not None else state.timestamp.batch
        values = ', '.join(f'{k}: {format_log_data_value(v)}' for k, v in self._pending.items())
        self._write(f'[{where}][epoch={state.timestamp.epoch}][batch={step}]: {values}')
        self._pending = {}
        self._pending_step = None

    def epoch_start(self, state: 'State', logger: 'Logger') -> None:
        if self.progress_bar:
            import tqdm

            if self._bar is not None:
                self._bar.close()
            self._bar = tqdm.tqdm(total=self.total_batches, desc=f'epoch {state.timestamp.epoch}',
                                  file=self.stream if self.stream is not None else sys.stderr, dynamic_ncols=True)

    def batch_end(self, state: 'State', logger: 'Logger') -> None:
        if self._bar is not None:
            self._bar.update(1)
            if self._pending:
                self._bar.set_postfix({k: format_log_data_value(v) for k, v in self._pending.items()}, refresh=False)
        if state.timestamp.batch % self.log_interval == 0:
            self._print_pending(state, 'batch')

    def epoch_end(self, state: 'State', logger: 'Logger') -> None:
        self._print_pending(state, 'epoch')
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def close(self, state: 'State', logger: 'Logger') -> None:
        self._print_pending(state, 'close')
        if self._bar is not None:
            self._bar.close()
            self._bar = None
