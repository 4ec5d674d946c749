"""A rank that dies, or stops logging, before an automatic flush (real torchrun, 3 ranks, gloo).

The survivors' ``batch_end`` issues the flush asynchronously and returns; completing it at the
next ``batch_end`` raises ``DistributedLoggingError`` naming the missing rank within the timeout
counted from when the flush was issued (at once when the rank's process is gone), and the
uploads they accepted before still land at their ``close()`` (which issues no collective).
``tests/multiprocess/test_gather.py`` checks the error's details for an explicit ``flush()``;
this adds the asynchronous path, a rank that dies, and the survivors' uploads.
"""

from __future__ import annotations

import pytest

from reliability._common import TESTS_DIR, bucket_objects
from torchrun_helper import read_rank_outputs, run_torchrun, write_script

pytestmark = pytest.mark.multiprocess

NPROC = 3
TIMEOUT = 5.0

SCENARIO = '''
import datetime, hashlib, os, sys, time
import torch.distributed as torch_dist
from dist_logging import DistributedLoggingError, Logger
from dist_logging.destinations import InMemoryLogger, RemoteUploaderDownloader
from torchrun_helper import dump_rank_output
from upload._stores import TestStore

how, root, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
torch_dist.init_process_group('gloo')
rank, W = torch_dist.get_rank(), torch_dist.get_world_size()
store = TestStore(root + '/bucket', root + '/store-state', delay=0.3)  # uploads are still in flight at the flush
rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=root + '/staging')
logger = Logger([InMemoryLogger(), rud], run_name='flush-death', sync_timeout=timeout)
sums = {}
for i in range(4):
    data = os.urandom(50_000 + i + 10 * rank)
    path = f'{root}/src/rank{rank}-{i}.bin'
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as handle:
        handle.write(data)
    logger.upload_file('{run_name}/rank{rank}/f%d.bin' % i, path)
    sums[f'flush-death/rank{rank}/f{i}.bin'] = hashlib.sha256(data).hexdigest()
logger.log_metrics({'loss': float(rank)}, reduce='mean')
logger.flush()  # every rank: the group works
store = torch_dist.distributed_c10d._get_default_store()
if rank == W - 1:
    dump_rank_output({'sums': sums})
    if how == 'dies':
        os._exit(0)  # the process is gone (exit code 0, so torchrun lets the others go on)
    # alive, but never logs again: wait (event-driven) until the survivors are done
    store.wait([f'flush-death/done{r}' for r in range(W - 1)], datetime.timedelta(seconds=120))
    os._exit(0)
t0 = time.monotonic()
error = None
returned_after = None
try:
    for batch in range(3):
        logger.log_metrics({'loss': float(rank)}, reduce='mean')
        logger.batch_end()  # batch 1 issues the flush and returns; batch 2 completes it
        if returned_after is None:
            returned_after = time.monotonic() - t0
except DistributedLoggingError as exc:
    error = {'type': type(exc).__name__, 'missing': list(exc.missing_ranks), 'message': str(exc),
             'batch': batch}
raised_after = time.monotonic() - t0
t0 = time.monotonic()
close_error = None
try:
    logger.close()  # no collective: the survivors' uploads land
except Exception as exc:
    close_error = repr(exc)
dump_rank_output({'sums': sums, 'error': error, 'raised_after': raised_after, 'close_error': close_error,
                  'close_seconds': time.monotonic() - t0, 'returned_after': returned_after})
store.set(f'flush-death/done{rank}', '1')
os._exit(0)  # the group is broken: skip the teardown collectives
'''


@pytest.mark.timeout(240)
@pytest.mark.parametrize('how', ['dies', 'stops_logging'])
def test_survivors_raise_within_the_timeout_and_their_uploads_land(tmp_path, how):
    script = write_script(tmp_path, SCENARIO)
    run_torchrun(
        script,
        NPROC,
        tmp_path / 'out',
        args=[how, str(tmp_path), str(TIMEOUT)],
        timeout=200,
        env={'PYTHONPATH': f'{TESTS_DIR.parent}:{TESTS_DIR}'},
    )
    outputs = read_rank_outputs(tmp_path / 'out')
    assert sorted(outputs) == list(range(NPROC))
    for rank in range(NPROC - 1):
        out = outputs[rank]
        assert out['error'] is not None, f'rank {rank}: flush did not raise'
        assert out['error']['type'] == 'DistributedLoggingError'
        assert out['error']['batch'] == 1, out['error']  # the flush issued at batch 0's call, completed at the next
        assert out['returned_after'] < TIMEOUT, out  # the batch_end that issued it did not wait for it
        if how == 'stops_logging':  # a live rank is named from the arrival marks in the store
            assert out['error']['missing'] == [NPROC - 1], out['error']
        assert out['raised_after'] < TIMEOUT + 30, out  # within the timeout (+ slack for a loaded machine)
        assert out['close_error'] is None, out['close_error']
        assert out['close_seconds'] < 60
    survivors = {}
    for rank in range(NPROC - 1):
        survivors.update(outputs[rank]['sums'])
    landed = bucket_objects(tmp_path / 'bucket')
    assert {name: landed.get(name) for name in survivors} == survivors  # every accepted upload, byte-identical
