"""TensorboardLogger: scalars, hyperparameters, text, tables and images as TensorBoard event files."""

from __future__ import annotations

import os
import re
import time
import warnings
from typing import TYPE_CHECKING, Any, Optional

from dist_logging._artifacts import flatten, markdown_table
from dist_logging._values import format_log_data_value
from dist_logging.destination import LoggerDestination, ranks_from_rank_zero_only
from dist_logging.destinations._optional import import_installed, require_installed
from dist_logging.destinations._periodic import PeriodicFlushMixin, check_interval
from dist_logging.naming import (
    DIST_PLACEHOLDERS,
    check_rank_distinct,
    format_name_with_dist,
    validate_object_name,
    validate_template,
)

if TYPE_CHECKING:
    from dist_logging.logger import Logger
    from dist_logging.state import ResumeInfo, State

__all__ = ['TensorboardLogger']

INSTALL_HINT = 'TensorboardLogger needs the tensorboard package: pip install dist-logging[tensorboard]'
# TensorBoard's event file names: events.out.tfevents.<seconds>.<host>.<pid>.<n>; it reads a run's files in name order.
_EVENT_SECONDS = re.compile(r'tfevents\.(\d+)\.')
_ORDER_WAIT_S = 3.0  # a new event file that sorts before an existing one by less than this waits for the clock


