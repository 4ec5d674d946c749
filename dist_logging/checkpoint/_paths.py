"""Local folders the checkpoint code uses: their names (defined here once) and where they go.

Next to the rank folders of the upload staging folder (:attr:`dist_logging.upload.Uploader.staging_folder`)::

    <staging>/checkpoint-writes/rank{r}/<pid>-<token>/   a writer's local shard files and spares
    <staging>/checkpoint-commits/                        the coordinator's commit intents (``_intents``)
    <staging>/checkpoint-process/rank{r}/<pid>-<token>/  saves of torch's checkpoint process (``_handoff``)
"""

from __future__ import annotations

import os
import uuid
from typing import Optional

from dist_logging import _private_dirs
from dist_logging.upload.staging import default_staging_folder

__all__ = ['WRITES_FOLDER', 'INTENTS_FOLDER', 'PROCESS_FOLDER', 'scratch_folder', 'default_cache_folder']

WRITES_FOLDER = 'checkpoint-writes'
INTENTS_FOLDER = 'checkpoint-commits'
PROCESS_FOLDER = 'checkpoint-process'


def _run_base(run_name: Optional[str]) -> str:
    # The folder default_staging_folder() puts 'staging' in (<private base>/<run>), created 0o700 and
    # checked private (owned by this user, not a symlink) by dist_logging._private_dirs.
    return os.path.dirname(default_staging_folder(run_name or 'standalone'))


def scratch_folder(staging_folder: Optional[str] = None) -> str:
    """A new private folder for small temporary files (markers being read or written). The caller removes it.

    Under the job's state folder (:func:`dist_logging._private_dirs.state_dir`): inside
    ``upload_staging_folder`` when the job was given one, so such a job never touches the default
    per-user base; else in the per-user base (``$DIST_LOGGING_TMPDIR`` moves it).
    """
    parent = _private_dirs.private_dir('checkpoint-scratch', root=_private_dirs.state_dir(staging_folder))
    path = os.path.join(parent, uuid.uuid4().hex[:16])
    os.mkdir(path, mode=0o700)
    return path


def default_cache_folder(run_name: Optional[str] = None) -> str:
    """Where :class:`CheckpointReader` keeps downloaded files, shared by the ranks of a node."""
    path = os.path.join(_run_base(run_name), 'checkpoint-cache')
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path
