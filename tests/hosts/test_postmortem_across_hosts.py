"""Issue 40, the black box across two hosts (tests/hosts/_rig.py): the far side of a partition captures its
postmortem but cannot deliver it; its processes still end by themselves; after the heal, ``dist-logging drain``
on the far host's staging folder delivers its sets, and ``dist-logging diagnose`` reads every rank's.

The job: torchrun --nnodes 2 --nproc-per-node 2 (host1 holds the rendezvous store), a Logger with
``postmortem=True`` uploading to the rig's S3. host2 is cut off from host1, the store and S3 mid-run: every
rank's Logger collective fails (``DistributedLoggingError``, the ``logging_error`` trigger) and each rank
captures its set. host1's sets land at once; host2's stay journaled in its (private) /tmp/staging, and its
processes exit non-zero without any signal from the test. After the heal, drain delivers them.

Duration: 157-210 s on the shared 2-core machine at load average 25-45, where starting the job (48-80 s) and
the drain command's interpreter (33-49 s) dominate; the cut to the far side's exit is 16 s. Serial tier, as
the rig's other tests (a 4-rank job on two hosts).
"""

from __future__ import annotations

import json
import pathlib
import random
import sys
import time

import pytest

from dist_logging._world.watch import process_state
from dist_logging.postmortem import diagnose_uri, object_names
from dist_logging.upload.drain import list_pending
from hosts._rig import drain, landed, logs, outputs, progress, unavailable, wait_for

REASON = unavailable()
pytestmark = [pytest.mark.serial, pytest.mark.timeout(420), pytest.mark.skipif(REASON is not None, reason=REASON or '')]

SCENARIO = pathlib.Path(__file__).with_name('host_scenario.py')
SYNC_TIMEOUT = 5.0
NPROC = 2
WORLD = NPROC * 2  # two hosts
RUN = 'rig'  # host_scenario.py's run_name
FAR, NEAR = (2, 3), (0, 1)  # host2's ranks (cut off), host1's (the store's side)
#: Every file a set holds after a Logger error: the exception is the DistributedLoggingError.
SET_FILES = ('header.json', 'stacks.txt', 'stacks.json', 'exception.txt', 'events.json', 'fr')


def _diagnose_command(rig):
    """``dist-logging diagnose s3://<bucket> --run rig`` run on host1 (on the bridge, S3 reachable)."""
    cmd = [sys.executable, '-m', 'dist_logging', 'diagnose', f's3://{rig.bucket}', '--run', RUN]
    return rig.hosts[0].run(cmd, rig.env(rig.hosts[0]), timeout=120)


def _missing(names, ranks, attempt):
    return {r: sorted(k for k, v in object_names(RUN, attempt, r).items() if v not in names) for r in ranks}