class TensorboardLogger(PeriodicFlushMixin, LoggerDestination):
    """Writes TensorBoard event files through ``torch.utils.tensorboard.SummaryWriter``.

    * metrics -> scalars (``add_scalar``), at ``step`` or else the batch count;
    * hyperparameters -> the HParams plugin (nested names flattened with ``/``; values that
      are not numbers, strings or booleans are written as strings), in the same run folder;
    * traces -> text (``traces/<name>``); tables -> Markdown text (``<name>``);
    * images -> ``add_images`` (NHWC/NCHW as given by ``channels_last``); each mask of
      ``masks`` is overlaid in colour and written as ``<name>/<mask name>``.

    Events are written by the writer's background thread; they reach the disk every
    ``flush_interval`` batches, at epoch end and at close. When the Logger has an
    upload-capable destination, each event file is then uploaded (``overwrite=True``) as
    ``<remote_dir>/<path inside log_dir>``.

    Args:
        log_dir: template for the run folder (``{run_name}``, ``{rank}``, ...). Default
            ``'{run_name}/tensorboard'``, with ``/rank{rank}`` (or ``/node{node_rank}``) appended
            when more than rank zero writes.
        flush_interval: flush (and upload) every this many batches (>= 1).
        remote_dir: template for the uploaded folder; ``''`` or ``None`` disables uploading.
        max_queue: events the writer may queue before a log call waits for its thread.
        ranks: rank policy (default ``'zero'``). With ``'all'``/``'local_zero'`` the templates
            must tell ranks apart (e.g. ``{run_name}/tensorboard/rank{rank}``).
        rank_zero_only: Composer's spelling of the policy: True means ``ranks='zero'``, False
            ``ranks='all'``.
        log_level: highest :class:`~dist_logging.LogLevel` taken (default: all).
        optional: when True, this destination's errors are reported but never re-raised.

    Raises:
        ImportError: tensorboard is not installed (with the extra to install).
        ValueError: a bad template or interval, templates that cannot tell ranks apart, or
            ``rank_zero_only`` contradicting ``ranks``.
    """

    def __init__(
        self,
        log_dir: Optional[str] = None,
        flush_interval: int = 100,
        remote_dir: Optional[str] = '{run_name}/tensorboard',
        max_queue: int = 1000,
        ranks: Optional[str] = None,
        log_level: Any = None,
        optional: Optional[bool] = None,
        rank_zero_only: Optional[bool] = None,
    ):
        ranks = ranks_from_rank_zero_only(ranks, rank_zero_only, 'zero', 'TensorboardLogger')
        super().__init__(ranks=ranks, log_level=log_level, optional=optional)
        per_rank = {'zero': '', 'all': '/rank{rank}', 'local_zero': '/node{node_rank}'}[self.ranks]
        if log_dir is None:
            log_dir = '{run_name}/tensorboard' + per_rank
        if remote_dir == '{run_name}/tensorboard':  # the default: one folder per writing rank, like log_dir
            remote_dir += per_rank
        require_installed('tensorboard', INSTALL_HINT)
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f'TensorboardLogger: max_queue must be an int >= 1, got {max_queue!r}')
        validate_template(log_dir, DIST_PLACEHOLDERS)
        check_rank_distinct(log_dir, self.ranks, 'TensorboardLogger log_dir')
        if remote_dir:
            validate_template(remote_dir, DIST_PLACEHOLDERS)
            check_rank_distinct(remote_dir, self.ranks, 'TensorboardLogger remote_dir')
        self.log_dir_template = log_dir
        self.remote_dir_template = remote_dir or None
        self.flush_interval = check_interval('TensorboardLogger', 'flush_interval', flush_interval)
        self.max_queue = max_queue
        self.log_dir: Optional[str] = None
        self.remote_dir: Optional[str] = None
        self.writer: Any = None
        self._state: Optional['State'] = None
        self._logger: Optional['Logger'] = None
        self._dirty = False
        self._writer_file: Optional[str] = None  # the event file the open writer writes
        self._written = False  # whether anything was written to it

    # ------------------------------------------------------------------ lifecycle
    def init(self, state: 'State', logger: 'Logger') -> None:
        if self.writer is not None:  # already open: a second INIT must not start a second writer
            return
        self._state, self._logger = state, logger
        self.log_dir = format_name_with_dist(self.log_dir_template, state.run_name)
        if self.remote_dir_template:
            self.remote_dir = validate_object_name(format_name_with_dist(self.remote_dir_template, state.run_name))
        self.writer = self._open_writer(None)

    def _event_files(self) -> list[str]:
        try:
            return sorted(name for name in os.listdir(self.log_dir) if '.tfevents.' in name)
        except FileNotFoundError:
            return []

    def _open_log_dir(self) -> str:
        """``log_dir``, once init() set it (callers run after init(): the writer is open or being opened)."""
        assert self.log_dir is not None
        return self.log_dir

    def _open_writer(self, purge_step: Optional[int]) -> Any:
        """A SummaryWriter on ``log_dir`` whose event file sorts after every event file there (TensorBoard
        reads them in name order, and a purge only drops events read before it)."""
        log_dir = self._open_log_dir()
        summary_writer = import_installed('torch.utils.tensorboard', INSTALL_HINT).SummaryWriter
        deadline = time.monotonic() + _ORDER_WAIT_S
        while True:
            before = set(self._event_files())
            # flush_secs is a backstop for long batches; flushes normally follow flush_interval.
            writer = summary_writer(
                log_dir=self.log_dir, max_queue=self.max_queue, flush_secs=120, purge_step=purge_step
            )
            writer.flush()
            names = self._event_files()
            new = [name for name in names if name not in before]
            self._writer_file = os.path.join(log_dir, new[-1]) if new else None
            self._written = False
            if not new or names[-1] == new[-1] or not before:
                return writer
            # Another file sorts after ours: one written this second (a writer of this process, or another
            # host's clock ahead). Within a few seconds, wait for the clock; otherwise say so.
            ahead = _EVENT_SECONDS.search(names[-1])
            if ahead is None or int(ahead.group(1)) + 1 - time.time() > deadline - time.monotonic():
                warnings.warn(
                    f'TensorboardLogger: the new event file {new[-1]!r} sorts before {names[-1]!r} in '
                    f'{self.log_dir!r} (clocks differ between hosts?); TensorBoard reads files in name '
                    'order, so it may show the superseded steps of a resume',
                    RuntimeWarning,
                    stacklevel=3,
                )
                return writer
            writer.close()
            os.remove(os.path.join(log_dir, new[-1]))
            time.sleep(max(0.05, int(ahead.group(1)) + 1 - time.time()))

    def on_resume(self, info: 'ResumeInfo', state: 'State', logger: 'Logger') -> None:
        """Replace the writer by one with ``purge_step=info.superseded_from``: TensorBoard then drops every
        event at that step or later read before the new file (the superseded steps, of every tag).

        The writer replaced was opened before the checkpoint was loaded; its file is removed when
        nothing was written to it. The new file is made to sort after every other one (see
        :meth:`_open_writer`).
        """
        if self.writer is None:
            return
        old, old_file, wrote = self.writer, self._writer_file, self._written
        self.writer = None
        old.close()
        if old_file is not None and not wrote:
            try:
                os.remove(old_file)  # only its header: nothing to keep, and one file fewer for TensorBoard
            except FileNotFoundError:
                pass
        self.writer = self._open_writer(info.superseded_from)
        self._dirty = True

    def close(self, state: 'State', logger: 'Logger') -> None:
        if self.writer is None:
            return
        try:
            self.writer.close()  # flushes what is queued
            if self._dirty:
                self._upload()
        finally:
            self.writer = None

    def flush(self) -> None:
        """Write queued events to disk and upload the event files, if anything was logged since the last flush.

        Raises:
            Whatever ``Logger.upload_file`` raises (e.g. an earlier upload's ``UploadError``).
        """
        if self.writer is None or not self._dirty:
            return
        self.writer.flush()
        self._upload()

    def _upload(self) -> None:
        self._dirty = False
        logger = self._logger
        if not self.remote_dir or logger is None or not logger.has_file_upload_destination():
            return
        log_dir = self._open_log_dir()
        for root, _, files in os.walk(log_dir):
            for file in sorted(files):
                if '.tfevents.' not in file:
                    continue
                path = os.path.join(root, file)
                rel = os.path.relpath(path, log_dir).replace(os.sep, '/')
                logger.upload_file(f'{self.remote_dir}/{rel}', path, overwrite=True)

    # ------------------------------------------------------------------ writing
    def _writer(self) -> Any:
        if self.writer is None:
            raise RuntimeError(f'TensorboardLogger({self.log_dir_template!r}) is not open: it is opened by the Logger')
        self._dirty = self._written = True
        return self.writer

    def _step(self, step: Optional[int]) -> int:
        if step is not None:
            return step
        return self._state.timestamp.batch if self._state is not None else 0

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        writer = self._writer()
        clean: dict[str, Any] = {}
        for name, value in flatten(hyperparameters).items():
            if isinstance(value, (bool, int, float, str)):
                clean[name] = value
            elif value is not None:
                clean[name] = format_log_data_value(value)
        # SummaryWriter.add_hparams would write to a new sub-folder (a separate run in the UI);
        # writing the three summaries to this writer keeps hparams with the run's scalars.
        for summary in hparams(clean, {}):
            writer.file_writer.add_summary(summary)

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        writer = self._writer()
        step = self._step(step)
        for name, value in metrics.items():
            writer.add_scalar(name, value, global_step=step)

    def log_traces(self, traces: dict[str, Any]) -> None:
        writer = self._writer()
        step = self._step(None)
        for name, value in traces.items():
            writer.add_text(f'traces/{name}', format_log_data_value(value), global_step=step)

    def log_table(
        self, columns: list[str], rows: list[list[Any]], name: str = 'Table', step: Optional[int] = None
    ) -> None:
        self._writer().add_text(name, markdown_table(columns, rows), global_step=self._step(step))

    def log_images(
        self,
        images: Any,
        name: str = 'Images',
        channels_last: bool = False,
        step: Optional[int] = None,
        masks: Optional[dict[str, Any]] = None,
        mask_class_labels: Optional[dict[int, str]] = None,
        use_table: bool = True,
    ) -> None:
        from dist_logging._images import overlay_masks, prepare_images

        batch, mask_batches = prepare_images(images, channels_last, masks)
        writer = self._writer()
        step = self._step(step)
        writer.add_images(name, batch, global_step=step, dataformats='NHWC')
        for mask_name, mask in mask_batches.items():
            writer.add_images(f'{name}/{mask_name}', overlay_masks(batch, mask), global_step=step, dataformats='NHWC')
        if mask_class_labels and mask_batches:
            legend = markdown_table(['class', 'label'], [[k, v] for k, v in sorted(mask_class_labels.items())])
            writer.add_text(f'{name}/mask_class_labels', legend, global_step=step)
