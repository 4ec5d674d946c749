"""Logger destinations, one per module. Optional integrations import their library lazily.

``TensorboardLogger``, ``MLFlowLogger``, ``RemoteUploaderDownloader``, ``WandBLogger``,
``CometMLLogger`` and ``NeptuneLogger`` are imported on first access (module ``__getattr__``),
so importing this package never imports tensorboard, mlflow, boto3, wandb, comet_ml or neptune.

``Logger`` and ``LoggerDestination`` are here too, so Composer's
``from composer.loggers import ...`` becomes ``from dist_logging.destinations import ...``.
"""

from typing import Any

from dist_logging.destinations.console import ConsoleLogger
from dist_logging.destinations.file import FileLogger
from dist_logging.destinations.in_memory import InMemoryLogger
from dist_logging.destination import LoggerDestination
from dist_logging.logger import Logger

_LAZY = {
    'TensorboardLogger': 'dist_logging.destinations.tensorboard',
    'MLFlowLogger': 'dist_logging.destinations.mlflow',
    'RemoteUploaderDownloader': 'dist_logging.destinations.remote',
    'WandBLogger': 'dist_logging.destinations.wandb',
    'CometMLLogger': 'dist_logging.destinations.cometml',
    'NeptuneLogger': 'dist_logging.destinations.neptune',
}

__all__ = ['Logger', 'LoggerDestination', 'InMemoryLogger', 'ConsoleLogger', 'FileLogger', *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
