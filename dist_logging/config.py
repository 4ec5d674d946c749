"""Build a :class:`~dist_logging.Logger` from YAML or a dict, checking every key at load time.

A config names the Logger's options and its destinations::

    run_name: ${DIST_LOGGING_RUN_NAME:-}     # optional; empty -> the Logger's default
    auto_flush: true                        # any other Logger keyword argument
    destinations:
      - type: console                       # a registered name, or 'package.module:Class'
        log_interval: 10
      - type: file
        filename: runs/{run_name}/logs-rank{rank}.txt
        ranks: all
    upload:                                 # shorthand for one more destination of type 'remote'
      bucket_uri: ${BUCKET:-buckets/local}

Every key is checked against the Logger's and each destination class's ``__init__``
before anything is built, so a typo fails at load with its key path
(``destinations[2].rankz: unknown key; did you mean 'ranks'?``), not hours into training.

Strings may use ``${VAR}``, ``${VAR:-default}`` (default when unset or empty) and
``${VAR-default}`` (default when unset); ``$${`` is a literal ``${``. A value that is
exactly one reference is read as a YAML scalar after substitution, so
``flush_interval: ${FLUSH:-100}`` is the number 100 and ``endpoint_url: ${AWS_ENDPOINT_URL:-}``
is ``null`` when the variable is unset. Name templates (``{run_name}``, ``{rank}``) are
left to the destinations.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

# The machinery is in _logger.config_load, which does not know the Logger class (the Logger builds
# itself from a config through it, so it cannot import this module back).
from dist_logging._logger.config_load import (
    DESTINATION_TYPES,
    ConfigSource,
    DestinationSpec,
    LoggerConfig,
    build_destinations,
    interpolate_env,
    package_status,
    register_destination,
    required_packages,
)
from dist_logging._logger.config_load import build_logger as _build_logger
from dist_logging._logger.config_load import load_config as _load_config
from dist_logging.logger import Logger

__all__ = [
    'DESTINATION_TYPES',
    'DestinationSpec',
    'LoggerConfig',
    'register_destination',
    'load_config',
    'build_destinations',
    'logger_from_config',
    'interpolate_env',
    'required_packages',
    'package_status',
]


def load_config(source: ConfigSource, *, environ: Optional[Mapping[str, str]] = None) -> LoggerConfig:
    """Read and check a config (a YAML file path or a mapping) without building anything.

    Args:
        source: a path to a YAML file, or the config as a mapping.
        environ: the variables for ``${VAR}`` interpolation (default ``os.environ``).

    Returns:
        The checked :class:`LoggerConfig`.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: invalid YAML, an unknown key or destination type, a missing required
            key, a bad ``ranks`` policy or bucket URI, an unset environment variable; the
            message starts with the key path.
        ImportError: a destination's module cannot be imported.
    """
    return _load_config(source, environ, Logger)


def logger_from_config(source: Union[ConfigSource, LoggerConfig], **overrides: Any) -> Logger:
    """Build a :class:`~dist_logging.Logger` from a config; ``overrides`` replace its Logger keys.

    Call it on every rank, like the Logger's constructor.

    Args:
        source: a YAML path, a mapping, or a :class:`LoggerConfig` from :func:`load_config`.
        **overrides: Logger keyword arguments (``run_name=...``) that win over the config.

    Raises:
        FileNotFoundError: as :func:`load_config`.
        ValueError: as :func:`load_config` and :func:`build_destinations`.
        TypeError: an override the Logger does not take.
        ImportError: as :func:`build_destinations`.
    """
    return _build_logger(Logger, source, overrides)
