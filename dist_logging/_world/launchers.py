"""What each launcher's environment says about this process (pure functions of an environment mapping).

:func:`launch_facts` reads, in this order, and takes the first source present:

1. torchrun (or anything that exports torch's ``env://`` variables ``RANK``, ``WORLD_SIZE``,
   ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK``);
2. SLURM, for a task of an ``srun`` step (``SLURM_STEP_ID`` set); the batch script of an
   ``sbatch`` job is one process (rank 0 of 1);
3. Open MPI (``OMPI_COMM_WORLD_*``);
4. MPICH / Intel MPI (Hydra: ``PMI_RANK``/``PMI_SIZE``, ``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``),
   or PMIx (``PMIX_RANK`` with a world size from ``PMI_SIZE``);
5. a single process.

torchrun wins over SLURM: under ``srun torchrun ...`` SLURM starts one task per node and
torchrun the ranks; the ranks are torchrun's. The SLURM job is still read for the run id and
the requeue count. :mod:`dist_logging.dist` (the one public source of rank facts) uses these
and overrides the global rank and world size with the process group's once one exists.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Mapping, Optional, overload

__all__ = [
    'LaunchFacts',
    'launch_facts',
    'expand_hostlist',
    'parse_tasks_per_node',
    'LAUNCHERS',
    'ENVIRONMENT_VARIABLES',
]

#: Every variable :func:`launch_facts` reads (dist.py caches its result on their values).
ENVIRONMENT_VARIABLES = (
    'RANK',
    'WORLD_SIZE',
    'LOCAL_RANK',
    'LOCAL_WORLD_SIZE',
    'GROUP_RANK',
    'NODE_RANK',
    'TORCHELASTIC_RUN_ID',
    'TORCHELASTIC_RESTART_COUNT',
    'SLURM_JOB_ID',
    'SLURM_JOBID',
    'SLURM_STEP_ID',
    'SLURM_STEPID',
    'SLURM_PROCID',
    'SLURM_LOCALID',
    'SLURM_NODEID',
    'SLURM_STEP_NUM_TASKS',
    'SLURM_NTASKS',
    'SLURM_NPROCS',
    'SLURM_STEP_NUM_NODES',
    'SLURM_NNODES',
    'SLURM_JOB_NUM_NODES',
    'SLURM_STEP_TASKS_PER_NODE',
    'SLURM_NTASKS_PER_NODE',
    'SLURM_TASKS_PER_NODE',
    'SLURM_RESTART_COUNT',
    'OMPI_COMM_WORLD_RANK',
    'OMPI_COMM_WORLD_SIZE',
    'OMPI_COMM_WORLD_LOCAL_RANK',
    'OMPI_COMM_WORLD_LOCAL_SIZE',
    'PMIX_NAMESPACE',
    'OMPI_MCA_ess_base_jobid',
    'OMPI_MCA_orte_ess_jobid',
    'PMI_RANK',
    'PMIX_RANK',
    'PMI_SIZE',
    'MPI_LOCALRANKID',
    'PMI_LOCAL_RANK',
    'MPI_LOCALNRANKS',
    'PMI_LOCAL_SIZE',
)

#: Every value :func:`launch_facts` may report as ``launcher``.
LAUNCHERS = ('torchrun', 'env', 'slurm', 'openmpi', 'mpich', 'pmix', 'single')


@dataclasses.dataclass(frozen=True)
class LaunchFacts:
    """This process's place in the job, as its launcher's environment describes it.

    Attributes:
        launcher: which source the facts came from (one of :data:`LAUNCHERS`): ``'torchrun'``
            (torchrun's variables), ``'env'`` (``RANK``/``WORLD_SIZE`` exported by something
            other than torchrun), ``'slurm'``, ``'openmpi'``, ``'mpich'`` (also Intel MPI),
            ``'pmix'``, ``'single'``.
        rank, world_size, local_rank, local_world_size, node_rank, num_nodes: the rank facts.
        run_id: an id every process of this job shares (and a restart or requeue keeps), as
            ``'<source>:<id>'`` (``'torchrun:<rdzv id>'``, ``'slurm:<job>.<step>'``,
            ``'mpi:<job id>'``), or ``None`` when the environment holds none.
        restarts: torchrun's restart count (``TORCHELASTIC_RESTART_COUNT``).
        requeues: SLURM's requeue count (``SLURM_RESTART_COUNT``).
    """

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    run_id: Optional[str]
    restarts: int = 0
    requeues: int = 0

    @property
    def run_name(self) -> Optional[str]:
        """The run name derived from :attr:`run_id`: ``slurm-<job>-<step>`` for SLURM (readable: the
        job is what users look up), ``run-<hash>`` for torchrun's id, ``mpi-<hash>`` for MPI's."""
        if self.run_id is None:
            return None
        source, _, raw = self.run_id.partition(':')
        if source == 'slurm':
            return 'slurm-' + raw.replace('.', '-')
        digest = hashlib.sha1(raw.encode()).hexdigest()[:10]
        return ('run-' if source == 'torchrun' else f'{source}-') + digest

    @property
    def attempt_cause(self) -> str:
        """What made this attempt: ``'torchrun restart 1'``, ``'SLURM requeue 2'``, both, or ``'first attempt'``."""
        parts = [
            f'torchrun restart {self.restarts}' if self.restarts else '',
            f'SLURM requeue {self.requeues}' if self.requeues else '',
        ]
        return ', '.join(part for part in parts if part) or 'first attempt'

    @property
    def attempt(self) -> str:
        """Which attempt of the job this is: ``'0'`` the first; the restart (or requeue) count after
        one; ``'<requeues>.<restarts>'`` when a requeued SLURM job's torchrun also restarted."""
        if self.requeues and self.restarts:
            return f'{self.requeues}.{self.restarts}'
        return str(self.requeues or self.restarts)


