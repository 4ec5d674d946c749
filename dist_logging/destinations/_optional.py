"""Optional packages of the destinations: a cheap check at construction, the import when opened.

A destination built from a config checks that its package is installed (``find_spec``: no
import) so a missing extra fails at construction; the import itself (seconds for comet_ml,
neptune, wandb) waits until the Logger opens the destination.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__all__ = ['require_installed', 'import_installed']


def require_installed(module: str, hint: str) -> None:
    """Raise ``ImportError(hint)`` when ``module`` is not installed (nothing is imported).

    Raises:
        ImportError: ``module`` cannot be found; the message is ``hint`` (which extra to install).
    """
    if importlib.util.find_spec(module) is None:
        raise ImportError(hint)


def import_installed(module: str, hint: str) -> Any:
    """Import and return ``module``.

    Raises:
        ImportError: the import failed; the message is ``hint`` followed by the original error.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f'{hint} ({exc})') from exc
