"""Which rank is slow, and on which host: section timing, the rank report, its history and heatmap.

Enable it with ``Logger(..., rank_report_every=N)``; mark work with :meth:`Logger.section`. See
docs/stragglers.md. The modules: :mod:`.timer` (sections, on the training thread),
:mod:`.stats` (spread, scores, verdicts), :mod:`.report` (the report dataclasses and their
metrics/table/console line), :mod:`.reporter` (the collectives at a report),
:mod:`.history` (the per-rank history file), :mod:`.heatmap` (its picture),
:mod:`.command` (``dist-logging stragglers``).
"""

from dist_logging.stragglers.report import RankEntry, RankReport
from dist_logging.stragglers.reporter import RankReportOptions
from dist_logging.stragglers.stats import SeriesStats, Verdicts
from dist_logging.stragglers.timer import Section

__all__ = ['RankEntry', 'RankReport', 'RankReportOptions', 'Section', 'SeriesStats', 'Verdicts']
