"""The redaction code of an earlier commit of this repository, loaded beside the installed package.

``module_at('29372ac')`` reads that commit's ``dist_logging/_redact.py`` and its two rule tables
(``_gitleaks_formats.py``, ``_extra_formats.py``) with ``git show`` and runs them as one module, so a
benchmark can time or score the old rules next to the current ones in one process, on the same
inputs. (Putting an old tree first on ``sys.path`` does not work: the editable install's import
hook finds the working tree's package first.) Only commits before issue 33 moved the rules into
``dist_logging/redaction/`` are supported: the current rules are imported normally.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import types

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _show(commit: str, path: str) -> str:
    try:
        return subprocess.run(
            ['git', '-C', str(REPO_ROOT), 'show', f'{commit}:{path}'], check=True, capture_output=True, text=True
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise ValueError(f'{path} is not in commit {commit!r} of {REPO_ROOT}: {exc.stderr.strip()}') from None


def module_at(commit: str) -> types.ModuleType:
    """``dist_logging._redact`` as it was at ``commit`` (with that commit's rule tables).

    Raises:
        ValueError: the commit has no ``dist_logging/_redact.py`` (it is not a commit of this
            repository, or it is after issue 33).
    """
    name = f'_redact_at_{commit}'
    if name in sys.modules:
        return sys.modules[name]
    source = _show(commit, 'dist_logging/_redact.py')
    module = types.ModuleType(name)
    for table in ('_gitleaks_formats', '_extra_formats'):
        data = types.ModuleType(f'{name}.{table}')
        exec(compile(_show(commit, f'dist_logging/{table}.py'), f'{commit}:{table}.py', 'exec'), data.__dict__)
        module.__dict__[table] = data
    sys.modules[name] = module  # NamedTuple and dataclasses look their module up by name
    source = source.replace('from dist_logging import _extra_formats, _gitleaks_formats', '')
    exec(compile(source, f'{commit}:dist_logging/_redact.py', 'exec'), module.__dict__)
    return module
