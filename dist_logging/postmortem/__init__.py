"""The black box: each rank's evidence when a job hangs, desyncs or dies, delivered to the bucket, and its reading.

- :mod:`~dist_logging.postmortem.capture`: what a rank's set holds and where it goes (the layout).
- :mod:`~dist_logging.postmortem.trigger`: when a rank captures (:class:`Recorder`: hang watchdog, the
  Logger's errors, uncaught exceptions, SIGTERM, on demand).
- :mod:`~dist_logging.postmortem.diagnose`: naming the culprit from the sets (:func:`analyse`).
- :mod:`~dist_logging.postmortem.command`: ``dist-logging diagnose URI``.

See docs/postmortem.md.
"""

from __future__ import annotations

from dist_logging.postmortem.capture import FR_PREFIX, attempt_prefix, object_names, rank_prefix
from dist_logging.postmortem.diagnose import RankSet, Verdict, analyse, rank_of_path
from dist_logging.postmortem.trigger import DELIVERY_SECONDS, Recorder

__all__ = [
    'Recorder',
    'DELIVERY_SECONDS',
    'FR_PREFIX',
    'attempt_prefix',
    'rank_prefix',
    'object_names',
    'RankSet',
    'Verdict',
    'analyse',
    'rank_of_path',
    'diagnose_uri',
]


def diagnose_uri(uri: str, run_name: str | None = None, attempt: str | None = None) -> Verdict:
    """Read the postmortem of the run at ``uri`` (or ``run_name`` in the bucket ``uri``) and name the culprit.

    Raises:
        ValueError: a bad URI.
        ImportError: the store's optional dependency is missing.
    """
    from dist_logging.postmortem.command import diagnose_uri as read_and_analyse

    return read_and_analyse(uri, run_name, attempt)
