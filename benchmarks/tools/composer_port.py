"""Run Composer's own logger tests (v0.32.1) against dist_logging, with only their imports swapped.

Usage (from the project root; a Composer git checkout, e.g. the one `fetch github:mosaicml/composer` makes):

    .venv/bin/python benchmarks/tools/composer_port.py --composer /path/to/composer/.git [--tag v0.32.1]
        [--out /tmp/composer_port] [--pytest-args "-x"]

What it does:

1. Copies Composer's logger tests (``tests/loggers/test_*.py`` for the destinations dist_logging has, and
   ``tests/utils/object_store/test_object_store.py`` / ``test_s3_object_store.py``) out of the tag.
2. Swaps the imports: every name imported from ``composer`` is looked up in dist_logging
   (``composer.loggers`` -> ``dist_logging.destinations``, ``composer.core`` / ``composer`` -> ``dist_logging``,
   ``composer.utils.object_store`` -> ``dist_logging.object_store``, ``composer.utils.dist`` -> ``dist_logging.dist``).
   A name dist_logging does not have (``Trainer``, ``Engine``, ``Time``, ``GCSObjectStore``, Composer's test
   models and datasets, ...) becomes a placeholder that raises ``NotImplementedError`` naming it when used.
   Nothing else in a test is changed.
3. Gives the tests Composer's shared fixtures (``tests/fixtures``) rebuilt on dist_logging: ``dummy_state`` and
   ``minimal_state`` are a dist_logging ``State`` with Composer's run names, ``s3_bucket`` is ``'my-bucket'``
   under moto's ``mock_aws``, W&B offline, MLflow in the test's folder, the working folder the test's tmp_path.
4. Counts. A *portable* test is a test function that uses none of the Trainer machinery (``Trainer``,
   ``Engine``, ``Evaluator``, Composer's models, datasets, callbacks and device markers): those test Composer's
   training loop, which dist_logging does not have (docs/composer.md, difference 1). A portable test
   passes when every one of its collected cases passes (skips excepted: a case skipped for a missing
   optional service, such as Composer's remote-only cases, does not count against it). Per-case results are
   printed as well.

The report lists each portable test with its outcome; docs/composer.md gives the reason for each failure.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import textwrap

FILES = [
    'tests/loggers/test_cometml_logger.py',
    'tests/loggers/test_console_logger.py',
    'tests/loggers/test_file_logger.py',
    'tests/loggers/test_in_memory_logger.py',
    'tests/loggers/test_logger.py',
    'tests/loggers/test_mlflow_logger.py',
    'tests/loggers/test_neptune_logger.py',
    'tests/loggers/test_remote_uploader_downloader.py',
    'tests/loggers/test_tensorboard_logger.py',
    'tests/loggers/test_wandb_logger.py',
    'tests/utils/object_store/test_object_store.py',
    'tests/utils/object_store/test_s3_object_store.py',
]

# Names that stand for Composer's training loop: a test using any of them is not portable.
TRAINER_NAMES = {
    'Trainer',
    'Engine',
    'Evaluator',
    'SimpleModel',
    'SimpleConvModel',
    'RandomClassificationDataset',
    'RandomImageDataset',
    'DataLoader',
    'device',
    'OptimizerMonitor',
    'SpeedMonitor',
    'DecoupledAdamW',
    'MetricCollection',
    'disable_env_report',
    'callback_class',
    'get_cb_kwargs',
    'callback_settings',
}

# Where a Composer module's names are looked for in dist_logging, in order.
MODULE_MAP = [
    ('composer.loggers', ['dist_logging.destinations', 'dist_logging']),
    ('composer.utils.object_store', ['dist_logging.object_store']),
    ('composer.utils', ['dist_logging', 'dist_logging.naming']),
    ('composer.core', ['dist_logging', 'dist_logging.destination']),
    ('composer', ['dist_logging', 'dist_logging.destinations']),
]

SWAP_MODULE = '''"""Composer names looked up in dist_logging (written by benchmarks/tools/composer_port.py)."""
import importlib

MODULE_MAP = {module_map!r}


# True during collection, while test modules are imported: a missing name used at module level (a decorator such as
# Composer's @device, a parametrize list) then yields another placeholder, so that the module still collects.
LENIENT = False


class Missing:
    """A Composer name dist_logging does not have: any use in a test raises NotImplementedError naming it."""

    def __init__(self, name):
        self._name = name

    def _fail(self, *args, **kwargs):
        raise NotImplementedError(f'dist_logging has no equivalent of Composer\\'s {{self._name}}')

    def __call__(self, *args, **kwargs):
        if LENIENT:
            return Missing(f'{{self._name}}(...)')
        self._fail()

    def __getattr__(self, attr):
        if attr.startswith('__'):
            raise AttributeError(attr)
        return Missing(f'{{self._name}}.{{attr}}')

    def __iter__(self):
        if LENIENT:
            return iter(())
        self._fail()

    def __mro_entries__(self, bases):
        return (object,)  # a test's class deriving from a missing Composer class (e.g. Callback) still defines


def composer_logger():
    """Composer's ``Logger(state, destinations)``, written as docs/composer.md difference 1 says a user
    writes it: ``Logger(destinations, run_name=state.run_name)``, sharing the test's State as Composer's does."""
    import dist_logging

    class Logger(dist_logging.Logger):
        def __init__(self, state=None, destinations=None, **kwargs):
            super().__init__(destinations, run_name=getattr(state, 'run_name', None), **kwargs)
            if state is not None:
                self.state = state

    return Logger


def lookup(module, name):
    if name == 'Logger' and module.startswith('composer'):
        return composer_logger()
    for prefix, targets in MODULE_MAP:
        if module == prefix or module.startswith(prefix + '.'):
            for target in targets:
                try:
                    value = getattr(importlib.import_module(target), name)
                except (ImportError, AttributeError):
                    continue
                return value
            break
    return Missing(f'{{module}}.{{name}}')


def module(name):
    for prefix, targets in MODULE_MAP:
        if name == prefix or name.startswith(prefix + '.'):
            return importlib.import_module(targets[0])
    return Missing(name)
'''

CONFTEST = '''"""Composer's shared test fixtures (tests/fixtures), rebuilt on dist_logging (composer_port.py)."""
import os
import pathlib

