import pytest

from dist_logging import dist


def test_single_process_defaults():
    assert (
        dist.get_global_rank(),
        dist.get_local_rank(),
        dist.get_world_size(),
        dist.get_local_world_size(),
        dist.get_node_rank(),
    ) == (0, 0, 1, 1, 0)
    assert dist.is_initialized() is False


def test_from_torchrun_env(monkeypatch):
    for key, value in {
        'RANK': '5',
        'LOCAL_RANK': '1',
        'WORLD_SIZE': '8',
        'LOCAL_WORLD_SIZE': '4',
        'GROUP_RANK': '1',
    }.items():
        monkeypatch.setenv(key, value)
    assert (
        dist.get_global_rank(),
        dist.get_local_rank(),
        dist.get_world_size(),
        dist.get_local_world_size(),
        dist.get_node_rank(),
    ) == (5, 1, 8, 4, 1)
    assert dist.get_num_nodes() == 2


def test_node_rank_fallbacks(monkeypatch):
    monkeypatch.setenv('NODE_RANK', '3')
    assert dist.get_node_rank() == 3
    monkeypatch.delenv('NODE_RANK')
    monkeypatch.setenv('RANK', '6')
    monkeypatch.setenv('LOCAL_WORLD_SIZE', '2')
    assert dist.get_node_rank() == 3


def test_bad_env_value_names_variable(monkeypatch):
    monkeypatch.setenv('RANK', 'zero')
    with pytest.raises(ValueError, match="RANK='zero'"):
        dist.get_global_rank()


# ---------------------------------------------------------------------------- launchers (issue 21)
import shutil  # noqa: E402
import subprocess  # noqa: E402

from dist_logging._world.launchers import expand_hostlist, launch_facts, parse_tasks_per_node  # noqa: E402

SLURM_STEP = {  # what a real srun -n 4 over two nodes exports to task 3 (SLURM 22.05)
    'SLURM_JOB_ID': '4242',
    'SLURM_STEP_ID': '0',
    'SLURM_PROCID': '3',
    'SLURM_LOCALID': '1',
    'SLURM_NODEID': '1',
    'SLURM_NTASKS': '4',
    'SLURM_STEP_NUM_TASKS': '4',
    'SLURM_NNODES': '2',
    'SLURM_STEP_NUM_NODES': '2',
    'SLURM_STEP_TASKS_PER_NODE': '2(x2)',
    'SLURM_TASKS_PER_NODE': '2(x2)',
    'SLURM_JOB_NODELIST': 'gpu[01-02]',
    'SLURM_STEP_NODELIST': 'gpu[01-02]',
}
OPENMPI = {
    'OMPI_COMM_WORLD_RANK': '2',
    'OMPI_COMM_WORLD_SIZE': '4',
    'OMPI_COMM_WORLD_LOCAL_RANK': '0',
    'OMPI_COMM_WORLD_LOCAL_SIZE': '2',
    'OMPI_MCA_ess_base_jobid': '31337',
}
HYDRA = {'PMI_RANK': '1', 'PMI_SIZE': '2', 'MPI_LOCALRANKID': '1', 'MPI_LOCALNRANKS': '2', 'PMI_PORT': 'h:1234'}
TORCHRUN = {
    'RANK': '5',
    'WORLD_SIZE': '8',
    'LOCAL_RANK': '1',
    'LOCAL_WORLD_SIZE': '4',
    'GROUP_RANK': '1',
    'TORCHELASTIC_RUN_ID': 'job9',
    'TORCHELASTIC_RESTART_COUNT': '0',
}


def _facts(facts):
    return (
        facts.launcher,
        facts.rank,
        facts.world_size,
        facts.local_rank,
        facts.local_world_size,
        facts.node_rank,
        facts.num_nodes,
    )


