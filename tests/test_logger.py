import math
import warnings

import numpy as np
import pytest
import torch

from dist_logging import Event, Logger, LoggerDestination, LogLevel
from dist_logging.destinations import InMemoryLogger


class Recorder(LoggerDestination):
    """Records every hook call (name, args)."""

    def __init__(self, ranks='zero', **kwargs):
        super().__init__(ranks=ranks, **kwargs)
        self.calls = []

    def log_hyperparameters(self, hyperparameters):
        self.calls.append(('log_hyperparameters', hyperparameters))

    def log_metrics(self, metrics, step=None):
        self.calls.append(('log_metrics', metrics, step))

    def log_traces(self, traces):
        self.calls.append(('log_traces', traces))

    def run_event(self, event, state, logger):
        self.calls.append(('event', event))
        super().run_event(event, state, logger)

    # As Composer's engine does, the Logger calls close() and post_close() directly, not through run_event.
    def close(self, state, logger):
        self.calls.append(('event', Event.CLOSE))

    def post_close(self):
        self.calls.append(('event', Event.POST_CLOSE))

    def hooks(self, name):
        return [c for c in self.calls if c[0] == name]


class Uploader(Recorder):
    def can_upload_files(self):
        return True

    def upload_file(self, state, remote_file_name, file_path, *, overwrite):
        self.calls.append(('upload_file', remote_file_name, str(file_path), overwrite))


# ----------------------------------------------------------------- routing and rank policy
@pytest.mark.parametrize(
    'rank,local_rank,expected', [(0, 0, {'zero', 'local_zero', 'all'}), (2, 0, {'local_zero', 'all'}), (3, 1, {'all'})]
)
def test_rank_policy(fake_rank, rank, local_rank, expected):
    fake_rank(rank=rank, world_size=4, local_rank=local_rank, local_world_size=2)
    dests = {policy: Recorder(ranks=policy) for policy in ('zero', 'local_zero', 'all')}
    logger = Logger(list(dests.values()), run_name='r')
    logger.log_metrics({'loss': 1.0})
    logger.log_traces({'t': 1})
    got = {policy for policy, d in dests.items() if d.hooks('log_metrics')}
    assert got == expected
    # excluded destinations are never called, not even for events
    for policy, d in dests.items():
        if policy not in expected:
            assert d.calls == []


def test_hyperparameters_only_on_global_rank_zero(fake_rank):
    fake_rank(rank=1, world_size=2, local_rank=0, local_world_size=1)
    everywhere = Recorder(ranks='all')
    Logger([everywhere], run_name='r').log_hyperparameters({'lr': 0.1})
    assert everywhere.hooks('log_hyperparameters') == []


def test_hyperparameters_on_rank_zero_reach_all_active():
    a, b = Recorder(ranks='zero'), Recorder(ranks='all')
    Logger([a, b], run_name='r').log_hyperparameters({'lr': 0.1})
    assert a.hooks('log_hyperparameters') == [('log_hyperparameters', {'lr': 0.1})]
    assert b.hooks('log_hyperparameters') == [('log_hyperparameters', {'lr': 0.1})]


def test_lazy_data_not_called_when_no_destination_takes_it(fake_rank):
    fake_rank(rank=1, world_size=2)
    logger = Logger([Recorder(ranks='zero')], run_name='r')

    def expensive():
        raise AssertionError('must not be called')

    logger.log_metrics(expensive)
    logger.log_hyperparameters(expensive)
    logger.log_traces(expensive)


def test_lazy_data_called_once_when_taken():
    calls = []
    rec = Recorder()
    logger = Logger([rec, Recorder()], run_name='r')
    logger.log_metrics(lambda: calls.append(1) or {'x': 2})
    assert calls == [1] and rec.hooks('log_metrics')[0][1] == {'x': 2}


def test_log_level_threshold():
    coarse = Recorder(log_level=LogLevel.EPOCH)
    fine = Recorder()
    logger = Logger([coarse, fine], run_name='r')
    logger.log_metrics({'a': 1}, level=LogLevel.BATCH)
    logger.log_metrics({'b': 1}, level='epoch')
    assert [c[1] for c in coarse.hooks('log_metrics')] == [{'b': 1}]
    assert len(fine.hooks('log_metrics')) == 2


