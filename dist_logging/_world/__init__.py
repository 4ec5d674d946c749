"""The collectives core: rank facts, launchers, the logging group, beats; :mod:`dist_logging.dist` is its face.

A package of its own (not ``dist/``, a name tools skip as build output) whose modules are public inside
``dist_logging``: every room of the package may import them; users import :mod:`dist_logging.dist`.
"""
