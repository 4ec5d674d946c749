"""The one owner of every path dist_logging creates in a shared place (the system temp dir).

Training machines are often shared, and the system temp dir is writable by everyone: a folder
there under a guessable name may have been made by someone else, or be a symlink they planted.
So every default folder lives under one per-user base::

    $DIST_LOGGING_TMPDIR                      when set (the one knob that moves everything), else
    <system temp>/dist_logging-<user>/        (tempfile.gettempdir(): honours TMPDIR)
        <run_name>/staging/                   default upload staging
        node-upload-slots/  node-upload-rate/ machine-wide upload caps
        downloads/                            download locks and "already downloaded" markers
        locks/                                overwrite=False fallback locks of a local bucket
        scratch/                              scratch folders of destinations and tools

The base and every folder under it are created with mode 0o700 and checked on every use:
a folder (not a symlink), owned by this process's uid, no group or other permission bits.
A failed check raises a :class:`PermissionError` that names the folder, what is wrong and how to
choose another place. With ``DIST_LOGGING_TMPDIR`` set, everything lives there. Without it, a
job that passes ``upload_staging_folder=`` keeps its machine-wide state in
``<upload_staging_folder>/.dist_logging-<host>/`` (same checks); either way such a job never
touches ``<system temp>/dist_logging-<user>``.

Files in these folders are created with ``O_NOFOLLOW | O_EXCL`` and mode 0o600
(:func:`create_private_file`) and opened with ``O_NOFOLLOW``, then checked to be a regular
file of ours (:func:`open_private_file`).
"""

from __future__ import annotations

import getpass
import os
import re
import socket
import stat
import tempfile
from typing import Optional

__all__ = [
    'ENV_VAR',
    'base_dir',
    'private_dir',
    'check_private_dir',
    'state_dir',
    'create_private_file',
    'open_private_file',
    'make_dirs',
    'user_name',
]

ENV_VAR = 'DIST_LOGGING_TMPDIR'
_NOFOLLOW = getattr(os, 'O_NOFOLLOW', 0)
_CLOEXEC = getattr(os, 'O_CLOEXEC', 0)
_HOW_TO_MOVE = (
    f'set {ENV_VAR} to a folder of yours (it is created with mode 0700), or remove or fix this folder '
    '(it must be a folder owned by you with mode 0700)'
)