def test_values_are_converted_to_python_numbers():
    rec = Recorder()
    logger = Logger([rec], run_name='r')
    logger.log_metrics(
        {
            't': torch.tensor(2.5),
            't1': torch.tensor([3]),
            'np': np.float32(1.5),
            'arr': np.array([4.0]),
            'nan': float('nan'),
            'b': True,
        },
        step=4,
    )
    ((_, metrics, step),) = rec.hooks('log_metrics')
    assert step == 4
    assert metrics['t'] == 2.5 and metrics['t1'] == 3 and metrics['np'] == 1.5 and metrics['arr'] == 4.0
    assert math.isnan(metrics['nan']) and metrics['b'] == 1
    assert all(type(v) in (int, float) for v in metrics.values())


@pytest.mark.parametrize(
    'metrics,error,fragment',
    [
        ({1: 0.5}, TypeError, '1'),
        ({'loss': 'high'}, TypeError, "'high'"),
        ({'loss': [1, 2]}, TypeError, 'list'),
        ({'loss': torch.ones(3)}, ValueError, 'shape (3,)'),
        ({'loss': None}, TypeError, 'NoneType'),
    ],
)
def test_bad_metrics_raise_at_call(metrics, error, fragment):
    logger = Logger([Recorder()], run_name='r')
    with pytest.raises(error, match=None) as info:
        logger.log_metrics(metrics)
    assert fragment in str(info.value)


def test_metrics_not_a_mapping():
    with pytest.raises(TypeError, match='mapping'):
        Logger([Recorder()], run_name='r').log_metrics([('a', 1)])


def test_unknown_reduce_and_level():
    logger = Logger([Recorder()], run_name='r')
    with pytest.raises(ValueError, match="'avg'"):
        logger.log_metrics({'a': 1}, reduce='avg')
    with pytest.raises(ValueError, match="'loud'"):
        logger.log_metrics({'a': 1}, level='loud')


def test_unknown_ranks_policy_at_construction():
    with pytest.raises(ValueError, match="'everyone'"):
        Recorder(ranks='everyone')

    class Sneaky(LoggerDestination):
        ranks = 'rank0'

    with pytest.raises(ValueError, match="'rank0'"):
        Logger([Sneaky()], run_name='r')


def test_non_destination_rejected():
    with pytest.raises(TypeError, match=r'destinations\[1\]'):
        Logger([Recorder(), object()], run_name='r')


def test_calls_after_close_raise():
    logger = Logger([Recorder()], run_name='r')
    logger.close()
    logger.close()  # idempotent
    for call in (
        lambda: logger.log_metrics({'a': 1}),
        lambda: logger.log_hyperparameters({'a': 1}),
        lambda: logger.log_traces({'a': 1}),
        lambda: logger.upload_file('x', __file__),
        lambda: logger.log_table(['a'], [[1]]),
    ):
        with pytest.raises(RuntimeError, match='closed'):
            call()


def test_calls_after_close_raise_on_excluded_rank(fake_rank):
    fake_rank(rank=1, world_size=2)
    logger = Logger([Recorder()], run_name='r')
    logger.close()
    with pytest.raises(RuntimeError, match='closed'):
        logger.log_metrics({'a': 1})


# ----------------------------------------------------------------- lifecycle
def test_events_and_timestamp():
    rec = Recorder()
    with Logger([rec], run_name='r') as logger:
        logger.fit_start()
        logger.epoch_start()
        logger.batch_start()
        logger.batch_end(samples=4, tokens=40)
        logger.epoch_end()
        logger.fit_end()
        assert logger.state.timestamp.batch == 1 and logger.state.timestamp.sample == 4
        assert logger.state.timestamp.epoch == 1
    events = [c[1] for c in rec.hooks('event')]
    assert events == [
        Event.INIT,
        Event.FIT_START,
        Event.EPOCH_START,
        Event.BATCH_START,
        Event.BATCH_END,
        Event.EPOCH_END,
        Event.FIT_END,
        Event.CLOSE,
        Event.POST_CLOSE,
    ]


