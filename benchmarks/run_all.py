"""Run every benchmark under torchrun at 1, 2 and 4 ranks and print one results table (``make bench``).

Usage::

    python benchmarks/run_all.py                 # default sizes, 1/2/4 ranks (tens of minutes on 2 CPU cores)
    python benchmarks/run_all.py --quick         # tiny sizes: a couple of minutes
    python benchmarks/run_all.py --ranks 8 --only upload_latency,gather_cost   # the oversubscription run
    python benchmarks/run_all.py --table benchmarks/results/*.json             # only re-render a table

Each run writes ``benchmarks/results/<name>-<host>-<date>-n<N>.json`` (+ a PNG); the combined
markdown table goes to ``benchmarks/results/summary-<host>-<date>.md`` and to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

BENCH_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / 'results'

BENCHMARKS = (
    'log_overhead',
    'gather_cost',
    'upload_latency',
    'training_stall',
    'checkpoint_stall',
    'stragglers',
    'telemetry_overhead',
    'checkpoint_load',
)
# Per-benchmark arguments for a full run; --quick replaces them with the benchmark's own --quick.
DEFAULT_ARGS = {
    'log_overhead': [],
    'gather_cost': ['--keys', '1,10,100,1000'],
    'upload_latency': ['--sizes', '4KiB,1MiB,64MiB,256MiB', '--stores', 'local,s3', '--s3-max-size', '64MiB'],
    'training_stall': ['--ckpt-size', '256MiB', '--every', '10'],
    # 1GiB too: --extra '--sizes 256MiB,1GiB' (about 4x the time).
    'checkpoint_stall': ['--sizes', '256MiB', '--every', '10', '--device-ms', '200,0'],
    'stragglers': [],
    'telemetry_overhead': [],
    # 1GiB too: --extra '--sizes 256MiB,1GiB' (about 5x the time).
    'checkpoint_load': ['--sizes', '256MiB', '--rounds', '2'],
}
TIMEOUT_S = {
    'log_overhead': 600,
    'gather_cost': 1200,
    'upload_latency': 3600,
    'training_stall': 2400,
    'checkpoint_stall': 3600,
    'stragglers': 1800,
    'telemetry_overhead': 1200,
    'checkpoint_load': 2400,
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def run_one(name: str, nproc: int, quick: bool, out_json: pathlib.Path, extra: list[str], timeout: float) -> bool:
    """Launch one benchmark under torchrun; True when it exited 0 and wrote its JSON."""
    cmd = [
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--standalone',
        f'--nproc_per_node={nproc}',
        str(BENCH_DIR / f'{name}.py'),
        '--out-json',
        str(out_json),
    ]
    cmd += ['--quick'] if quick else DEFAULT_ARGS[name]
    cmd += extra
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT), env.get('PYTHONPATH', '')]).rstrip(os.pathsep)
    env.setdefault('OMP_NUM_THREADS', '1')
    print(f'==> {name} at {nproc} rank(s): {" ".join(cmd[3:])}', file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f'!!  {name} at {nproc} rank(s) timed out after {timeout:.0f} s', file=sys.stderr, flush=True)
        return False
    ok = code == 0 and out_json.exists()
    print(
        f'<== {name} at {nproc} rank(s): {"ok" if ok else f"FAILED (exit {code})"} in {time.monotonic() - start:.0f} s',
        file=sys.stderr,
        flush=True,
    )
    return ok


# ----------------------------------------------------------------------------- the table


def _f(value: Optional[float], digits: int = 1, suffix: str = '') -> str:
    if value is None:
        return '–'
    if abs(value) >= 1000:
        return f'{value:,.0f}{suffix}'
    return f'{value:.{digits}f}{suffix}'


def _x(value: Optional[float]) -> str:
    return '–' if value is None else (f'{value:,.0f}×' if value >= 100 else f'{value:.2f}×')


def _oversub(doc: dict) -> str:
    env = doc.get('environment', {})
    return ' (oversubscribed)' if env.get('oversubscribed') else ''


def render(docs: list[dict]) -> str:
    """Markdown tables from benchmark JSON summaries (any mix of benchmarks and world sizes)."""
    by_name: dict[str, list[dict]] = {}
    for doc in docs:
        by_name.setdefault(doc.get('benchmark', '?'), []).append(doc)
    for group in by_name.values():
        group.sort(key=lambda doc: doc.get('environment', {}).get('world_size', 0))
    out: list[str] = []
    for doc in by_name.get('upload_latency', []):
        ws = doc['environment']['world_size']
        for store, by_size in doc['results'].items():
            out.append(
                f'\n**upload_latency — {store} store, {ws} rank(s){_oversub(doc)}** '
                '(median blocking µs per call, all ranks; e2e = first call to last object landed, ms)\n'
            )
            out.append(
                '| size | ours copy=True | ours copy=False | ours use_procs | floor copy_file_range | floor copy2 '
                '| floor link | sync upload | Composer design | copy / floor | Composer / copy=False '
                '| copy / Composer | e2e ours / Composer |'
            )
            out.append('|---|---|---|---|---|---|---|---|---|---|---|---|---|')
            for label, entry in by_size.items():
                m = entry['modes']

                def med(mode: str) -> Optional[float]:
                    return m[mode]['blocking_us']['median'] if mode in m else None

                def ratio(top: str, bottom: str) -> Optional[float]:
                    a, b = med(top), med(bottom)
                    return a / b if a and b else None

                def e2e(mode: str) -> Optional[float]:
                    return m[mode].get('end_to_end_ms', {}).get('median') if mode in m else None

                ratio_e2e = (
                    (e2e('ours_copy') / e2e('composer_design')) if e2e('ours_copy') and e2e('composer_design') else None
                )
                out.append(
                    f"| {label} | {_f(med('ours_copy'))} | {_f(med('ours_nocopy'))} | {_f(med('ours_procs'))} "
                    f"| {_f(med('floor_cfr'))} | {_f(med('floor_copy2'))} | {_f(med('floor_link'))} "
                    f"| {_f(med('sync_upload'))} | {_f(med('composer_design'))} "
                    f"| {_x(med('ours_copy') / med('floor_cfr') if med('ours_copy') and med('floor_cfr') else None)} "
                    f"| {_x(ratio('composer_design', 'ours_nocopy'))} "
                    f"| {_x(ratio('ours_copy', 'composer_design'))} "
                    f"| {_x(ratio_e2e)} ({_f(e2e('ours_copy'))} / {_f(e2e('composer_design'))} ms) |"
                )
    stall = by_name.get('training_stall', [])
    if stall:
        modes = list(stall[0]['modes'])
        out.append(
            '\n**training_stall** (step-time inflation vs the same loop without uploads, mean; '
            'checkpoint size / interval as noted)\n'
        )
        out.append('| ranks | checkpoint | ' + ' | '.join(modes) + ' |')
        out.append('|---|---|' + '---|' * len(modes))
        for doc in stall:
            cells = [
                _f(100 * doc['modes'][mode]['inflation_mean'], 1, '%') if mode in doc['modes'] else '–'
                for mode in modes
            ]
            none_ms = doc['modes']['none']['step_ms']['mean']
            out.append(
                f"| {doc['environment']['world_size']}{_oversub(doc)} | "
                f"{_size(doc['checkpoint_bytes'])} every {doc['every']} (step {none_ms:.0f} ms) | "
                + ' | '.join(cells)
                + ' |'
            )
    for doc in by_name.get('checkpoint_stall', []):
        for label, exp in doc['experiments'].items():
            out.append(
                f"\n**checkpoint_stall — {label}, {doc['environment']['world_size']} rank(s){_oversub(doc)}, "
                f"a save every {doc['every']} steps, S3 {doc['s3_server']} over {doc['s3_scheme']}** "
                '(medians; blocking = training thread at a save, slowest rank; disk = per checkpoint byte)\n'
            )
            out.append(
                '| mode | blocking ms | local durable s | committed s | ckpt CPU s/GiB | background CPU s/GiB '
                '| disk written × | read() × |'
            )
            out.append('|---|---|---|---|---|---|---|---|')
            for mode, e in exp['modes'].items():
                if mode == 'none':
                    continue
                io = e.get('disk_bytes_per_checkpoint_byte') or {}
                med = lambda key: (e.get(key) or {}).get('median')  # noqa: E731
                block = _f(med('blocking_ms'))
                if 'save_call_ms' in e:
                    block += f" (dcp.save {_f(med('save_call_ms'))})"
                out.append(
                    f"| {mode} | {block} | {_f(med('local_durable_s'), 2)} | {_f(med('commit_s'), 2)} "
                    f"| {_f(e.get('ckpt_cpu_s_per_gib'), 2)} | {_f(e.get('background_cpu_s_per_gib'), 2)} "
                    f"| {_f(io.get('write_bytes'), 2)} | {_f(io.get('rchar'), 2)} |"
                )
            verdicts = []
            for name, t in doc['targets'].get(label, {}).items():
                shown = _x(t['ratio']) if 'ratio' in t else f"{_f(t['write_bytes_x'], 2)}× / {_f(t['rchar_x'], 2)}×"
                verdicts.append(f"{name}: {shown} {'met' if t['met'] else 'missed' if t['met'] is False else 'n/a'}")
            out.append('\nTargets: ' + '; '.join(verdicts) + '\n')
    logs = by_name.get('log_overhead', [])
    if logs:
        out.append('\n**log_overhead** (µs per `log_metrics` call, median)\n')
        out.append(
            '| ranks | rank 0: ours, 1 in-memory dest | rank 0: Composer design | rank 0: ours, 3 dests '
            '| rank 0: dict append | other ranks: ours, 3 rank-zero dests | other ranks: no-op call '
            '| ours in-mem / Composer |'
        )
        out.append('|---|---|---|---|---|---|---|---|')
        for doc in logs:
            r0 = doc['rank0_median_us']
            other = doc.get('other_ranks_worst_median_us') or {}
            comp = r0.get('composer_real', r0.get('composer_design'))
            out.append(
                f"| {doc['environment']['world_size']}{_oversub(doc)} | {_f(r0['ours_inmem'], 2)} | {_f(comp, 2)} "
                f"| {_f(r0['ours_3zero'], 2)} | {_f(r0['dict_append'], 2)} | {_f(other.get('ours_3zero'), 2)} "
                f"| {_f(other.get('noop_call'), 2)} | {_x(r0['ours_inmem'] / comp if comp else None)} |"
            )
    gathers = by_name.get('gather_cost', [])
    if gathers:
        out.append('\n**gather_cost** (µs per flush, median over rounds of the slowest rank)\n')
        out.append(
            '| ranks | K | flush() | one all_reduce (floor) | K all_reduces | flush / floor | per-key / flush '
            '| collectives per flush |'
        )
        out.append('|---|---|---|---|---|---|---|---|')
        for doc in gathers:
            for k, e in doc['results'].items():
                coll = e.get('collectives_per_flush') or {}
                out.append(
                    f"| {doc['environment']['world_size']}{_oversub(doc)} | {k} "
                    f"| {_f(e['flush']['slowest_rank']['median'])} "
                    f"| {_f(e['floor_1tensor']['slowest_rank']['median'])} "
                    f"| {_f(e['per_key']['slowest_rank']['median'])} "
                    f"| {_x(e['ratio_flush_over_floor'])} | {_x(e['ratio_per_key_over_flush'])} "
                    f"| {coll.get('max', '–')} |"
                )
    out += _stragglers_table(by_name.get('stragglers', []))
    out += _load_table(by_name.get('checkpoint_load', []))
    return '\n'.join(out) + '\n'


def _load_table(docs: list[dict]) -> list[str]:
    """checkpoint_load: per size and world, each reader's dcp.load s / RSS added / local disk during / after."""
    out: list[str] = []
    for doc in docs:
        for label, modes in doc['results'].items():
            t = modes.get('targets') or {}
            out.append(
                f"\n**checkpoint_load — {label}, {doc['world_size']} rank(s), S3 {doc['s3_server']}** "
                '(median of rounds, slowest rank; RSS added, disk MiB: largest rank)\n'
            )
            out.append('| reader | dcp.load s | RSS added MiB | disk during MiB | disk after MiB | bit-exact |')
            out.append('|---|---|---|---|---|---|')
            for mode, e in modes.items():
                if mode != 'targets':
                    out.append(
                        f"| {mode} | {_f(e['load_s'], 3)} | {_f(e['rss_added_mib'], 0)} "
                        f"| {_f(e['disk_during_mib'], 0)} | {_f(e['disk_after_mib'], 0)} | {e['exact']} |"
                    )
            out.append(
                f"\nours / best other ({t.get('best_other')}): {_x(t.get('ours_over_best_other'))} "
                f"(target 0.8×); ours / floor: {_x(t.get('ours_over_floor'))} (target 2×)\n"
            )
    return out


