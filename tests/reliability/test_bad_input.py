"""Bad input, as the issue's table: each row is one kind of bad value, the call that gets it, and the
error it raises at the call, whose message names the bad value (or, for the documented pass-throughs,
what the destinations receive instead of a crash).

Many rows are also covered where their feature is tested (tests/test_logger.py, tests/test_naming.py,
tests/destinations/test_remote.py); this file is the one place that reads as the whole table.
"""

from __future__ import annotations

import io
import json
import math
import os

import numpy as np
import pytest
import torch

from dist_logging import Logger, format_name_with_dist, format_log_data_value
from dist_logging.destinations import ConsoleLogger, FileLogger, InMemoryLogger, RemoteUploaderDownloader
from reliability._common import TESTS_DIR, bucket_objects, sha256, write
from torchrun_helper import read_rank_outputs, run_torchrun, write_script

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ctx(tmp_path):
    """A Logger with an in-memory destination and a local uploader; a real file and a folder."""
    memory = InMemoryLogger()
    rud = RemoteUploaderDownloader(f'file://{tmp_path}/bucket', upload_staging_folder=str(tmp_path / 'staging'))
    logger = Logger([memory, rud], run_name='bad')
    ctx = {'logger': logger, 'memory': memory, 'file': write(tmp_path / 'real.txt', b'x'), 'tmp': tmp_path}
    yield ctx
    logger.close()


def _closed(ctx):
    ctx['logger'].close()
    ctx['logger'].upload_file('late.txt', ctx['file'])


# (row id, the call, the exception, fragments its message must contain)
TABLE = [
    ('metric key not a string', lambda c: c['logger'].log_metrics({7: 1.0}), TypeError, ['int', '7']),
    ('metric key a tuple', lambda c: c['logger'].log_metrics({('a', 1): 1.0}), TypeError, ["('a', 1)"]),
    ('metric value a string', lambda c: c['logger'].log_metrics({'loss': 'high'}), TypeError, ['loss', "'high'"]),
    ('metric value a list', lambda c: c['logger'].log_metrics({'loss': [1, 2]}), TypeError, ['loss', 'list']),
    (
        'metric value a multi-element tensor',
        lambda c: c['logger'].log_metrics({'loss': torch.ones(3)}),
        ValueError,
        ['loss', '(3,)'],
    ),
    (
        'metric value a multi-element array',
        lambda c: c['logger'].log_metrics({'acc': np.zeros((2, 2))}),
        ValueError,
        ['acc', '(2, 2)'],
    ),
    (
        'reduced metric value a string',
        lambda c: c['logger'].log_metrics({'loss': 'x'}, reduce='mean'),
        TypeError,
        ['loss'],
    ),
    (
        'format string with an unknown placeholder',
        lambda c: format_name_with_dist('{run_name}/{rnak}.txt', 'r'),
        ValueError,
        ['{rnak}', '{rank}'],
    ),
    (
        'format string with unbalanced braces',
        lambda c: format_name_with_dist('ckpt-{rank', 'r'),
        ValueError,
        ["'ckpt-{rank'"],
    ),
    (
        'format string with a stray closing brace',
        lambda c: format_name_with_dist('ckpt-rank}', 'r'),
        ValueError,
        ["'ckpt-rank}'"],
    ),
    (
        'format string that formats to an empty name',
        lambda c: format_name_with_dist('{tag}', 'r', tag=''),
        ValueError,
        ['empty'],
    ),
    (
        'upload: remote name formats to an empty name',
        lambda c: c['logger'].upload_file('', c['file']),
        ValueError,
        ["''"],
    ),
    (
        'upload: unknown placeholder in the remote name',
        lambda c: c['logger'].upload_file('{nope}.txt', c['file']),
        ValueError,
        ['{nope}'],
    ),
    (
        'upload: absolute remote name',
        lambda c: c['logger'].upload_file('/etc/passwd', c['file']),
        ValueError,
        ["'/etc/passwd'", 'absolute'],
    ),
    (
        'upload: remote name with ..',
        lambda c: c['logger'].upload_file('runs/../../escape.txt', c['file']),
        ValueError,
        ["'runs/../../escape.txt'", '..'],
    ),
    (
        'bucket URI with an unknown scheme',
        lambda c: RemoteUploaderDownloader('magic://bucket/prefix'),
        ValueError,
        ["'magic'", 'magic://bucket/prefix', 's3://'],
    ),
    (
        'bucket URI with another unknown scheme',
        lambda c: RemoteUploaderDownloader('nosuchproto://namenode/x'),
        ValueError,
        ["'nosuchproto'"],
    ),
    (
        'file_path that does not exist',
        lambda c: c['logger'].upload_file('x.txt', c['tmp'] / 'missing.bin'),
        FileNotFoundError,
        ['missing.bin'],
    ),
    ('file_path that is a directory', lambda c: c['logger'].upload_file('x.txt', c['tmp']), IsADirectoryError, [None]),
    ('upload_file after close()', _closed, RuntimeError, ['closed']),
    (
        'same name twice on one rank, overwrite=False',
        lambda c: [c['logger'].upload_file('once.txt', c['file']) for _ in range(2)],
        FileExistsError,
        ['once.txt'],
    ),
]