def test_reference_mylogger_overriding_only_hparams_works():
    seen = []

    class MyLogger(LoggerDestination):
        def log_hyperparameters(self, data):
            seen.append(data)

    logger = Logger(MyLogger(), run_name='r')
    logger.log_hyperparameters({'lr': 0.1})
    logger.log_metrics({'loss': 1.0})
    logger.log_table(['a'], [[1]])
    logger.batch_end()
    logger.close()
    assert seen == [{'lr': 0.1}]


def test_no_automatic_data():
    mem = InMemoryLogger()
    Logger([mem], run_name='r').close()
    assert mem.hyperparameters == {} and mem.data == {}


# ----------------------------------------------------------------- run name
def test_run_name_from_env(monkeypatch):
    monkeypatch.setenv('DIST_LOGGING_RUN_NAME', 'from-env')
    assert Logger([], run_name=None).run_name == 'from-env'
    assert Logger([], run_name='given').run_name == 'given'


def test_run_name_from_torchrun_id_is_shared(monkeypatch):
    monkeypatch.setenv('TORCHELASTIC_RUN_ID', 'abc')
    assert Logger([]).run_name == Logger([]).run_name


def test_generated_run_name_single_process():
    assert Logger([]).run_name.startswith('run-')


@pytest.mark.parametrize('name', ['', 'a/b', '..', '{rank}'])
def test_bad_run_name(name):
    with pytest.raises(ValueError):
        Logger([], run_name=name)


# ----------------------------------------------------------------- files
def test_upload_routing_and_formatting(tmp_path, fake_rank):
    fake_rank(rank=1, world_size=2)
    path = tmp_path / 'f-1.txt'
    path.write_text('x')
    everywhere, zero_only = Uploader(ranks='all'), Uploader(ranks='zero')
    logger = Logger([everywhere, zero_only, Recorder(ranks='all')], run_name='r')
    assert logger.has_file_upload_destination()
    logger.upload_file('{run_name}/ckpt/ep{epoch}-rank{rank}.pt', str(tmp_path / 'f-{rank}.txt'), overwrite=True)
    assert everywhere.hooks('upload_file') == [('upload_file', 'r/ckpt/ep0-rank1.pt', str(path), True)]
    assert zero_only.calls == []


def test_upload_bad_inputs(tmp_path):
    logger = Logger([Uploader()], run_name='r')
    with pytest.raises(FileNotFoundError, match='missing'):
        logger.upload_file('x', tmp_path / 'missing')
    with pytest.raises(IsADirectoryError):
        logger.upload_file('x', tmp_path)
    (tmp_path / 'f').write_text('x')
    for bad in ('/abs', '../up', 'a/../../b'):
        with pytest.raises(ValueError, match='object name'):
            logger.upload_file(bad, tmp_path / 'f')
    with pytest.raises(ValueError, match='unknown placeholder'):
        logger.upload_file('{nope}', tmp_path / 'f')


def test_upload_without_uploader_warns(tmp_path):
    (tmp_path / 'f').write_text('x')
    logger = Logger([Recorder()], run_name='r')
    assert not logger.has_file_upload_destination()
    with pytest.warns(RuntimeWarning, match='no upload-capable destination'):
        logger.upload_file('x', tmp_path / 'f')


def test_copy_flag_reaches_destinations_that_accept_it(tmp_path):
    (tmp_path / 'f').write_text('x')

    class CopyAware(Uploader):
        def upload_file(self, state, remote_file_name, file_path, *, overwrite, copy=True):
            self.calls.append(('upload_file', remote_file_name, copy))

    aware, plain = CopyAware(), Uploader()
    Logger([aware, plain], run_name='r').upload_file('x', tmp_path / 'f', copy=False)
    assert aware.hooks('upload_file') == [('upload_file', 'x', False)]
    assert len(plain.hooks('upload_file')) == 1


# ----------------------------------------------------------------- failure isolation and redaction
class Broken(Recorder):
    def log_metrics(self, metrics, step=None):
        raise OSError('disk on fire')


