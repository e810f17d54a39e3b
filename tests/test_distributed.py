"""runtime.distributed and DistributedDataParallel on 2 MPI ranks: each test runs a script of tests/mpi_workers under
`mpiexec -n 2` with a timeout and checks that every rank reported OK. They skip, saying why, only when mpi4py cannot
start MPI here (no mpi4py, no mpiexec, or a launch that fails); CI installs mpi4py and mpich, so there they run."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

import pytest

WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_workers")
RANKS = 2
TIMEOUT = 300  # seconds for one launch: generous (compiling kernels on 2 cores), and a hang still ends


def mpiexec() -> list | None:
    """The launcher next to this Python (the mpich wheel installs it there), else the one on PATH."""
    for candidate in (os.path.join(os.path.dirname(sys.executable), "mpiexec"), shutil.which("mpiexec")):
        if candidate and os.path.exists(candidate):
            version = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=60).stdout
            if "Open MPI" in version or "OpenRTE" in version:
                return [candidate, "--oversubscribe", "--allow-run-as-root"]
            return [candidate]
    return None


@functools.lru_cache(maxsize=None)
def why_mpi_cannot_start() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install -e '.[distributed]')"
    launcher = mpiexec()
    if launcher is None:
        return "no mpiexec found (pip install mpich)"
    probe = ("from mpi4py import MPI; c = MPI.COMM_WORLD; c.Barrier(); size = c.allreduce(1)\n"
             "if c.Get_rank() == 0: print('up', size)")
    try:
        result = subprocess.run(launcher + ["-n", str(RANKS), sys.executable, "-c", probe], capture_output=True,
                                text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "mpiexec did not start 2 ranks within 120 s"
    if result.returncode != 0 or f"up {RANKS}" not in result.stdout:
        return f"mpi4py could not start MPI with mpiexec: {(result.stderr or result.stdout).strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    reason = why_mpi_cannot_start()
    if reason:
        pytest.skip(reason)
    cache = tmp_path_factory.mktemp("nnc_kernels_of_the_ranks")

    def run(script: str, *args: str, expect_ok: bool = True) -> subprocess.CompletedProcess:
        env = dict(os.environ, NNC_TEST_CACHE=str(cache), PYTHONUNBUFFERED="1")
        command = mpiexec() + ["-n", str(RANKS), sys.executable, os.path.join(WORKERS, script), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)
        if expect_ok:
            assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"
            assert result.stdout.count("OK ") == RANKS, result.stdout + result.stderr  # (ranks' lines may interleave)
        return result
    return run


def test_collectives_match_numpy_for_every_dtype_and_op(launch):
    launch("collectives.py")


@pytest.mark.parametrize("model", ["mlp", "cnn"])
@pytest.mark.parametrize("mode", ["eager", "ddp_of_compiled", "compiled_ddp"])
def test_ddp_equals_single_process_on_the_whole_batch(launch, model, mode):
    launch("ddp_equivalence.py", model, mode)


@pytest.mark.parametrize("progress", ["hooks", "thread"])
def test_ddp_equals_single_process_whichever_way_mpi_progresses(launch, progress):
    launch("ddp_equivalence.py", "mlp", "eager", progress)


def test_sync_batchnorm_under_ddp_equals_batchnorm_on_the_whole_batch(launch):
    launch("sync_batchnorm.py")


def test_ddp_join_trains_on_uneven_inputs(launch):
    launch("ddp_join.py")


def test_ddp_no_sync_unused_parameters_buffers_and_errors(launch):
    launch("ddp_features.py")


def test_a_rank_that_raises_in_a_ddp_step_aborts_the_job_instead_of_hanging(launch):
    result = launch("raise_in_step.py", expect_ok=False)  # a hang would end in TimeoutExpired, failing the test
    assert result.returncode != 0
    assert "rank 1 fails in its forward" in result.stderr
    assert "MPI.COMM_WORLD.Abort" in result.stderr
    assert "UNREACHABLE" not in result.stdout


def test_torch_names_without_a_process_group():
    import runtime
    import runtime.distributed as dist

    assert dist.is_available() in (True, False) and not dist.is_initialized()
    assert [op.name for op in dist.ReduceOp] == ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
    for call in (dist.get_rank, dist.get_world_size, dist.barrier, dist.new_group):
        with pytest.raises(ValueError, match="init_process_group"):
            call()
    with pytest.raises(ValueError, match="init_process_group"):
        runtime.nn.parallel.DistributedDataParallel(runtime.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="backend"):
        dist.init_process_group("nccl")


def test_train_ddp_example_runs_on_two_ranks(launch):
    example = os.path.join(os.path.dirname(WORKERS), os.pardir, "examples", "train_ddp.py")
    result = launch(os.path.abspath(example), "--epochs", "2", expect_ok=False)
    assert result.returncode == 0, result.stdout + result.stderr
    losses = [float(line.split("mean loss ")[1].split()[0]) for line in result.stdout.splitlines() if "epoch" in line]
    assert len(losses) == 2 and losses[1] < losses[0]  # one line per epoch from rank 0 only, and it learns


def test_futures_chain_and_collect_as_torch():
    import runtime

    fut = runtime.futures.Future()
    assert not fut.done()
    with pytest.raises(RuntimeError, match="before the future completed"):
        fut.value()
    doubled = fut.then(lambda f: f.value() * 2)
    seen = []
    fut.add_done_callback(lambda f: seen.append(f.value()))
    fut.set_result(21)
    assert fut.done() and seen == [21] and doubled.wait() == 42 and doubled.value() == 42
    both = runtime.futures.collect_all([fut, doubled])
    assert [f.value() for f in both.wait()] == [21, 42]
    failing = fut.then(lambda f: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.wait()
