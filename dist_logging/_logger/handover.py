"""Handing files and folders to the destinations that take them (``Logger.upload_file`` / ``upload_folder``).

Names are templates filled here; every uploader on this rank gets the file even when an earlier
upload of another one failed, and those failures are raised after all of them took it.
"""

from __future__ import annotations

import os
import pathlib
import stat
import warnings
from typing import Any, Optional, Protocol, Sequence, Union, cast

from dist_logging._logger.routing import Router
from dist_logging.destination import LoggerDestination
from dist_logging.errors import UploadError
from dist_logging.naming import format_name_with_dist_and_time, validate_object_name
from dist_logging.state import State


def file_names(remote_file_name: str, file_path: Union[str, pathlib.Path], state: State) -> tuple[str, str]:
    """The object name and the local path of an ``upload_file`` call, templates filled and checked.

    Raises:
        FileNotFoundError: the local file does not exist.
        IsADirectoryError: the local path is a directory.
        ValueError: a bad template or an absolute/escaping object name.
    """
    # This call sits on the training loop: names without placeholders skip formatting, and one
    # stat answers both "exists?" and "directory?".
    if type(remote_file_name) is not str or '{' in remote_file_name or '}' in remote_file_name:
        remote_file_name = format_name_with_dist_and_time(remote_file_name, state.run_name, state.timestamp)
    remote = validate_object_name(remote_file_name)
    local = os.fspath(file_path)
    if type(local) is not str or '{' in local or '}' in local:
        local = format_name_with_dist_and_time(local, state.run_name, state.timestamp)
    try:
        mode = os.stat(local).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f'upload_file: {local!r} does not exist') from None
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f'upload_file: {local!r} is a directory; upload its files one by one')
    return remote, local


def folder_names(remote_prefix: str, local_dir: Union[str, pathlib.Path], state: State) -> tuple[str, str]:
    """The folder's name in the bucket and its local path, templates filled and checked.

    Raises:
        NotADirectoryError: the local path is not a folder.
        ValueError: a bad template or an escaping name.
    """
    remote = validate_object_name(
        format_name_with_dist_and_time(remote_prefix, state.run_name, state.timestamp).strip('/')
    )
    local = format_name_with_dist_and_time(os.fspath(local_dir), state.run_name, state.timestamp)
    if not os.path.isdir(local):
        raise NotADirectoryError(f'upload_folder: {local!r} is not a folder')
    return remote, local


def hand_file(router: Router, state: State, remote: str, local: str, overwrite: bool, copy: bool) -> None:
    """Give the file to every uploader active on this rank.

    Raises:
        UploadError: earlier uploads failed (the first destination's error, the others as notes),
            raised once every uploader took this file.
        FileExistsError: ``overwrite=False`` and the name is already queued or stored.
    """
    earlier_failures: Optional[UploadError] = None
    for destination in router.uploaders:
        try:
            _hand_one(router, destination, state, remote, local, overwrite, copy)
        except UploadError as exc:
            # Earlier uploads of that destination failed, but it queued this file: the other
            # destinations must still get it before the error reaches the caller.
            earlier_failures = _with_failure(earlier_failures, exc)
    if earlier_failures is not None:
        raise earlier_failures


def hand_folder(router: Router, state: State, remote: str, local: str, commit: bool, copy: bool) -> None:
    """Give the folder to every uploader active on this rank: committed by those with ``upload_folder``,
    file by file (uncommitted, with a warning) to the others.

    Raises:
        UploadError: as :func:`hand_file`.
    """
    earlier_failures: Optional[UploadError] = None
    for destination in router.uploaders:
        try:
            if callable(getattr(destination, 'upload_folder', None)):
                destination.upload_folder(state, remote, local, commit=commit, copy=copy)  # type: ignore[attr-defined]
                continue
            warnings.warn(
                f'upload_folder({remote!r}): {destination!r} has no upload_folder; its files are '
                'uploaded one by one, without a commit',
                RuntimeWarning,
                stacklevel=3,
            )
            for path in _files_under(local):
                rel = os.path.relpath(path, local).replace(os.sep, '/')
                _hand_one(router, destination, state, f'{remote}/{rel}', path, True, copy)
        except UploadError as exc:
            earlier_failures = _with_failure(earlier_failures, exc)
    if earlier_failures is not None:
        raise earlier_failures


def _files_under(local: str) -> Sequence[str]:
    """The files under ``local``, in a stable order (sorted per folder, top-down)."""
    found = []
    for folder, subfolders, names in os.walk(local):
        subfolders.sort()
        for entry in sorted(names):
            path = os.path.join(folder, entry)
            if os.path.isfile(path):
                found.append(path)
    return found


class _UploadsWithCopy(Protocol):
    """An uploader whose ``upload_file`` also takes ``copy=`` and a str path (``Router.takes_copy`` says which)."""

    def upload_file(
        self, state: State, remote_file_name: str, file_path: Union[str, pathlib.Path], *, overwrite: bool, copy: bool
    ) -> None: ...


def _hand_one(
    router: Router, destination: LoggerDestination, state: State, remote: str, local: str, overwrite: bool, copy: bool
) -> Any:
    if router.takes_copy(destination):
        # Destinations that take copy= also take the path as a str (building a pathlib.Path
        # costs more than the whole hand-over).
        cast(_UploadsWithCopy, destination).upload_file(state, remote, local, overwrite=overwrite, copy=copy)
    else:
        destination.upload_file(state, remote, pathlib.Path(local), overwrite=overwrite)


def _with_failure(earlier: Optional[UploadError], exc: UploadError) -> UploadError:
    """The first destination's error, with the later ones added as notes."""
    if earlier is None:
        return exc
    earlier.add_note(f'also: {exc}')
    return earlier