def test_failing_destination_does_not_stop_others_and_is_reraised_at_close():
    broken, ok = Broken(), Recorder()
    logger = Logger([broken, ok], run_name='r')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for _ in range(3):
            logger.log_metrics({'a': 1})
    assert len(ok.hooks('log_metrics')) == 3
    assert len([w for w in caught if 'disk on fire' in str(w.message)]) == 1  # reported once
    with pytest.raises(OSError, match='disk on fire'):
        logger.close()


def test_optional_destination_failure_not_reraised():
    broken = Broken(optional=True)
    logger = Logger([broken, Recorder()], run_name='r')
    with pytest.warns(RuntimeWarning):
        logger.log_metrics({'a': 1})
    logger.close()


def test_close_error_raised_after_closing_everyone():
    class FailsClose(Recorder):
        def close(self, state, logger):
            raise RuntimeError('close failed')

    after = Recorder()
    logger = Logger([FailsClose(), after], run_name='r')
    with pytest.raises(RuntimeError, match='close failed'):
        logger.close()
    assert ('event', Event.CLOSE) in after.calls and ('event', Event.POST_CLOSE) in after.calls


def test_secrets_redacted_nested():
    rec = Recorder()
    logger = Logger([rec], run_name='r')
    hparams = {
        'lr': 0.1,
        'db': {'Password': 'hunter2', 'host': 'h'},
        'AWS_SECRET_ACCESS_KEY': 'k',
        'list': [{'api_key': 'x'}],
        'HF_TOKEN': 't',
    }
    logger.log_hyperparameters(hparams)
    logger.log_traces({'auth': {'credentials': 'c'}})
    got = rec.hooks('log_hyperparameters')[0][1]
    assert got == {
        'lr': 0.1,
        'db': {'Password': '***', 'host': 'h'},
        'AWS_SECRET_ACCESS_KEY': '***',
        'list': [{'api_key': '***'}],
        'HF_TOKEN': '***',
    }
    assert rec.hooks('log_traces')[0][1] == {'auth': {'credentials': '***'}}
    assert hparams['db']['Password'] == 'hunter2'  # the caller's dict is untouched


def test_redaction_extend_and_disable():
    rec = Recorder()
    Logger([rec], run_name='r', redact=r'^wandb_').log_hyperparameters({'wandb_entity': 'e', 'token': 't', 'a': 1})
    assert rec.hooks('log_hyperparameters')[0][1] == {'wandb_entity': '***', 'token': '***', 'a': 1}
    rec2 = Recorder()
    Logger([rec2], run_name='r', redact=False).log_hyperparameters({'token': 't'})
    assert rec2.hooks('log_hyperparameters')[0][1] == {'token': 't'}
    with pytest.raises(ValueError, match=r"'\(unclosed'"):
        Logger([], run_name='r', redact='(unclosed')


def test_table_validation():
    logger = Logger([Recorder()], run_name='r')
    with pytest.raises(ValueError, match='row 1'):
        logger.log_table(['a', 'b'], [[1, 2], [3]])
    with pytest.raises(TypeError, match='column'):
        logger.log_table([1], [[1]])


def test_image_validation():
    logger = Logger([Recorder()], run_name='r')
    with pytest.raises(ValueError, match='channels'):
        logger.log_images(np.zeros((5, 8, 8), dtype=np.uint8))
    with pytest.raises(ValueError, match='dtype'):
        logger.log_images(np.zeros((3, 8, 8), dtype=np.complex64))
    with pytest.raises(ValueError, match=r'values 0-255 .* int64 values 0\.\.382'):
        logger.log_images(np.arange(192, dtype=np.int64).reshape(3, 8, 8) * 2)
    logger.log_images(torch.randint(0, 256, (3, 8, 8)))  # int64 holding 0-255: taken as uint8, as Composer does
    logger.log_images(np.zeros((3, 8, 8), dtype=np.uint8))
    logger.log_images(torch.rand(2, 8, 8, 3), channels_last=True)


