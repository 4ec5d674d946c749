"""The adapters' shared pieces (no framework needed): the lazy Logger, the framework clock, checkpoint names."""

from __future__ import annotations

import os
import pickle

import pytest

from dist_logging import Logger
from dist_logging.destination import LoggerDestination
from dist_logging.integrations._common import MAX_REPLAYED_BATCHES, CheckpointNamer, LoggerHandle, advance_to
from recording_uploader import RecordingUploader


class BatchEnds(LoggerDestination):
    def __init__(self):
        super().__init__(ranks='all')
        self.batches: list[int] = []

    def batch_end(self, state, logger):
        self.batches.append(state.timestamp.batch)


def test_advance_to_replays_each_batch_forward_only_and_caps_big_jumps():
    counter = BatchEnds()
    logger = Logger([counter], run_name='clock')
    advance_to(logger, 4)
    assert counter.batches == [1, 2, 3, 4]
    advance_to(logger, 4)
    advance_to(logger, 2)  # never backwards (e.g. an evaluation loop's own step count)
    advance_to(logger, None)
    advance_to(logger, 7.5)
    assert counter.batches == [1, 2, 3, 4]
    advance_to(logger, 5 + MAX_REPLAYED_BATCHES + 10)  # a resumed run's first step: skip, then replay the cap
    assert len(counter.batches) == 4 + MAX_REPLAYED_BATCHES
    assert counter.batches[-1] == logger.state.timestamp.batch == 5 + MAX_REPLAYED_BATCHES + 10
    logger.close()


def test_handle_builds_once_from_a_factory_and_rebuilds_after_close():
    built = []

    def factory():
        built.append(Logger(run_name=f'r{len(built)}'))
        return built[-1]

    handle = LoggerHandle(factory, None, 'Test')
    assert not handle.is_built and built == []
    assert handle.get() is handle.get() is built[0]
    handle.close()
    handle.close()  # idempotent
    assert handle.get() is built[1]  # a new Logger for a later fit
    assert pickle.loads(pickle.dumps(LoggerHandle(None, {'destinations': []}, 'Test'))).get().run_name


def test_handle_does_not_forget_a_given_logger_and_closes_it_once():
    logger = Logger(run_name='given')
    handle = LoggerHandle(logger, None, 'Test')
    handle.close()
    handle.close()
    assert handle.run_name == 'given'
    with pytest.raises(RuntimeError, match='logger= was closed.*pass a factory'):
        handle.get()  # a given Logger cannot be reopened: said at the next use, not at a log call
    with pytest.raises(RuntimeError, match='closed'):
        logger.log_metrics({'x': 1.0})


def test_handle_builds_every_logger_of_one_run_with_the_first_ones_name(monkeypatch):
    built = []

    def factory():
        built.append(Logger())  # leaves run_name unset: the handle supplies its run's name
        return built[-1]

    monkeypatch.delenv('DIST_LOGGING_RUN_NAME', raising=False)
    handle = LoggerHandle(factory, None, 'Test')
    first = handle.get().run_name
    handle.close()
    assert handle.run_name == first and handle.get().run_name == first and len(built) == 2
    assert 'DIST_LOGGING_RUN_NAME' not in os.environ  # set only while the factory ran
    handle.close()
    configured = LoggerHandle(None, {'destinations': []}, 'Test')
    name = configured.get().run_name
    configured.close()
    assert configured.get().run_name == name
    fixed = LoggerHandle(lambda: Logger(run_name='other'), None, 'Test')
    assert fixed.get().run_name == 'other'  # the first one fixes the run: the factory's own name
    fixed.close()
    with pytest.warns(RuntimeWarning, match="run_name='another'.*not this adapter's run 'other'"):
        fixed._factory = lambda: Logger(run_name='another')  # a factory that changes its mind
        fixed.get()


def test_handle_reads_the_config_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / 'logger.yaml'
    path.write_text('run_name: from-env\ndestinations: []\n')
    monkeypatch.setenv('DIST_LOGGING_CONFIG', str(path))
    assert LoggerHandle(None, None, 'Test').get().run_name == 'from-env'
    assert LoggerHandle(None, None, 'Test', run_name='override').get().run_name == 'override'
    with pytest.raises(TypeError, match='config must be'):
        LoggerHandle(None, 42, 'Test')


def test_checkpoint_names_keep_braces_of_file_names(tmp_path):
    uploads = RecordingUploader()
    logger = Logger([uploads], run_name='r')
    path = tmp_path / 'model-{weird}.ckpt'
    path.write_bytes(b'x')
    namer = CheckpointNamer('{run_name}/rank{rank}/{name}', ('name',), 'Test')
    assert namer.upload(logger, path, overwrite=True, name=path.name) == 'r/rank0/model-{weird}.ckpt'
    assert uploads.uploads == [('r/rank0/model-{weird}.ckpt', b'x', True)]
    with pytest.raises(ValueError, match='absolute'):
        CheckpointNamer('/abs/{name}', ('name',), 'Test')
    with pytest.raises(TypeError, match='checkpoint_name must be a str'):
        CheckpointNamer(None, ('name',), 'Test')


def test_a_config_built_logger_hands_its_destinations_state_to_the_next_one():
    """Each later Logger of a handle built from a config: its destinations load the previous ones' state
    before the Logger opens them, so a tracker continues its run instead of opening another."""
    from _integration_helpers import StatefulDestination

    StatefulDestination.opened.clear()
    handle = LoggerHandle(None, {'destinations': [{'type': '_integration_helpers:StatefulDestination'}]}, 'Test')
    first = handle.get()
    handle.close()
    second = handle.get()
    handle.close()
    handle.get()
    handle.close()
    assert StatefulDestination.opened == [('run-0', False), ('run-0', True), ('run-0', True)]
    assert second.run_name == first.run_name and second.destinations[0] is not first.destinations[0]
