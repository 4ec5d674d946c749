"""``dist-logging logs``: many ranks' log files as one time-ordered stream, identical records collapsed (CLI only).

Reads the files :func:`~dist_logging.setup_logging` writes (:mod:`dist_logging._log_line`)
and :class:`~dist_logging.destinations.FileLogger`'s (JSON Lines with a ``time`` field, or
Composer-style text lines ``[kind]...: ...``, which carry no time and keep their place in their
file). Each file is read line by line by a generator; ``heapq.merge`` interleaves them, so memory
per file is one record, whatever the file's size. Collapsing holds only the records of the last
``window`` seconds (at most ``MAX_PENDING`` groups).

A record's rank comes from its content (``setup_logging`` lines name it) or from the file name
(``rank3``, ``rank-3``, ``rank_3``; or a folder ``rank3/``).

:mod:`.sources` finds and parses the files (one record at a time); :mod:`.merge` interleaves,
collapses and follows them.
"""