@overload
def _int(env: Mapping[str, str], *names: str, default: int) -> int: ...


@overload
def _int(env: Mapping[str, str], *names: str, default: None = None) -> Optional[int]: ...


def _int(env: Mapping[str, str], *names: str, default: Optional[int] = None) -> Optional[int]:
    """The first of ``names`` set (non-empty) in ``env``, as an int; ``default`` when none is."""
    for name in names:
        raw = env.get(name)
        if raw is None or raw == '':
            continue
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f'environment variable {name}={raw!r} is not an integer') from None
    return default


def _check(launcher: str, rank: int, world_size: int, local_rank: int, local_world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f'{launcher}: rank {rank} is outside a world of {world_size} process(es)')
    if local_world_size < 1 or not 0 <= local_rank < local_world_size:
        raise ValueError(f'{launcher}: local rank {local_rank} is outside a node of {local_world_size} process(es)')


# ---------------------------------------------------------------------------- SLURM's compressed lists
_RANGE = re.compile(r'^(\d+)(?:-(\d+))?$')


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM host list as ``scontrol show hostnames`` does.

    ``'gpu[01-03,07],cpu5'`` -> ``['gpu01', 'gpu02', 'gpu03', 'gpu07', 'cpu5']``. Zero padding
    is kept (the width of a range's lower bound), several bracket groups in one name multiply
    (``'r[1-2]n[1-2]'`` -> ``r1n1, r1n2, r2n1, r2n2``), and commas inside brackets do not
    split names.

    Raises:
        ValueError: unbalanced brackets, an empty name, or a range that is not ``a-b`` with ``a <= b``.
    """
    if not isinstance(hostlist, str):
        raise TypeError(f'host list must be a str, got {type(hostlist).__name__}')
    names: list[str] = []
    depth, start = 0, 0
    for index, char in enumerate(hostlist + ','):
        if char == '[':
            depth += 1
            if depth > 1:
                raise ValueError(f'host list {hostlist!r}: nested "[" at position {index}')
        elif char == ']':
            depth -= 1
            if depth < 0:
                raise ValueError(f'host list {hostlist!r}: "]" without "[" at position {index}')
        elif char == ',' and depth == 0:
            item = hostlist[start:index].strip()
            start = index + 1
            if item:
                names.extend(_expand_name(item, hostlist))
            elif index < len(hostlist):
                raise ValueError(f'host list {hostlist!r} has an empty name at position {index}')
    if depth != 0:
        raise ValueError(f'host list {hostlist!r}: "[" without "]"')
    return names


def _expand_name(item: str, hostlist: str) -> list[str]:
    match = re.search(r'\[([^\]]*)\]', item)
    if match is None:
        return [item]
    prefix, suffix = item[: match.start()], item[match.end() :]
    out = []
    for part in match.group(1).split(','):
        part = part.strip()
        bounds = _RANGE.match(part)
        if bounds is None:
            raise ValueError(f'host list {hostlist!r}: {part!r} in [{match.group(1)}] is not a number or a range a-b')
        low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
        if int(high) < int(low):
            raise ValueError(f'host list {hostlist!r}: range {part!r} ends before it starts')
        width = len(low)
        for number in range(int(low), int(high) + 1):
            for tail in _expand_name(suffix, hostlist) if '[' in suffix else [suffix]:
                out.append(f'{prefix}{number:0{width}d}{tail}')
    return out


def parse_tasks_per_node(value: str) -> list[int]:
    """Expand SLURM's tasks-per-node form: ``'2(x3),1'`` -> ``[2, 2, 2, 1]``.

    Raises:
        ValueError: an item that is not ``n`` or ``n(xk)``.
    """
    counts: list[int] = []
    for item in value.split(','):
        match = re.fullmatch(r'\s*(\d+)(?:\(x(\d+)\))?\s*', item)
        if match is None:
            raise ValueError(f'SLURM tasks per node {value!r}: {item!r} is not "n" or "n(xk)"')
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


# ---------------------------------------------------------------------------- the launchers
def _slurm_run_id(env: Mapping[str, str]) -> Optional[str]:
    job = env.get('SLURM_JOB_ID') or env.get('SLURM_JOBID')
    if not job:
        return None
    step = env.get('SLURM_STEP_ID') or env.get('SLURM_STEPID') or 'batch'
    return f'slurm:{job}.{step}'


def _mpi_run_id(env: Mapping[str, str]) -> Optional[str]:
    # PMIx names the job's namespace, the same on every rank of one mpirun; Open MPI 4 also
    # exports its job id. Hydra (MPICH, Intel MPI) exports nothing shared.
    for name in ('PMIX_NAMESPACE', 'OMPI_MCA_ess_base_jobid', 'OMPI_MCA_orte_ess_jobid'):
        if env.get(name):
            return f'mpi:{env[name]}'
    return None


def _torchrun(env: Mapping[str, str]) -> LaunchFacts:
    rank, world_size = _int(env, 'RANK', default=0), _int(env, 'WORLD_SIZE', default=1)
    local_rank = _int(env, 'LOCAL_RANK', default=0)
    local_world_size = _int(env, 'LOCAL_WORLD_SIZE', default=1)
    node_rank = _int(env, 'GROUP_RANK', 'NODE_RANK', default=-1)
    if node_rank < 0:
        node_rank = rank // max(local_world_size, 1)
    run_id = env.get('TORCHELASTIC_RUN_ID')
    launcher = 'torchrun' if run_id is not None or 'TORCHELASTIC_RESTART_COUNT' in env else 'env'
    run_id = None if run_id in (None, 'none') else f'torchrun:{run_id}'
    return LaunchFacts(
        launcher,
        rank,
        world_size,
        local_rank,
        local_world_size,
        node_rank,
        max(world_size // max(local_world_size, 1), 1),
        run_id,
        restarts=_int(env, 'TORCHELASTIC_RESTART_COUNT', default=0),
        requeues=_int(env, 'SLURM_RESTART_COUNT', default=0),
    )


def _slurm(env: Mapping[str, str]) -> LaunchFacts:
    requeues = _int(env, 'SLURM_RESTART_COUNT', default=0)
    if not (env.get('SLURM_STEP_ID') or env.get('SLURM_STEPID')):
        # The batch script of an sbatch job: one process, whatever -n asked for its steps.
        return LaunchFacts('slurm', 0, 1, 0, 1, 0, 1, _slurm_run_id(env), requeues=requeues)
    rank = _int(env, 'SLURM_PROCID')
    assert rank is not None  # _LAUNCHER_SOURCES calls _slurm only when SLURM_PROCID is set (non-empty)
    world_size = _int(env, 'SLURM_STEP_NUM_TASKS', 'SLURM_NTASKS', 'SLURM_NPROCS')
    if world_size is None:
        raise ValueError(f'SLURM: SLURM_PROCID={rank} is set but no world size (SLURM_STEP_NUM_TASKS, SLURM_NTASKS)')
    local_rank = _int(env, 'SLURM_LOCALID', default=0)
    node_rank = _int(env, 'SLURM_NODEID', default=0)
    num_nodes = _int(env, 'SLURM_STEP_NUM_NODES', 'SLURM_NNODES', 'SLURM_JOB_NUM_NODES', default=1)
    local_world_size: Optional[int] = None
    for name in ('SLURM_STEP_TASKS_PER_NODE', 'SLURM_NTASKS_PER_NODE', 'SLURM_TASKS_PER_NODE'):
        raw = env.get(name)
        if raw:
            counts = parse_tasks_per_node(raw)
            local_world_size = counts[node_rank] if node_rank < len(counts) else counts[-1]
            break
    if local_world_size is None:
        local_world_size = max(world_size // max(num_nodes, 1), 1)
    _check('SLURM', rank, world_size, local_rank, local_world_size)
    return LaunchFacts(
        'slurm',
        rank,
        world_size,
        local_rank,
        local_world_size,
        node_rank,
        num_nodes,
        _slurm_run_id(env),
        requeues=requeues,
    )


_LABELS = {'openmpi': 'Open MPI', 'mpich': 'MPI (Hydra)', 'pmix': 'PMIx'}


def _per_node(
    launcher: str,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    run_id: Optional[str],
    env: Mapping[str, str],
) -> LaunchFacts:
    _check(_LABELS[launcher], rank, world_size, local_rank, local_world_size)
    # MPI exports no node index: derived assuming every node runs the same number of ranks.
    return LaunchFacts(
        launcher,
        rank,
        world_size,
        local_rank,
        local_world_size,
        rank // local_world_size,
        max(world_size // local_world_size, 1),
        run_id,
        requeues=_int(env, 'SLURM_RESTART_COUNT', default=0),
    )


def _openmpi(env: Mapping[str, str]) -> LaunchFacts:
    rank = _int(env, 'OMPI_COMM_WORLD_RANK')
    assert rank is not None  # _LAUNCHER_SOURCES calls _openmpi only when OMPI_COMM_WORLD_RANK is set (non-empty)
    world_size = _int(env, 'OMPI_COMM_WORLD_SIZE')
    if world_size is None:
        raise ValueError(f'Open MPI: OMPI_COMM_WORLD_RANK={rank} is set but OMPI_COMM_WORLD_SIZE is not')
    return _per_node(
        'openmpi',
        rank,
        world_size,
        _int(env, 'OMPI_COMM_WORLD_LOCAL_RANK', default=0),
        _int(env, 'OMPI_COMM_WORLD_LOCAL_SIZE', default=1),
        _mpi_run_id(env),
        env,
    )


def _mpich(env: Mapping[str, str]) -> LaunchFacts:
    rank = _int(env, 'PMI_RANK', 'PMIX_RANK')
    assert rank is not None  # _LAUNCHER_SOURCES calls _mpich only when PMI_RANK or PMIX_RANK is set (non-empty)
    world_size = _int(env, 'PMI_SIZE')
    if world_size is None:
        which = 'PMI_RANK' if env.get('PMI_RANK') else 'PMIX_RANK'
        raise ValueError(
            f'MPI: {which}={rank} is set but no world size (PMI_SIZE); launch with torchrun, srun or '
            'an MPI that exports it, or set RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE'
        )
    launcher = 'mpich' if env.get('PMI_RANK') else 'pmix'
    return _per_node(
        launcher,
        rank,
        world_size,
        _int(env, 'MPI_LOCALRANKID', 'PMI_LOCAL_RANK', default=0),
        _int(env, 'MPI_LOCALNRANKS', 'PMI_LOCAL_SIZE', default=1),
        _mpi_run_id(env),
        env,
    )


_TORCH_VARIABLES = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'NODE_RANK')
_LAUNCHER_SOURCES = (
    (lambda env: bool(env.get('SLURM_PROCID') and (env.get('SLURM_JOB_ID') or env.get('SLURM_JOBID'))), _slurm),
    (lambda env: bool(env.get('OMPI_COMM_WORLD_RANK')), _openmpi),
    (lambda env: bool(env.get('PMI_RANK') or env.get('PMIX_RANK')), _mpich),
)


def launch_facts(env: Mapping[str, str]) -> LaunchFacts:
    """This process's facts from ``env`` (e.g. ``os.environ``), by the precedence in the module docstring.

    Raises:
        ValueError: a variable that is not an integer, a rank outside its world, or a rank with
            no world size (each named).
    """
    others = [detect for present, detect in _LAUNCHER_SOURCES if present(env)]
    if any(env.get(name) for name in _TORCH_VARIABLES):
        facts = _torchrun(env)
        if facts.launcher == 'env' and others:
            # RANK/WORLD_SIZE exported by init_process_group_from_env (or by hand) under another
            # launcher: name the launcher that started the job when its facts agree.
            try:
                other = others[0](env)
            except ValueError:
                other = None
            if other is not None and (other.rank, other.world_size) == (facts.rank, facts.world_size):
                facts = dataclasses.replace(facts, launcher=other.launcher)
    elif others:
        facts = others[0](env)
    else:
        facts = LaunchFacts('single', 0, 1, 0, 1, 0, 1, None, requeues=_int(env, 'SLURM_RESTART_COUNT', default=0))
    restarts = _int(env, 'TORCHELASTIC_RESTART_COUNT', default=0)
    if restarts != facts.restarts:
        facts = dataclasses.replace(facts, restarts=restarts)
    if facts.run_id is None:
        # The job's id, whatever started the ranks: srun torchrun --standalone still runs in one SLURM step.
        torchrun_id = env.get('TORCHELASTIC_RUN_ID')
        run_id = (
            (f'torchrun:{torchrun_id}' if torchrun_id and torchrun_id != 'none' else None)
            or _slurm_run_id(env)
            or _mpi_run_id(env)
        )
        if run_id is not None:
            facts = dataclasses.replace(facts, run_id=run_id)
    return facts