def test_each_launcher_alone():
    assert _facts(launch_facts({})) == ('single', 0, 1, 0, 1, 0, 1)
    assert _facts(launch_facts(SLURM_STEP)) == ('slurm', 3, 4, 1, 2, 1, 2)
    assert _facts(launch_facts(OPENMPI)) == ('openmpi', 2, 4, 0, 2, 1, 2)
    assert _facts(launch_facts(HYDRA)) == ('mpich', 1, 2, 1, 2, 0, 1)
    assert _facts(launch_facts({'PMIX_RANK': '1', 'PMI_SIZE': '2'})) == ('pmix', 1, 2, 0, 1, 1, 2)
    assert _facts(launch_facts(TORCHRUN)) == ('torchrun', 5, 8, 1, 4, 1, 2)
    assert _facts(launch_facts({'RANK': '1', 'WORLD_SIZE': '2'})) == ('env', 1, 2, 0, 1, 1, 2)


def test_torchrun_wins_over_slurm_and_slurm_over_mpi():
    # srun --ntasks-per-node=1 torchrun --nproc-per-node=4: SLURM sees task 1 of 2; torchrun's ranks win.
    srun_torchrun = dict(
        SLURM_STEP,
        SLURM_PROCID='1',
        SLURM_LOCALID='0',
        SLURM_NTASKS='2',
        SLURM_STEP_NUM_TASKS='2',
        SLURM_STEP_TASKS_PER_NODE='1(x2)',
        **TORCHRUN,
    )
    facts = launch_facts(srun_torchrun)
    assert _facts(facts) == ('torchrun', 5, 8, 1, 4, 1, 2)
    assert facts.run_id == 'torchrun:job9'
    # srun --mpi=pmix exports both: SLURM's are read.
    assert _facts(launch_facts(dict(OPENMPI, **SLURM_STEP))) == ('slurm', 3, 4, 1, 2, 1, 2)
    assert _facts(launch_facts(dict(HYDRA, **OPENMPI))) == ('openmpi', 2, 4, 0, 2, 1, 2)


def test_run_names_from_jobs():
    assert launch_facts(SLURM_STEP).run_name == 'slurm-4242-0'
    # every task of the step has the same name, whatever its rank
    assert (
        launch_facts(dict(SLURM_STEP, SLURM_PROCID='0', SLURM_LOCALID='0', SLURM_NODEID='0')).run_name == 'slurm-4242-0'
    )
    assert launch_facts(dict(SLURM_STEP, SLURM_STEP_ID='1')).run_name == 'slurm-4242-1'
    assert launch_facts(OPENMPI).run_name.startswith('mpi-')
    assert launch_facts(HYDRA).run_name is None  # Hydra shares no job id: the Logger agrees on one
    # torchrun --standalone in a SLURM step whose run id is 'none': the SLURM job names it.
    facts = launch_facts(dict(SLURM_STEP, RANK='0', WORLD_SIZE='2', TORCHELASTIC_RUN_ID='none'))
    assert (facts.launcher, facts.run_name) == ('torchrun', 'slurm-4242-0')


def test_sbatch_batch_script_is_one_process():
    batch = {k: v for k, v in SLURM_STEP.items() if not k.startswith('SLURM_STEP')}
    facts = launch_facts(dict(batch, SLURM_PROCID='0'))
    assert _facts(facts) == ('slurm', 0, 1, 0, 1, 0, 1)
    assert facts.run_name == 'slurm-4242-batch'


def test_helper_exported_variables_keep_the_launcher_name():
    # What init_process_group_from_env exports under srun agrees with SLURM: still 'slurm'.
    env = dict(SLURM_STEP, RANK='3', WORLD_SIZE='4', LOCAL_RANK='1', LOCAL_WORLD_SIZE='2', GROUP_RANK='1')
    assert _facts(launch_facts(env)) == ('slurm', 3, 4, 1, 2, 1, 2)
    # A RANK that disagrees with SLURM is somebody else's: torch's variables win, named 'env'.
    assert launch_facts(dict(env, RANK='0')).launcher == 'env'


def test_attempts():
    assert launch_facts({}).attempt == '0'
    assert launch_facts(dict(TORCHRUN, TORCHELASTIC_RESTART_COUNT='2')).attempt == '2'
    assert launch_facts(dict(SLURM_STEP, SLURM_RESTART_COUNT='1')).attempt == '1'
    assert launch_facts(dict(TORCHRUN, TORCHELASTIC_RESTART_COUNT='2', SLURM_RESTART_COUNT='1')).attempt == '1.2'