import pytest

from dist_logging import State


@pytest.fixture
def rank_zero_seed():
    return 0


@pytest.fixture
def minimal_state():
    return State('minimal_run_name')


@pytest.fixture
def dummy_state():
    return State('dummy_run_name')


@pytest.fixture
def empty_logger(minimal_state):
    from dist_logging import Logger

    return Logger([], run_name=minimal_state.run_name)


@pytest.fixture(scope='session')
def test_session_name():
    return 'composer-port'


@pytest.fixture
def sftp_uri():
    return 'sftp://localhost'


@pytest.fixture
def s3_bucket(request):
    if request.node.get_closest_marker('remote') is None:
        return 'my-bucket'
    return os.environ.get('S3_BUCKET', 'mosaicml-internal-integration-testing')


@pytest.fixture
def s3_ephemeral_prefix():
    return 'ephemeral'


@pytest.fixture
def s3_read_only_prefix():
    return 'read_only'


@pytest.fixture(autouse=True)
def _composer_autouse(monkeypatch, tmp_path, request):
    """Composer's autouse fixtures: W&B offline, MLflow in the test's folder, no run-name variables, cwd."""
    if request.node.get_closest_marker('remote') is not None:
        pytest.skip('remote test (needs real cloud services)')
    monkeypatch.setenv('WANDB_START_METHOD', 'thread')
    monkeypatch.setenv('WANDB_MODE', 'offline')
    monkeypatch.setenv('MOSAICML_PLATFORM', 'False')
    # Composer's tests log to MLflow's file store (a folder), which this MLflow takes only when asked.
    monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')
    for name in ('COMPOSER_RUN_NAME', 'RUN_NAME', 'MLFLOW_EXPERIMENT_NAME', 'MLFLOW_EXPERIMENT_ID', 'MLFLOW_RUN_ID'):
        monkeypatch.delenv(name, raising=False)
    try:
        import mlflow

        mlflow.set_tracking_uri(None)
        tracking = str(tmp_path / 'mlruns')
        os.makedirs(tracking, exist_ok=True)
        monkeypatch.setenv('MLFLOW_TRACKING_URI', tracking)
    except ImportError:
        pass
    monkeypatch.chdir(tmp_path)