def test_the_far_sides_postmortem_lands_after_the_heal_and_drain(rig, capsys, monkeypatch):
    started = time.monotonic()
    monkeypatch.setenv('AWS_ENDPOINT_URL', rig.s3.endpoint)  # this process's diagnose_uri reads the rig's S3
    env = {
        'RIG_BUCKET': rig.bucket,
        'RIG_SYNC_TIMEOUT': str(SYNC_TIMEOUT),
        'RIG_PG_TIMEOUT': str(SYNC_TIMEOUT),
        'RIG_POSTMORTEM': '1',
    }
    port = 29000 + random.randrange(20000)
    jobs = [rig.torchrun(host, SCENARIO, NPROC, port, ['10000', '0'], env) for host in rig.hosts]
    wait_for(lambda: min(progress(rig, WORLD)) >= 3, 150, 'every rank past step 3')
    ready_after = time.monotonic() - started
    pids = {r: s['pid'] for r, s in outputs(rig, 'start', WORLD).items()}
    cut_at = time.time()
    rig.hosts[1].cut()
    gone = {}
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(gone) < len(pids):
            for r, pid in pids.items():
                if r not in gone and process_state(pid) is None:  # ended (or a zombie not reaped yet)
                    gone[r] = round(time.time() - cut_at, 2)
            time.sleep(0.1)
        # Still cut off: host2's sets were captured but cannot have been delivered.
        before_heal = landed(rig)
    finally:
        rig.hosts[1].heal()
    results = outputs(rig, 'result', WORLD)
    assert sorted(gone) == [0, 1, 2, 3], (gone, results, logs(rig))  # every process ended by itself
    for r, out in results.items():
        assert out and out['error']['type'] == 'DistributedLoggingError', (r, out, logs(rig))
    attempt = 0  # torchrun's restart count: --max-restarts=0
    assert _missing(before_heal, NEAR, attempt) == {0: [], 1: []}, sorted(before_heal)  # the near side delivered
    assert not [name for r in FAR for name in object_names(RUN, attempt, r).values() if name in before_heal]

    # The far side's sets wait in host2's staging folder (its private /tmp), journaled for drain.
    pending = {item.remote_name for item in list_pending(str(rig.hosts[1].path('/tmp/staging')))}
    for r in FAR:
        assert set(object_names(RUN, attempt, r).values()) <= pending, sorted(pending)

    # Before the drain, diagnose names the far side's ranks as the ones that left no set.
    early = diagnose_uri(f's3://{rig.bucket}', RUN)
    assert early.kind == 'missing' and early.culprits == list(FAR) and early.code == 1, early.as_json()
    assert 'host host2' in early.line, early.line

    drained_at = time.monotonic()
    done = drain(rig, rig.hosts[1], '/tmp/staging')
    drain_seconds = time.monotonic() - drained_at
    assert done.returncode == 0, done.stdout + done.stderr
    after = landed(rig)
    assert _missing(after, range(WORLD), attempt) == {r: [] for r in range(WORLD)}, sorted(after)

    # diagnose reads every rank's set, and names the far side as cut off (a partition), the near side as witnesses.
    verdict = diagnose_uri(f's3://{rig.bucket}', RUN)
    ranks = verdict.facts['ranks']
    assert sorted(ranks) == ['0', '1', '2', '3'], verdict.as_json()
    assert {r: facts['host'] for r, facts in ranks.items()} == {'0': 'host1', '1': 'host1', '2': 'host2', '3': 'host2'}
    assert all(facts['reason'] == 'logging_error' for facts in ranks.values()), verdict.as_json()
    assert not any('no postmortem from' in line for line in verdict.details), verdict.as_json()
    for r in FAR:  # cut off from the store, the far side could not tell who else was missing
        assert 'cannot tell which other ranks are missing' in ranks[str(r)]['error'], ranks
    for r in NEAR:  # the store's side named the far host
        assert 'host host2 (ranks [2, 3]) silent' in ranks[str(r)]['error'], ranks
    assert verdict.kind == 'partition' and verdict.culprits == list(FAR), verdict.as_json()
    assert verdict.facts['witnesses'] == list(NEAR), verdict.as_json()
    text = _diagnose_command(rig)  # the command a person runs: exit 1, the culprits on its first line
    first = text.stdout.splitlines()[0] if text.stdout else ''
    assert text.returncode == 1 and first.startswith('partition: rank 2 (host host2), rank 3 (host host2)'), (
        text.stdout + text.stderr
    )
    assert 'ranks 0, 1' in first, first
    with capsys.disabled():
        print(
            f'\n[rig] postmortem across hosts: every rank past step 3 {ready_after:.1f} s after the start; processes '
            f'gone {json.dumps(gone)} s after the cut; drain {drain_seconds:.1f} s; whole test '
            f'{time.monotonic() - started:.1f} s\n[rig] diagnose: {first}',
            file=sys.stderr,
        )
    for job in jobs:  # the agents saw their workers fail (not asserted: torchrun's own business)
        try:
            job.wait(timeout=20)
        except Exception:  # noqa: BLE001 - Rig.__exit__ ends whatever is left on each host, by pid
            pass