@pytest.mark.parametrize(
    'env, message',
    [
        (dict(SLURM_STEP, SLURM_PROCID='x'), "SLURM_PROCID='x'"),
        (dict(SLURM_STEP, SLURM_PROCID='4'), 'rank 4 is outside a world of 4'),
        ({'OMPI_COMM_WORLD_RANK': '1'}, 'OMPI_COMM_WORLD_SIZE is not'),
        ({'PMIX_RANK': '1'}, 'PMIX_RANK=1 is set but no world size'),
        (dict(SLURM_STEP, SLURM_STEP_TASKS_PER_NODE='2(y2)'), "'2\\(y2\\)'"),
    ],
)
def test_bad_launcher_variables_are_named(env, message):
    with pytest.raises(ValueError, match=message):
        launch_facts(env)


def test_getters_read_slurm(monkeypatch):
    for key, value in SLURM_STEP.items():
        monkeypatch.setenv(key, value)
    assert (
        dist.launcher(),
        dist.get_global_rank(),
        dist.get_local_rank(),
        dist.get_world_size(),
        dist.get_local_world_size(),
        dist.get_node_rank(),
        dist.get_num_nodes(),
    ) == ('slurm', 3, 1, 4, 2, 1, 2)


def test_tasks_per_node():
    assert parse_tasks_per_node('2(x3),1') == [2, 2, 2, 1]
    assert parse_tasks_per_node('4') == [4]
    # uneven nodes: the second node runs one task
    env = dict(
        SLURM_STEP,
        SLURM_PROCID='2',
        SLURM_LOCALID='0',
        SLURM_NODEID='1',
        SLURM_NTASKS='3',
        SLURM_STEP_NUM_TASKS='3',
        SLURM_STEP_TASKS_PER_NODE='2,1',
    )
    assert _facts(launch_facts(env)) == ('slurm', 2, 3, 0, 1, 1, 2)


HOSTLISTS = {
    'vm': ['vm'],
    'gpu[01-03,07],cpu5': ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'cpu5'],
    'r[1-2]n[01-02]': ['r1n01', 'r1n02', 'r2n01', 'r2n02'],
    'a[9-11]': ['a9', 'a10', 'a11'],
    'a[08-11]': ['a08', 'a09', 'a10', 'a11'],
    'n[001-003,010],x,y[5]': ['n001', 'n002', 'n003', 'n010', 'x', 'y5'],
    'node-[1,3],node-10': ['node-1', 'node-3', 'node-10'],
}


@pytest.mark.parametrize('hostlist', sorted(HOSTLISTS))
def test_expand_hostlist(hostlist):
    assert expand_hostlist(hostlist) == HOSTLISTS[hostlist]