def pytest_collection(session):
    import _swap

    _swap.LENIENT = True  # while test modules are imported


def pytest_collection_finish(session):
    import _swap

    _swap.LENIENT = False


def pytest_configure(config):
    config.addinivalue_line('markers', 'remote: needs real cloud services')
    config.addinivalue_line('markers', 'gpu: needs a GPU')
    config.addinivalue_line('markers', 'world_size(n): needs n ranks')
'''

OBJECT_STORE_SETTINGS = '''\
"""Composer's tests/utils/object_store/object_store_settings.py, for the stores dist_logging has (S3)."""
import contextlib

import pytest

from dist_logging.object_store import S3ObjectStore

object_stores = [pytest.param(S3ObjectStore, id='S3ObjectStore')]


@contextlib.contextmanager
def get_object_store_ctx(object_store_cls, object_store_kwargs, monkeypatch, tmp_path, remote=False):
    if object_store_cls is not S3ObjectStore:
        raise NotImplementedError('Parameterization not implemented')
    pytest.importorskip('boto3')
    import boto3
    import moto

    if remote:
        yield
        return
    for key in ('AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY', 'AWS_SECURITY_TOKEN', 'AWS_SESSION_TOKEN'):
        monkeypatch.setenv(key, 'testing')
    monkeypatch.setenv('AWS_DEFAULT_REGION', 'us-east-1')
    with moto.mock_aws():
        boto3.client('s3').create_bucket(Bucket=object_store_kwargs['bucket'])
        yield