def _stragglers_table(docs: list[dict]) -> list[str]:
    """Rank reports: detection, false reports, overhead; the simulated model (benchmarks/stragglers.py)."""
    if not docs:
        return []
    out = [
        '\n**stragglers** (rank reports every 100 steps; slowed rank 1.2x, +-5 % jitter)\n',
        '| ranks | slowed rank chronic at report | other ranks flagged (slowed run) | false flags / steps (even run) '
        '| Logger CPU on-off, % of step | wall step on/off '
        '| simulated 4,096: chronic at / false flags / rank-0 ms per report |',
        '|---|---|---|---|---|---|---|',
    ]
    for doc in docs:
        cost, sim = doc['overhead'], doc.get('simulated', {}).get('4096', {})
        simulated = (
            (
                f"{sim['slowed'].get('first_chronic_report')} / {sim['even']['false_flags']} / "
                f"{_f(sim['even']['rank_zero_cpu_ms_per_report']['median'], 2)}"
            )
            if sim
            else '–'
        )
        out.append(
            f"| {doc['world_size']}{_oversub(doc)} | {doc['slowed'].get('first_chronic_report', '–')} "
            f"| {doc['slowed'].get('false_flags', '–')} | {doc['even'].get('false_flags')} / {doc['even']['steps']} "
            f"| {_f(cost['worst_rank_cpu_overhead_fraction'] * 100, 4)} % | {_f(cost['wall_ratio_on_off_median'], 4)} "
            f"| {simulated} |"
        )
    return out


