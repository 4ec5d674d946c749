"""``DistLoggingTracker``: dist_logging as a Hugging Face Accelerate tracker.

Either pass an instance::

    accelerator = Accelerator(log_with=DistLoggingTracker('my-run', config='configs/per_rank.yaml'))

or, after importing this module, the name (the config then comes from ``init_kwargs`` or the
environment variable ``DIST_LOGGING_CONFIG``)::

    import dist_logging.integrations.accelerate  # registers 'dist_logging'
    accelerator = Accelerator(log_with='dist_logging')
    accelerator.init_trackers('my-run', config=hparams, init_kwargs={'dist_logging': {'config': 'logger.yaml'}})

Accelerate calls trackers on the main process only (``init_trackers``, ``log`` and, from
``end_training``, ``finish``), and destroys the process group right after ``finish``. So this
tracker never issues a collective: its Logger is built on the main process with an explicit
run name (no run-name agreement) and is closed without one. Other processes build nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from dist_logging.integrations._common import advance_to, import_framework, LoggerHandle

if TYPE_CHECKING:
    from dist_logging.logger import Logger

_tracking = import_framework(('accelerate.tracking',), 'accelerate', 'dist_logging.integrations.accelerate')

__all__ = ['DistLoggingTracker']

# The framework's base classes, named for type checkers (a base must be a name: the module is imported at run time).
_GeneralTracker: Any = _tracking.GeneralTracker


class DistLoggingTracker(_GeneralTracker):
    """An Accelerate ``GeneralTracker`` named ``'dist_logging'`` that logs through a :class:`~dist_logging.Logger`.

    Mapping: ``store_init_configuration(values)`` -> ``log_hyperparameters(values)``;
    ``log(values, step)`` -> ``log_metrics`` for numbers (strings and other values go to
    ``log_traces``); ``finish()`` -> ``close()`` (waits for uploads). Nothing here issues a collective.

    Args:
        run_name: the run's name; Accelerate passes ``init_trackers``' ``project_name`` here when
            the tracker is named in ``log_with``. Given to a Logger built from ``config``
            (it wins over the config's ``run_name``); None keeps the config's or the default.
        logger: a :class:`~dist_logging.Logger`, or a zero-argument callable returning one
            (called on the main process when Accelerate starts the tracker). ``finish`` closes it on
            the main process; a Logger you built on every process is yours to close on the others.
        config: with ``logger=None``, a YAML path or a mapping for :meth:`Logger.from_config`;
            with neither, the path in the environment variable ``DIST_LOGGING_CONFIG``.

    Raises:
        TypeError: a ``run_name`` that is not a string, or a bad ``logger``/``config`` (see below).
        ValueError: both ``logger`` and ``config``, or neither and no ``DIST_LOGGING_CONFIG``;
            a config key the Logger does not know (with its key path).
        FileNotFoundError: the config file does not exist.
    """

    name = 'dist_logging'
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, run_name: Optional[str] = None, *, logger: Any = None, config: Any = None):
        super().__init__()
        if run_name is not None and not isinstance(run_name, str):
            raise TypeError(f'DistLoggingTracker: run_name must be a str or None, got {type(run_name).__name__}')
        self.run_name = run_name
        self._handle = LoggerHandle(logger, config, 'DistLoggingTracker', run_name=run_name)

    def start(self) -> None:
        """Build the Logger (Accelerate calls this on the main process from ``init_trackers``)."""
        self._handle.get()

    @property
    def tracker(self) -> 'Logger':
        """The :class:`~dist_logging.Logger` (built on first access)."""
        return self._handle.get()

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Log ``values`` as hyperparameters (redacted; emitted by global rank zero)."""
        self._handle.get().log_hyperparameters(dict(values))

    def log(self, values: Mapping[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log numbers as metrics at ``step``; other values (strings, lists) as traces.

        Raises:
            TypeError: an unexpected keyword argument (Accelerate passes ``log_kwargs['dist_logging']`` here).
        """
        if kwargs:
            raise TypeError(f'DistLoggingTracker.log: unexpected keyword arguments {sorted(kwargs)}')
        logger = self._handle.get()
        metrics, traces = _split_values(values)
        if metrics:
            logger.log_metrics(metrics, step=step)
        if traces:
            logger.log_traces(traces)
        advance_to(logger, step)  # periodic destinations (file flush, console) act on the loop's steps

    def finish(self) -> None:
        """Close the Logger: waits for its uploads, issues no collective.

        Raises:
            UploadError: naming the uploads that did not land (their files stay in staging).
        """
        self._handle.close()

    def __repr__(self) -> str:
        return f'DistLoggingTracker(run_name={self.run_name!r})'


def _split_values(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Numbers (and 0-d tensors/arrays) as metrics; everything else as traces."""
    import numbers

    metrics: dict[str, Any] = {}
    traces: dict[str, Any] = {}
    for key, value in values.items():
        is_scalar = isinstance(value, numbers.Number) or (hasattr(value, 'ndim') and getattr(value, 'ndim', 1) == 0)
        (metrics if is_scalar and not isinstance(value, bool) else traces)[key] = value
    return metrics, traces


# Accelerate 1.x's register_tracker_class makes the name usable in log_with; older releases only
# take instances (log_with=[DistLoggingTracker(...)]). Re-importing this module must not warn.
if (
    hasattr(_tracking, 'register_tracker_class')
    and getattr(_tracking, 'LOGGER_TYPE_TO_CLASS', {}).get(DistLoggingTracker.name) is not DistLoggingTracker
):
    _tracking.register_tracker_class(DistLoggingTracker)
