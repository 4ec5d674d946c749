"""The straggler report's classes under their documented earlier path (the package is :mod:`dist_logging.stragglers`).

Importing ``RankReport`` and the rest from ``dist_logging.ranks`` keeps working; ``dist_logging.ranks`` is
also the name of the Python logger the report's console lines go to (set in ``stragglers/reporter.py``).
"""

from dist_logging.stragglers import RankEntry, RankReport, RankReportOptions, Section, SeriesStats, Verdicts

__all__ = ['RankEntry', 'RankReport', 'RankReportOptions', 'Section', 'SeriesStats', 'Verdicts']