def test_float_images_outside_zero_one_warn_once_and_are_kept():
    """A float image outside [0, 1] (e.g. still normalized) is logged, clipped when drawn, with one warning per
    process from one place, however many destinations draw it and however often it is logged."""
    import warnings

    from dist_logging._images import FLOAT_RANGE_WARNING

    memory = InMemoryLogger()
    logger = Logger([memory, InMemoryLogger(ranks='all')], run_name='r')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('default')  # Python's default: once per place the warning comes from
        warnings.filterwarnings('default', module='dist_logging')
        import dist_logging._images as images_module

        getattr(images_module, '__warningregistry__', {}).clear()
        for _ in range(3):
            logger.log_images(torch.randn(2, 3, 4, 4), name='normalized')
        logger.log_images(torch.rand(2, 3, 4, 4), name='in_range')
    assert [str(w.message) for w in caught] == [FLOAT_RANGE_WARNING]
    assert len(memory.images['normalized']) == 3 and memory.images['normalized'][0][1].min() < 0  # kept as given


def test_log_run_info_is_opt_in():
    mem = InMemoryLogger()
    Logger([mem], run_name='r', log_run_info=True)
    assert mem.hyperparameters['world_size'] == 1 and mem.hyperparameters['torch_version'] == torch.__version__
    assert len(mem.hyperparameters['hosts']) == 1


# ----------------------------------------------------------------- Composer's hook forms and routing
def test_post_close_in_both_forms_and_close_called_directly():
    order = []

    class ComposerStyle(LoggerDestination):  # Composer's form: post_close() takes no argument
        def run_event(self, event, state, logger):  # handles its own events, as Composer allows
            order.append(('composer.event', event))

        def close(self, state, logger):
            order.append('composer.close')

        def post_close(self):
            order.append('composer.post_close')

    class OurStyle(LoggerDestination):
        def post_close(self, state, logger):
            order.append(('ours.post_close', state.run_name, type(logger).__name__))

    logger = Logger([ComposerStyle(), OurStyle()], run_name='r')
    logger.close()
    assert order == [
        ('composer.event', Event.INIT),
        'composer.close',
        'composer.post_close',
        ('ours.post_close', 'r', 'Logger'),
    ]


def test_post_close_with_another_signature_fails_at_construction():
    class Odd(LoggerDestination):
        def post_close(self, state):
            pass

    with pytest.raises(TypeError, match=r'Odd\.post_close\(state\) must take no arguments'):
        Logger([Odd()], run_name='r')


def test_upload_reaches_destinations_that_only_override_upload_file(tmp_path):
    (tmp_path / 'bar').write_text('x')
    got = []

    class Tracker(LoggerDestination):  # no can_upload_files(), as in Composer's own tests
        def upload_file(self, state, remote_file_name, file_path, *, overwrite):
            got.append((remote_file_name, file_path.name, overwrite))

    logger = Logger([Tracker(), Recorder()], run_name='r')
    assert logger.has_file_upload_destination()
    logger.upload_file('{run_name}/foo', tmp_path / 'bar', overwrite=True)
    assert got == [('r/foo', 'bar', True)]
    assert not Logger([Recorder()], run_name='r').has_file_upload_destination()


def test_step_defaults_to_the_batch_count():
    rec = Recorder()
    logger = Logger([rec], run_name='r')
    logger.log_metrics({'a': 1.0})
    logger.batch_end()
    logger.batch_end()
    logger.log_metrics({'a': 2.0})
    logger.log_metrics({'a': 3.0}, step=7)
    assert [c[2] for c in rec.hooks('log_metrics')] == [0, 2, 7]


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_low_precision_images(dtype):
    memory = InMemoryLogger()
    logger = Logger([memory], run_name='r')
    logger.log_images(torch.rand(2, 3, 4, 4, dtype=dtype), name='imgs')
    logger.log_images([torch.rand(4, 4, 3, dtype=dtype)], name='last', channels_last=True)
    step, batch, _ = memory.images['imgs'][0]
    assert batch.shape == (2, 4, 4, 3) and batch.dtype.kind == 'f'
    assert memory.images['last'][0][1].shape == (1, 4, 4, 3)