def user_name() -> str:
    """This process's user name (its uid where there is no name, e.g. a container without a passwd entry)."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - getpass raises whatever the platform's lookup raises
        return str(os.getuid()) if hasattr(os, 'getuid') else 'user'


def _safe_part(text: str) -> str:
    return re.sub(r'[^A-Za-z0-9._-]', '_', text).lstrip('.') or '_'


def check_private_dir(path: str) -> None:
    """Check that ``path`` is a folder (not a symlink) owned by this uid, without group/other bits.

    Raises:
        PermissionError: names the folder, what is wrong with it (symlink, not a folder, owner,
            mode) and how to choose another place.
        FileNotFoundError: ``path`` does not exist.
    """
    info = os.lstat(path)
    problem = None
    if stat.S_ISLNK(info.st_mode):
        problem = f'it is a symlink (to {os.readlink(path)!r})'
    elif not stat.S_ISDIR(info.st_mode):
        problem = 'it is not a folder'
    elif hasattr(os, 'getuid') and info.st_uid != os.getuid():
        problem = f'it is owned by uid {info.st_uid}, not by this process (uid {os.getuid()})'
    elif hasattr(os, 'getuid') and stat.S_IMODE(info.st_mode) & 0o077:
        problem = f'its mode is {stat.S_IMODE(info.st_mode):04o}: other users may read or write it (want 0700)'
    if problem is not None:
        raise PermissionError(f'dist_logging will not use {path}: {problem}; {_HOW_TO_MOVE}')


def _make_checked(path: str) -> str:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700, follow_symlinks=False)  # a umask may have dropped owner bits we need
    check_private_dir(path)
    return path


def make_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, but every folder it creates gets mode 0o700 whatever
    the umask (``os.makedirs`` gives the parents it creates ``0o777 & ~umask``: world-writable under
    umask 000, where another user could rename what we put in them). Existing folders are left as
    they are."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise
            continue
        os.chmod(folder, 0o700, follow_symlinks=False)


def base_dir() -> str:
    """The per-user base: ``$DIST_LOGGING_TMPDIR`` or ``<system temp>/dist_logging-<user>``.

    Created with mode 0o700 if missing (with its parents, for ``DIST_LOGGING_TMPDIR``), checked
    on every call.

    Raises:
        PermissionError: the base exists but is not a private folder of this user (see
            :func:`check_private_dir`).
        ValueError: ``DIST_LOGGING_TMPDIR`` is not an absolute path.
    """
    chosen = os.environ.get(ENV_VAR, '')
    if chosen:
        if not os.path.isabs(chosen):
            raise ValueError(f'{ENV_VAR}={chosen!r}: expected an absolute path')
        make_dirs(os.path.dirname(os.path.normpath(chosen)))
        return _make_checked(os.path.normpath(chosen))
    return _make_checked(_default_base())


def _default_base() -> str:
    return os.path.join(tempfile.gettempdir(), f'dist_logging-{_safe_part(user_name())}')


def state_dir(staging_folder: Optional[str] = None) -> str:
    """Where a job keeps its machine-wide state (upload caps, download locks and markers).

    ``$DIST_LOGGING_TMPDIR`` when set; else, for a job given ``upload_staging_folder=``,
    ``<staging_folder>/.dist_logging-<host>`` (per machine even on a shared filesystem); else the
    per-user base (also for a staging folder inside the default base, e.g. when ``drain`` empties
    a default staging folder). Created 0o700 and checked, as :func:`base_dir`.

    Raises:
        PermissionError: the folder is not a private folder of this user.
    """
    if staging_folder is None or os.environ.get(ENV_VAR, ''):
        return base_dir()
    staging_folder = os.path.abspath(staging_folder)
    default = _default_base()
    if os.path.commonpath([staging_folder, default]) == default:
        return base_dir()
    make_dirs(staging_folder)
    return _make_checked(os.path.join(staging_folder, f'.dist_logging-{_safe_part(socket.gethostname())}'))


def private_dir(*parts: str, root: Optional[str] = None) -> str:
    """``<root>/<parts...>`` (``root`` defaults to :func:`base_dir`), every level created 0o700 and checked.

    Raises:
        PermissionError: one of the folders is not a private folder of this user.
        ValueError: a part that is not a plain file name.
    """
    path = base_dir() if root is None else root
    if root is not None:
        check_private_dir(root)
    for part in parts:
        if not part or part in ('.', '..') or os.sep in part or (os.altsep and os.altsep in part):
            raise ValueError(f'not a plain folder name: {part!r}')
        path = _make_checked(os.path.join(path, part))
    return path


def _check_file(fd: int, path: str) -> None:
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = 'it is not a regular file'
    elif hasattr(os, 'getuid') and info.st_uid != os.getuid():
        problem = f'it is owned by uid {info.st_uid}, not by this process (uid {os.getuid()})'
    elif stat.S_IMODE(info.st_mode) & 0o077:
        os.fchmod(fd, 0o600)  # ours, in a private folder: written by hand or by an older version
    if problem is not None:
        os.close(fd)
        raise PermissionError(f'dist_logging will not use {path}: {problem}; remove it, or {_HOW_TO_MOVE}')


def create_private_file(path: str, flags: int = os.O_WRONLY) -> int:
    """Create the new file ``path`` (``O_CREAT | O_EXCL | O_NOFOLLOW``), mode 0o600; returns its descriptor.

    Raises:
        FileExistsError: ``path`` exists (a symlink included).
    """
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)  # the umask cannot widen it, but may narrow the owner's bits
    return fd


def open_private_file(path: str, flags: int = os.O_RDONLY, *, create: bool = False) -> int:
    """Open ``path`` without following a symlink; check it is a regular file of ours (narrowed to 0600).

    With ``create=True`` a missing file is created as by :func:`create_private_file`.

    Raises:
        PermissionError: the file is not a regular file of ours (names it); a symlink in its
            place (``ELOOP``) is reported the same way.
        FileNotFoundError: missing and ``create`` is False.
    """
    while True:
        try:
            fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC)
        except FileNotFoundError:
            if not create:
                raise
            try:
                return create_private_file(path, flags)
            except FileExistsError:
                continue  # another process created it first: open theirs
        except OSError as exc:
            if os.path.islink(path):
                raise PermissionError(
                    f'dist_logging will not use {path}: it is a symlink; remove it, or {_HOW_TO_MOVE}'
                ) from exc
            raise
        _check_file(fd, path)
        return fd
