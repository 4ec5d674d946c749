"""dist_logging: a distributed-training-aware logging layer for PyTorch.

Build one :class:`Logger` per rank with several destinations; the Logger applies
each destination's rank policy, gathers metrics across ranks when asked, and
hands files to background uploaders.
"""

from dist_logging import dist
from dist_logging._values import format_log_data_value
from dist_logging.destination import Event, LoggerDestination, LogLevel
from dist_logging.errors import DistributedLoggingError, UploadError
from dist_logging.logger import Logger
from dist_logging.logging_setup import setup_logging
from dist_logging.naming import format_name_with_dist, format_name_with_dist_and_time
from dist_logging.state import State, Timestamp

__version__ = '0.1.0'

__all__ = [
    'dist',
    'Logger',
    'setup_logging',
    'LoggerDestination',
    'Event',
    'LogLevel',
    'State',
    'Timestamp',
    'format_name_with_dist',
    'format_name_with_dist_and_time',
    'format_log_data_value',
    'UploadError',
    'DistributedLoggingError',
]