'''

_IMPORT = re.compile(
    r'^(?P<indent>[ \t]*)from (?P<module>(?:composer|tests)[\w.]*) import (?P<names>\([^)]*\)|[^\n]*)', re.MULTILINE
)
_PLAIN_IMPORT = re.compile(r'^(?P<indent>[ \t]*)import (?P<module>composer[\w.]*)[ \t]*$', re.MULTILINE)


def swap_imports(source: str) -> str:
    """Every ``from composer... import a, b as c`` (and ``tests...``) becomes lookups in dist_logging."""

    def from_import(match: re.Match) -> str:
        indent, module = match.group('indent'), match.group('module')
        names = match.group('names').strip().strip('()')
        names = re.sub(r'#[^\n]*', '', names)
        lines = [f'{indent}import _swap']
        for part in (p.strip() for p in names.replace('\n', ' ').split(',')):
            if not part:
                continue
            name, _, alias = part.partition(' as ')
            name, alias = name.strip(), (alias.strip() or name.strip())
            if module == 'tests.utils.object_store.object_store_settings':
                lines.append(f'{indent}from object_store_settings import {name} as {alias}')
            else:
                lines.append(f'{indent}{alias} = _swap.lookup({module!r}, {name!r})')
        return '\n'.join(lines)

    def plain_import(match: re.Match) -> str:
        indent, module = match.group('indent'), match.group('module')
        return f'{indent}import _swap\n{indent}composer = _swap.module({module!r})'

    return _PLAIN_IMPORT.sub(plain_import, _IMPORT.sub(from_import, source))


def portable_tests(source: str) -> dict[str, bool]:
    """Test function name -> whether it is portable: it uses none of TRAINER_NAMES, directly or through a
    function of its module that it calls or takes as a fixture (a test that calls another test, a fixture
    that builds a Trainer)."""
    uses: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            used |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            used |= {arg.arg for arg in node.args.args + node.args.kwonlyargs}  # fixtures by name
            uses[node.name] = uses.get(node.name, set()) | used
    machinery = set(TRAINER_NAMES)
    while True:  # a function using the machinery is machinery too, until nothing changes
        more = {name for name, used in uses.items() if name not in machinery and used & machinery}
        if not more:
            break
        machinery |= more
    return {name: name not in machinery for name in uses if name.startswith('test')}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--composer', required=True, help="a Composer git directory (a clone's .git or a bare mirror)")
    parser.add_argument('--tag', default='v0.32.1')
    parser.add_argument('--out', default='/tmp/composer_port')
    parser.add_argument('--pytest-args', default='')
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    portable: dict[str, bool] = {}
    for path in FILES:
        source = subprocess.run(
            ['git', '--git-dir', args.composer, 'show', f'{args.tag}:{path}'],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        name = os.path.basename(path)
        for test, ok in portable_tests(source).items():
            portable[f'{name}::{test}'] = ok
        with open(os.path.join(args.out, name), 'w') as handle:
            handle.write(swap_imports(source))
    with open(os.path.join(args.out, '_swap.py'), 'w') as handle:
        handle.write(SWAP_MODULE.format(module_map=MODULE_MAP))
    with open(os.path.join(args.out, 'conftest.py'), 'w') as handle:
        handle.write(CONFTEST)
    with open(os.path.join(args.out, 'object_store_settings.py'), 'w') as handle:
        handle.write(OBJECT_STORE_SETTINGS)
    with open(os.path.join(args.out, 'pytest.ini'), 'w') as handle:
        handle.write('[pytest]\naddopts = -p no:cacheprovider\ntimeout = 120\n')

    report = os.path.join(args.out, 'report.jsonl')
    command = [
        sys.executable,
        '-m',
        'pytest',
        '-q',
        '-n',
        '0',
        '-rN',
        '--rootdir',
        args.out,
        '--continue-on-collection-errors',
        '-p',
        'no:randomly',
        f'--junitxml={os.path.join(args.out, "junit.xml")}',
        args.out,
        *args.pytest_args.split(),
    ]
    subprocess.run(command, cwd=args.out)
    cases = _read_junit(os.path.join(args.out, 'junit.xml'))
    with open(report, 'w') as handle:
        for case in cases:
            handle.write(json.dumps(case) + '\n')

    by_test: dict[str, list[str]] = {}
    for case in cases:
        by_test.setdefault(case['test'], []).append(case['outcome'])
    passed = failed = 0
    lines = []
    for test, ok in sorted(portable.items()):
        if not ok:
            continue
        outcomes = by_test.get(test, ['not collected'])
        ran = [o for o in outcomes if o != 'skipped']
        good = bool(ran) and all(o == 'passed' for o in ran)
        passed += good
        failed += not good
        lines.append(f"{'PASS' if good else 'FAIL'} {test} {outcomes}")
    print('\n'.join(lines))
    cases_passed = sum(c['outcome'] == 'passed' for c in cases if portable.get(c['test']))
    cases_total = sum(1 for c in cases if portable.get(c['test']) and c['outcome'] != 'skipped')
    print(
        textwrap.dedent(f'''
        portable tests (functions): {passed} of {passed + failed} pass
        their cases: {cases_passed} of {cases_total} pass (skipped cases not counted)
        not portable (Trainer machinery): {sum(not ok for ok in portable.values())} test functions''')
    )
    return 0


def _read_junit(path: str) -> list[dict[str, str]]:
    import xml.etree.ElementTree as ElementTree

    cases = []
    for case in ElementTree.parse(path).getroot().iter('testcase'):
        name = case.get('name', '')
        file = (case.get('classname', '').split('.')[0]) + '.py'
        outcome = 'passed'
        for child in case:
            if child.tag in ('failure', 'error'):
                outcome = 'failed'
            elif child.tag == 'skipped':
                outcome = 'skipped'
        cases.append(
            {
                'test': f"{file}::{name.split('[')[0]}",
                'case': name,
                'outcome': outcome,
                'message': next((c.get('message', '')[:300] for c in case if c.tag != 'system-out'), ''),
            }
        )
    return cases


if __name__ == '__main__':
    sys.exit(main())