@pytest.mark.skipif(shutil.which('scontrol') is None, reason='scontrol not installed (Debian package slurm-client)')
def test_expand_hostlist_matches_scontrol(tmp_path):
    # scontrol expands host lists locally; it only needs a readable config file.
    conf = tmp_path / 'slurm.conf'
    conf.write_text('ClusterName=x\nSlurmctldHost=localhost\n')
    env = {'PATH': '/usr/bin:/bin', 'SLURM_CONF': str(conf)}
    for hostlist, expected in HOSTLISTS.items():
        out = subprocess.run(
            ['scontrol', 'show', 'hostnames', hostlist], capture_output=True, text=True, env=env, timeout=30
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == expected == expand_hostlist(hostlist)


@pytest.mark.parametrize('bad', ['a[1-2', 'a]1[', 'a[2-1]', 'a[x]', 'a[[1]]', 'a,,b'])
def test_expand_hostlist_rejects(bad):
    with pytest.raises(ValueError, match='host list'):
        expand_hostlist(bad)


def test_rendezvous_address_rules(monkeypatch):
    facts = launch_facts(dict(SLURM_STEP, SLURM_STEP_NODELIST='gpu[07-08]'))
    addr, port = dist._rendezvous_address(facts, dict(SLURM_STEP, SLURM_STEP_NODELIST='gpu[07-08]'))
    assert addr == 'gpu07' and 20000 <= int(port) < 32768  # below Linux's ephemeral ports
    # the same port on every task of the step, another for the next step
    assert dist._rendezvous_address(launch_facts(dict(SLURM_STEP, SLURM_PROCID='0')), SLURM_STEP)[1] == port
    other = dict(SLURM_STEP, SLURM_STEP_ID='1')
    assert dist._rendezvous_address(launch_facts(other), other)[1] != port
    assert dist._rendezvous_address(facts, dict(SLURM_STEP, MASTER_PORT='1234', MASTER_ADDR='h')) == ('h', '1234')
    # MPI on one node: loopback; on two nodes without MASTER_ADDR: a clear error
    assert dist._rendezvous_address(launch_facts(HYDRA), HYDRA)[0] == '127.0.0.1'
    with pytest.raises(ValueError, match='export MASTER_ADDR'):
        dist._rendezvous_address(launch_facts(OPENMPI), OPENMPI)
    no_id = dict(HYDRA)
    del no_id['PMI_PORT']
    with pytest.raises(ValueError, match='export MASTER_PORT'):
        dist._rendezvous_address(launch_facts(no_id), no_id)


def test_init_process_group_from_env_single_process(monkeypatch):
    import torch.distributed as torch_dist

    with pytest.raises(ValueError, match='timeout'):
        dist.init_process_group_from_env(timeout=0)
    facts = dist.init_process_group_from_env(timeout=60)
    try:
        assert facts.launcher == 'single' and torch_dist.get_backend() == 'gloo'
        assert torch_dist.get_world_size() == 1
        with pytest.raises(RuntimeError, match='initialized already'):
            dist.init_process_group_from_env()
    finally:
        torch_dist.destroy_process_group()


def test_every_variable_read_is_in_the_cache_key():
    # dist.launch_facts() caches on ENVIRONMENT_VARIABLES' values: a variable read but not listed would be stale.
    from dist_logging._world.launchers import ENVIRONMENT_VARIABLES

    class Recording(dict):
        def get(self, key, default=None):
            read.add(key)
            return super().get(key, default)

    read: set = set()
    for env in (
        SLURM_STEP,
        OPENMPI,
        HYDRA,
        TORCHRUN,
        {'PMIX_RANK': '0', 'PMI_SIZE': '1'},
        {},
        dict(SLURM_STEP, RANK='3', WORLD_SIZE='4'),
        dict(OPENMPI, RANK='2', WORLD_SIZE='4'),
    ):
        launch_facts(Recording(env))
    assert read <= set(ENVIRONMENT_VARIABLES), read - set(ENVIRONMENT_VARIABLES)


def test_getters_see_a_changed_environment(monkeypatch):
    assert dist.get_global_rank() == 0
    monkeypatch.setenv('RANK', '3')
    monkeypatch.setenv('WORLD_SIZE', '4')
    assert (dist.get_global_rank(), dist.launcher()) == (3, 'env')
    monkeypatch.setenv('RANK', '2')
    assert dist.get_global_rank() == 2


def test_the_public_face_exports_exactly_the_rooms_names():
    """dist.__all__ is built from the rooms' own __all__ (facts, ending) plus LoggingGroup: each name once, each
    the room's object, and a star import brings exactly them."""
    from dist_logging._world import ending, facts, group

    assert sorted(dist.__all__) == sorted({*facts.__all__, *ending.__all__, 'LoggingGroup'})
    assert len(dist.__all__) == len(set(dist.__all__))
    for name in dist.__all__:
        room = facts if name in facts.__all__ else ending if name in ending.__all__ else group
        assert getattr(dist, name) is getattr(room, name), name
    namespace: dict = {}
    exec('from dist_logging.dist import *', namespace)
    assert sorted(k for k in namespace if k != '__builtins__') == sorted(dist.__all__)
