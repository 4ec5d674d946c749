"""What the checkpoint's end-to-end checksums cost (docs/checkpoints.md, "Integrity"): CPU seconds per GiB of a
shard written through the writer's CRC32C stream against a plain write, of the reader's check (read back from the
page cache, then CRC32C) and of the raw CRC32C against zlib's CRC-32 (what the S3 store sent before). With
``--compression``: a ``dcp.save`` through ``CheckpointWriter`` to a local bucket with and without torch's
``_extensions=[ZStandard()]`` (ratio, and the save's wall time to the commit), for a state of fp32 weights
(random) plus Adam-like moments half of which are still zero.

    python benchmarks/checkpoint_checksums.py [--mib 512] [--rounds 3] [--compression]

CPU time (process_time), best of ``--rounds``; the files live in the system temp folder.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import zlib

from dist_logging.checkpoint._checksums import SummingWriter
from dist_logging.object_store.checksums import crc32c, file_crc32c

MiB = 1 << 20


def _write(path: str, total: int, block: bytes, summing: bool) -> float:
    started = time.process_time()
    with open(path, 'wb') as raw:
        stream = SummingWriter(raw) if summing else raw
        for _ in range(total // len(block)):
            stream.write(block)
        if summing:
            stream.close()
    return time.process_time() - started


def _sum(fn, data: bytes) -> float:
    started = time.process_time()
    view = memoryview(data)
    value = 0
    for offset in range(0, len(data), 8 * MiB):
        value = fn(view[offset : offset + 8 * MiB], value)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--mib', type=int, default=512)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--compression', action='store_true')
    args = parser.parse_args()
    if args.compression:
        _compression(args.mib)
        return
    total, block = args.mib * MiB, os.urandom(8 * MiB)
    gib = total / (1 << 30)
    folder = tempfile.mkdtemp(prefix='checksum-bench-')
    path = os.path.join(folder, 'shard')
    try:
        plain = min(_write(path, total, block, False) for _ in range(args.rounds))
        summed = min(_write(path, total, block, True) for _ in range(args.rounds))
        verify = min(_timed(file_crc32c, path) for _ in range(args.rounds))
        data = block * (total // len(block))
        raw_c = min(_sum(crc32c, data) for _ in range(args.rounds))
        raw_z = min(_sum(zlib.crc32, data) for _ in range(args.rounds))
    finally:
        if os.path.exists(path):
            os.unlink(path)
        os.rmdir(folder)
    print(f'{args.mib} MiB, best of {args.rounds}, CPU s per GiB:')
    print(f'  shard write, plain            {plain / gib:.3f}')
    print(f'  shard write through CRC32C    {summed / gib:.3f}  (+{(summed - plain) / gib:.3f})')
    print(f'  reader check (read + CRC32C)  {verify / gib:.3f}')
    print(f'  CRC32C alone                  {raw_c / gib:.3f}')
    print(f'  zlib CRC-32 alone             {raw_z / gib:.3f}')


def _compression(mib: int) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._extension import ZStandard

    from dist_logging.checkpoint import CheckpointWriter

    count = mib * MiB // 4 // 3
    torch.manual_seed(0)
    moment = torch.randn(count)
    moment[: count // 2] = 0
    state = {'weight': torch.randn(count), 'exp_avg': moment, 'exp_avg_sq': moment.abs()}
    folder = tempfile.mkdtemp(prefix='zstd-bench-')
    try:
        for label, extensions in (('plain', None), ('zstd', [ZStandard()])):
            with CheckpointWriter(
                os.path.join(folder, 'bucket'),
                upload_staging_folder=os.path.join(folder, 'st'),
                _extensions=extensions,
                validate_bucket=False,
            ) as writer:
                started = time.monotonic()
                cpu = time.process_time()
                dcp.save(state, checkpoint_id=f'c/{label}', storage_writer=writer, no_dist=True)
                local = time.monotonic() - started
                writer.wait_for_commits()
                total = time.monotonic() - started
                cpu = time.process_time() - cpu
                size = writer.timings[-1].bytes_written
            print(
                f'{label:5s} {size / MiB:8.1f} MiB of {mib} MiB ({size / (mib * MiB):.2f}), dcp.save {local:.2f} s, '
                f'committed {total:.2f} s, CPU {cpu:.2f} s'
            )
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _timed(fn, *args) -> float:
    started = time.process_time()
    fn(*args)
    return time.process_time() - started


if __name__ == '__main__':
    main()
