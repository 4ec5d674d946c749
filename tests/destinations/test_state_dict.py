"""state_dict() / load_state_dict() on every destination, the Composer way.

Composer stores ``{type(d).__qualname__: d.state_dict()}`` under ``state['callbacks']`` in its
checkpoints (``torch.save``) and hands each entry back to ``load_state_dict``. Every destination
takes part: what it saves survives ``torch.save``/``torch.load``, loads into a fresh destination of
its class, which then saves the same; and the empty state Composer's own destinations save loads
too. The trackers' saved run ids continuing their runs are tested with each tracker
(test_mlflow.py, test_wandb.py, test_cometml.py) and, for Neptune, here.
"""

from __future__ import annotations

import importlib.util
import io

import pytest
import torch

from dist_logging import Logger
from dist_logging.destination import LoggerDestination
from dist_logging.destinations import __all__ as DESTINATION_NAMES

BUILDERS = {
    'LoggerDestination': lambda tmp: LoggerDestination(),
    'InMemoryLogger': lambda tmp: _cls('InMemoryLogger')(),
    'ConsoleLogger': lambda tmp: _cls('ConsoleLogger')(),
    'FileLogger': lambda tmp: _cls('FileLogger')(str(tmp / 'log-rank{rank}.txt')),
    'TensorboardLogger': lambda tmp: _cls('TensorboardLogger')(log_dir=str(tmp / 'tb')),
    'MLFlowLogger': lambda tmp: _cls('MLFlowLogger')(f'sqlite:///{tmp}/mlflow.db', run_id='0123abcd'),
    'RemoteUploaderDownloader': lambda tmp: _cls('RemoteUploaderDownloader')(str(tmp / 'bucket')),
    'WandBLogger': lambda tmp: _cls('WandBLogger')(project='p', init_kwargs={'id': 'abc123'}),
    'CometMLLogger': lambda tmp: _cls('CometMLLogger')(online=False),
    'NeptuneLogger': lambda tmp: _cls('NeptuneLogger')(mode='offline', with_id='PROJ-7'),
}
PACKAGES = {
    'TensorboardLogger': 'tensorboard',
    'MLFlowLogger': 'mlflow',
    'RemoteUploaderDownloader': None,
    'WandBLogger': 'wandb',
    'CometMLLogger': 'comet_ml',
    'NeptuneLogger': 'neptune',
}


def _cls(name: str):
    import dist_logging.destinations as destinations

    return getattr(destinations, name)


def test_every_destination_is_covered():
    assert set(DESTINATION_NAMES) - {'Logger'} == set(BUILDERS)


@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_round_trip_through_torch_save(name, tmp_path):
    package = PACKAGES.get(name)
    if package and importlib.util.find_spec(package) is None:
        pytest.skip(f'{package} is not installed')
    destination = BUILDERS[name](tmp_path)
    saved = destination.state_dict()
    assert isinstance(saved, dict)
    buffer = io.BytesIO()
    torch.save({'callbacks': {type(destination).__qualname__: saved}}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)['callbacks'][type(destination).__qualname__]
    fresh = (
        BUILDERS[name](tmp_path)
        if name in ('LoggerDestination', 'InMemoryLogger', 'ConsoleLogger')
        else _bare(name, tmp_path)
    )
    fresh.load_state_dict(loaded)
    assert fresh.state_dict() == saved
    fresh.load_state_dict({})  # what Composer's own destinations save
    with pytest.raises(TypeError, match='expected a mapping'):
        fresh.load_state_dict(None)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['nope'\]"):
        fresh.load_state_dict({'nope': 1})


def _bare(name: str, tmp):
    """A destination of the class built without the run id the BUILDERS entry gives it."""
    return {
        'FileLogger': lambda: _cls('FileLogger')(str(tmp / 'other-rank{rank}.txt')),
        'TensorboardLogger': lambda: _cls('TensorboardLogger')(log_dir=str(tmp / 'tb2')),
        'MLFlowLogger': lambda: _cls('MLFlowLogger')(f'sqlite:///{tmp}/mlflow.db'),
        'RemoteUploaderDownloader': lambda: _cls('RemoteUploaderDownloader')(str(tmp / 'bucket2')),
        'WandBLogger': lambda: _cls('WandBLogger')(project='p'),
        'CometMLLogger': lambda: _cls('CometMLLogger')(online=False),
        'NeptuneLogger': lambda: _cls('NeptuneLogger')(mode='offline'),
    }[name]()


def test_saved_state_reaches_the_tracker_when_it_opens(monkeypatch, tmp_path):
    """Neptune offline cannot resume a run; what it is handed is checked instead: with_id=, as Neptune resumes."""
    if importlib.util.find_spec('neptune') is None:
        pytest.skip('neptune is not installed')
    import neptune

    opened = []

    class FakeRun(dict):
        _sys_id = 'PROJ-7'

        def __setitem__(self, key, value):
            super().__setitem__(key, value)

        def stop(self):
            pass

        def sync(self, *args, **kwargs):
            pass

        def wait(self, *args, **kwargs):
            pass

    def init_run(**kwargs):
        opened.append(kwargs)
        return FakeRun()

    monkeypatch.setattr(neptune, 'init_run', init_run)
    destination = _cls('NeptuneLogger')(mode='async', project='ws/p', api_token='t')
    destination.load_state_dict({'run_id': 'PROJ-7'})
    with Logger(destination, run_name='resumed'):
        assert destination.state_dict() == {'run_id': 'PROJ-7'}
    assert opened[0]['with_id'] == 'PROJ-7'
    with pytest.raises(ValueError, match="contradicts with_id='PROJ-1'"):
        _cls('NeptuneLogger')(mode='async', with_id='PROJ-1').load_state_dict({'run_id': 'PROJ-7'})
    offline = _cls('NeptuneLogger')(mode='offline')
    with Logger(offline, run_name='off'):
        assert offline.state_dict() == {'run_id': None}  # Neptune resumes only runs it stores


def test_loading_into_an_open_tracker_keeps_its_run(monkeypatch):
    if importlib.util.find_spec('comet_ml') is None:
        pytest.skip('comet_ml is not installed')
    destination = _cls('CometMLLogger')(online=False)

    class FakeExperiment:
        def get_key(self):
            return 'current'

        def set_name(self, name):
            pass

        def log_other(self, *args):
            pass

        def end(self):
            pass

    import dist_logging.destinations.cometml as cometml

    class FakeComet:
        OfflineExperiment = ExistingOfflineExperiment = staticmethod(lambda **kwargs: FakeExperiment())

    monkeypatch.setattr(cometml, 'import_installed', lambda *args: FakeComet)
    with Logger(destination, run_name='open'):
        with pytest.warns(
            RuntimeWarning,
            match="logging to experiment 'current' already; the saved experiment 'other' is not switched to",
        ):
            destination.load_state_dict({'experiment_key': 'other'})
        assert destination.state_dict() == {'experiment_key': 'current'}