def _size(nbytes: int) -> str:
    for unit, scale in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if nbytes >= scale:
            return f'{nbytes / scale:g}{unit}'
    return f'{nbytes}B'


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='tiny sizes (each benchmark\'s --quick)')
    parser.add_argument('--ranks', default='1,2,4', help='world sizes to run at')
    parser.add_argument('--only', default=','.join(BENCHMARKS), help='benchmarks to run')
    parser.add_argument('--extra', default='', help='extra arguments passed to every benchmark (quoted)')
    parser.add_argument('--table', nargs='*', default=None, help='only render a table from these JSON files')
    args = parser.parse_args(argv)
    if args.table is not None:
        print(render([json.loads(pathlib.Path(p).read_text()) for p in args.table]))
        return 0
    stamp = time.strftime('%Y%m%d-%H%M%S')
    host = socket.gethostname()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in args.only.split(',') if n.strip()]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f'unknown benchmark(s) {unknown}; known: {list(BENCHMARKS)}')
    docs, failed = [], []
    for name in names:
        for nproc in [int(r) for r in args.ranks.split(',') if r.strip()]:
            out = RESULTS_DIR / f'{name}-{host}-{stamp}-n{nproc}.json'
            timeout = TIMEOUT_S[name] / (10 if args.quick else 1)
            if run_one(name, nproc, args.quick, out, args.extra.split(), max(timeout, 240)):
                docs.append(json.loads(out.read_text()))
            else:
                failed.append(f'{name}@{nproc}')
    table = render(docs)
    summary_path = RESULTS_DIR / f'summary-{host}-{stamp}.md'
    summary_path.write_text(f'# Benchmark results, {host}, {stamp}{" (quick)" if args.quick else ""}\n' + table)
    print(table)
    print(f'[bench] table written to {summary_path}', file=sys.stderr)
    if failed:
        print(f'[bench] FAILED: {failed}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
