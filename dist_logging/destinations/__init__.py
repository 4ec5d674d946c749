"""Logger destinations, one per module. Optional integrations import their library lazily."""

from dist_logging.destinations.console import ConsoleLogger
from dist_logging.destinations.file import FileLogger
from dist_logging.destinations.in_memory import InMemoryLogger

__all__ = ['InMemoryLogger', 'ConsoleLogger', 'FileLogger']
