"""One torchrun launch: saves through one CheckpointWriter with dcp.async_save's PROCESS checkpointer (and one
THREAD save in between), then one PROCESS save that fails on rank 1, closes, then loads every checkpoint back
through CheckpointReader on every rank.

$CKPT_PLAN: {"root": ..., "bucket": uri}. Each rank writes what it saw to $OUT_DIR/rank{r}.json.
torch spawns its checkpoint process, which imports this file as __mp_main__: the job runs only under
the __main__ guard.
"""

import json
import os

if __name__ == '__mp_main__':
    # This is torch's checkpoint process (it imports the script under this name): rank 1's write of step5
    # fails there, after its write began (the failure manifest), so the coordinator's finish never runs.
    from dist_logging.checkpoint import _process_side

    _real_write = _process_side.write_rank_files

    def _write_rank_files(writer, plan, planner, results):
        if os.environ.get('RANK') == '1' and writer.checkpoint_id.endswith('/step5'):
            raise OSError("injected in rank 1's checkpoint process: disk full")
        return _real_write(writer, plan, planner, results)

    _process_side.write_rank_files = _write_rank_files


def main():
    import torch.distributed as tdist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    from torch.distributed.device_mesh import init_device_mesh

    from _states import blank_sharded_state, same_sharded_state, sharded_state
    from dist_logging import Logger
    from dist_logging.checkpoint import CheckpointReader, CheckpointWriter, latest_checkpoint, list_checkpoints
    from dist_logging.destinations import InMemoryLogger
    from torchrun_helper import dump_rank_output

    plan = json.loads(os.environ['CKPT_PLAN'])
    tdist.init_process_group('gloo')
    rank, world = tdist.get_rank(), tdist.get_world_size()
    mesh = init_device_mesh('cpu', (world,))

    def state(step):
        return sharded_state(mesh, rank, step)

    def blank():
        return blank_sharded_state(mesh, rank)

    def exact(a, b):
        return same_sharded_state(a, b, rank)

    memory = InMemoryLogger(ranks='all')
    logger = Logger(memory)
    bucket = plan['bucket']
    writer = CheckpointWriter(
        bucket,
        upload_staging_folder=plan['root'] + '/staging',
        files_per_rank=2,
        num_concurrent_uploads=2,
        logger=logger,
    )
    kinds = {
        1: AsyncCheckpointerType.PROCESS,
        2: AsyncCheckpointerType.THREAD,
        3: AsyncCheckpointerType.PROCESS,
        4: AsyncCheckpointerType.PROCESS,
    }
    for step, kind in kinds.items():
        dcp.async_save(
            state(step), checkpoint_id=f'run/ckpt/step{step}', storage_writer=writer, async_checkpointer_type=kind
        ).result(120)
    try:
        dcp.async_save(
            state(5),
            checkpoint_id='run/ckpt/step5',
            storage_writer=writer,
            async_checkpointer_type=AsyncCheckpointerType.PROCESS,
        ).result(120)
        step5_error = None
    except BaseException as exc:  # noqa: BLE001 - torch's CheckpointException is a BaseException
        step5_error = f'{type(exc).__name__}: {exc}'
    from torch.distributed.checkpoint import _async_process_executor as executor

    checkpoint_process = executor._CHECKPOINT_PROCESS  # torch's one checkpoint process of this trainer
    close_error = None
    try:
        writer.close()
    except Exception as exc:  # reported to the test
        close_error = f'{type(exc).__name__}: {exc}'
    logger.close()
    tdist.barrier()  # only the coordinator's close waits for the commits

    loaded = {}
    with CheckpointReader(bucket, run_name='t') as reader:
        for step in kinds:
            got = blank()
            dcp.load(got, checkpoint_id=f'run/ckpt/step{step}', storage_reader=reader)
            loaded[step] = exact(got, state(step))
    dump_rank_output(
        {
            'close_error': close_error,
            'step5_error': step5_error,
            'checkpoint_process_pid': checkpoint_process._save_process.pid if checkpoint_process else None,
            'pid': os.getpid(),
            'latest': latest_checkpoint(bucket, 'run/ckpt'),
            'committed': list_checkpoints(bucket, 'run/ckpt'),
            'exact': loaded,
            'timings': [
                {'id': t.checkpoint_id, 'local_s': t.local_s, 'commit_s': t.commit_s, 'bytes': t.bytes_written}
                for t in writer.timings
            ],
            'local_s_metrics': len(memory.data.get('checkpoint/local_s', [])),
            'commit_s_metrics': len(memory.data.get('checkpoint/commit_s', [])),
        }
    )
    tdist.barrier()
    tdist.destroy_process_group()


if __name__ == '__main__':
    main()