@pytest.mark.parametrize('row,call,error,fragments', TABLE, ids=[row[0] for row in TABLE])
def test_bad_input_raises_at_the_call_naming_the_value(ctx, row, call, error, fragments):
    with pytest.raises(error) as info:
        call(ctx)
    message = str(info.value)
    for fragment in fragments:
        expected = str(ctx['tmp']) if fragment is None else fragment
        assert expected in message, f'{row}: {message!r} does not name {expected!r}'


def test_bad_input_leaves_the_logger_usable(ctx):
    for row, call, error, _ in TABLE:
        if row in ('upload_file after close()',):
            continue
        with pytest.raises(error):
            call(ctx)
    ctx['logger'].log_metrics({'ok': 1.0}, step=1)
    assert ctx['memory'].data['ok'] == [(1, 1.0)]  # nothing from the failed calls got through
    assert set(ctx['memory'].data) == {'ok'}


def test_nan_and_inf_pass_through(ctx):
    """Documented pass-through: NaN and inf are values, not errors (also through reductions)."""
    logger = ctx['logger']
    logger.log_metrics({'nan': float('nan'), 'inf': float('inf'), 'ninf': torch.tensor(-math.inf)}, step=1)
    logger.log_metrics({'r': float('nan')}, reduce='max', step=2)
    logger.flush()
    data = ctx['memory'].data
    assert math.isnan(data['nan'][0][1]) and data['inf'][0][1] == math.inf and data['ninf'][0][1] == -math.inf
    assert math.isnan(data['r'][0][1])


class Opaque:
    def __repr__(self):
        return '<Opaque thing>'


def test_hyperparameters_that_are_not_json_are_stored_as_text_never_a_crash(tmp_path):
    hparams = {
        'obj': Opaque(),
        'set': {1, 2},
        'tuple_keys': {(0, 1): 0.5},
        'bytes': b'\x00\xff',
        'tensor': torch.ones(2),
        'fn': len,
        'nan': float('nan'),
    }
    console = io.StringIO()
    memory = InMemoryLogger()
    jsonl = FileLogger(str(tmp_path / 'log.jsonl'), format='jsonl')
    text = FileLogger(str(tmp_path / 'log.txt'))
    logger = Logger([memory, jsonl, text, ConsoleLogger(stream=console)], run_name='hp')
    logger.log_hyperparameters(hparams)
    logger.close()  # no destination failed
    record = json.loads((tmp_path / 'log.jsonl').read_text().splitlines()[0])['data']
    assert record['obj'] == format_log_data_value(Opaque()) == '<Opaque thing>'
    assert record['set'] == '[1, 2]' and record['bytes'] == format_log_data_value(b'\x00\xff')
    assert record['tuple_keys'] == {format_log_data_value((0, 1)): 0.5}
    assert record['tensor'] == '[1.0, 1.0]' and record['fn'] == format_log_data_value(len)
    assert '<Opaque thing>' in (tmp_path / 'log.txt').read_text() and '<Opaque thing>' in console.getvalue()
    assert repr(memory.hyperparameters['obj']) == '<Opaque thing>'  # in memory: (a copy of) the value itself


COLLISION = '''
import os, sys, time
import torch.distributed as torch_dist
from dist_logging import Logger, UploadError
from dist_logging.destinations import RemoteUploaderDownloader
from torchrun_helper import dump_rank_output

root = sys.argv[1]
torch_dist.init_process_group('gloo')
rank = torch_dist.get_rank()
rud = RemoteUploaderDownloader(f'file://{root}/bucket', upload_staging_folder=root + '/staging')
logger = Logger(rud, run_name='collide')
path = f'{root}/rank{rank}.bin'
with open(path, 'wb') as handle:
    handle.write(f'written by rank {rank}'.encode() * (rank + 1))
if rank == 1:
    torch_dist.barrier()  # rank 0's object is in place
logger.upload_file('shared/result.bin', path)  # overwrite=False (the default), the same name on both ranks
if rank == 0:
    rud.wait_for_uploads(30)
    torch_dist.barrier()
error = None
try:
    logger.close()
except UploadError as exc:
    error = {name: [type(e).__name__, str(e), isinstance(e, FileExistsError)] for name, e in exc.failures.items()}
dump_rank_output({'error': error})
'''


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_overwrite_false_collision_across_ranks_on_a_shared_local_store(tmp_path):
    script = write_script(tmp_path, COLLISION)
    run_torchrun(
        script,
        2,
        tmp_path / 'out',
        args=[str(tmp_path)],
        timeout=150,
        env={'PYTHONPATH': f'{TESTS_DIR.parent}:{TESTS_DIR}'},
    )
    outputs = read_rank_outputs(tmp_path / 'out')
    assert outputs[0]['error'] is None
    kind, message, is_exists = outputs[1]['error']['shared/result.bin']
    assert is_exists and kind == 'FileExistsError' and 'shared/result.bin' in message
    # the first object stays intact, and nothing else was written
    assert bucket_objects(tmp_path / 'bucket') == {'shared/result.bin': sha256(b'written by rank 0')}
    assert os.listdir(tmp_path / 'bucket' / 'shared') == ['result.bin']
