"""numba's kernels beside OpenBLAS's threads (nnc.executor.serial_numba_kernels): a plan that calls multi-threaded
BLAS runs its numba kernels on one thread, restoring the caller's thread count after every run; other plans keep
numba's threads."""
import numba
import numpy as np
import pytest

import nnc
import runtime
from nnc.executor import KernelStep
from runtime import nn

pytestmark = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs numba with 2 or more threads")


def _plans(compiled):
    return [p for c in compiled.compilations for p in c.plans]


def _threads_seen(monkeypatch):
    """numba.get_num_threads() as each kernel step starts, recorded while the patch is on."""
    seen = []
    run = KernelStep.run

    def recording(step, env, buffers):
        seen.append(numba.get_num_threads())
        return run(step, env, buffers)

    monkeypatch.setattr(KernelStep, "run", recording)
    return seen


def test_a_plan_calling_blas_runs_numba_kernels_serially_and_restores_the_count(monkeypatch):
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64))  # batch 256: BLAS products
    compiled = nnc.compile(model, whole_graph=False)  # kernel by kernel: steps to watch
    x = runtime.randn(256, 256)
    with runtime.no_grad():
        want = model(x)
        compiled(x)
        assert [p.serial_numba for p in _plans(compiled)] == [True]
        before = numba.get_num_threads()
        seen = _threads_seen(monkeypatch)
        got = compiled(x)
    assert seen and set(seen) == {1}
    assert numba.get_num_threads() == before
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_plans_without_blas_keep_numbas_threads(monkeypatch):
    class Chain(nn.Module):
        def forward(self, x):
            return runtime.relu(x * 2.0 + 1.0).sum(-1)

    compiled = nnc.compile(Chain(), whole_graph=False)
    x = runtime.randn(64, 32)
    with runtime.no_grad():
        compiled(x)
        assert [p.serial_numba for p in _plans(compiled)] == [False]
        seen = _threads_seen(monkeypatch)
        compiled(x)
    assert seen and set(seen) == {numba.get_num_threads()} and seen[0] > 1


def test_an_error_inside_a_serial_run_restores_the_thread_count():
    from nnc.executor import serial_numba_kernels

    before = numba.get_num_threads()
    with pytest.raises(ValueError):
        with serial_numba_kernels():
            assert numba.get_num_threads() == 1
            raise ValueError("a step failed")
    assert numba.get_num_threads() == before
