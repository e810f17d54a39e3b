"""numba's kernels beside OpenBLAS's threads: a plan whose large products split over numba's threads runs with
OpenBLAS on one thread (nnc.executor.one_thread_pool); a plan that calls multi-threaded BLAS itself (a large batched
np.matmul) runs its numba kernels on one thread (serial_numba_kernels); each restores the caller's thread counts
after every run; other plans keep numba's threads."""
import copy

import numba
import numpy as np
import pytest

import nnc
import runtime
from nnc.codegen import cblas
from nnc.executor import KernelStep, one_thread_pool
from runtime import nn

from helpers import run_in_threads

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


def _pools_seen(monkeypatch):
    """(numba's thread count, OpenBLAS's) as each kernel step starts, recorded while the patch is on."""
    seen = []
    run = KernelStep.run

    def recording(step, env, buffers):
        seen.append((numba.get_num_threads(), cblas.blas_threads()))
        return run(step, env, buffers)

    monkeypatch.setattr(KernelStep, "run", recording)
    return seen


needs_thread_count = pytest.mark.skipif(not cblas.THREADS_SETTABLE, reason="OpenBLAS's thread count is not settable")


@needs_thread_count
def test_large_products_run_on_numbas_threads_with_openblas_on_one(monkeypatch):
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64))  # batch 256: large products
    compiled = nnc.compile(model, whole_graph=False)  # kernel by kernel: steps to watch
    x = runtime.randn(256, 256)
    with runtime.no_grad():
        want = model(x)
        compiled(x)
        assert [(p.one_pool, p.serial_numba) for p in _plans(compiled)] == [(True, False)]
        numba_before, blas_before = numba.get_num_threads(), cblas.blas_threads()
        seen = _pools_seen(monkeypatch)
        got = compiled(x)
    assert seen and set(seen) == {(numba_before, 1)}
    assert (numba.get_num_threads(), cblas.blas_threads()) == (numba_before, blas_before)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_a_plan_calling_threaded_blas_runs_numba_kernels_serially_and_restores_the_count(monkeypatch):
    class Batched(nn.Module):
        def forward(self, x, y):
            return runtime.relu(x @ y) * 2.0

    # 2^21 multiply-adds per product, two batch dims: np.matmul on OpenBLAS's threads
    x, y = runtime.randn(2, 2, 128, 128), runtime.randn(2, 2, 128, 128)
    compiled = nnc.compile(Batched(), whole_graph=False)
    with runtime.no_grad():
        want = Batched()(x, y)
        compiled(x, y)
        assert [(p.one_pool, p.serial_numba) for p in _plans(compiled)] == [(False, True)]
        before = numba.get_num_threads()
        seen = _threads_seen(monkeypatch)
        got = compiled(x, y)
    assert seen and set(seen) == {1}
    assert numba.get_num_threads() == before
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


@needs_thread_count
@pytest.mark.parametrize("dtype", [runtime.float32, runtime.float64])
def test_a_batch_of_products_spreads_over_numbas_threads(monkeypatch, dtype):
    """One batch dim (Winograd's tile products): the batch's products run as one cblas.dot_batch_threaded call."""
    class Batched(nn.Module):
        def forward(self, x, y):
            return runtime.relu(x @ y.transpose(1, 2)) * 2.0

    x, y = runtime.randn(6, 64, 48, dtype=dtype), runtime.randn(6, 80, 48, dtype=dtype)
    compiled = nnc.compile(Batched(), whole_graph=False)
    with runtime.no_grad():
        want = Batched()(x, y)
        compiled(x, y)
        (plan,) = _plans(compiled)
        assert (plan.one_pool, plan.serial_numba) == (True, False)
        assert any("dot_batch_threaded_f" in k.meta["source"] for k in plan.kernels)
        seen = _pools_seen(monkeypatch)
        got = compiled(x, y)
    assert seen and {blas for _, blas in seen} == {1}
    tol = 1e-4 if dtype is runtime.float32 else 1e-12
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=tol, atol=tol)


@needs_thread_count
def test_training_on_one_pool_matches_eager_from_two_threads():
    """Forward and backward plans on numba's threads with OpenBLAS on one, run from two Python threads at once:
    the gradients are eager's and OpenBLAS's thread count is the caller's again afterwards."""
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(192, 160), nn.Tanh(), nn.Linear(160, 96))
    xs = [runtime.randn(200, 192) for _ in range(2)]

    def grads(module, x):
        module.zero_grad()
        (module(x) ** 2).mean().backward()
        return [p.grad.numpy().copy() for p in module.parameters()]

    want = [grads(model, x) for x in xs]
    compiled = [nnc.compile(copy.deepcopy(model), whole_graph=False) for _ in xs]  # .grad is per module
    blas_before = cblas.blas_threads()
    results = {}

    def train(i):
        for _ in range(5):
            results[i] = grads(compiled[i], xs[i])

    run_in_threads(train, len(xs))
    assert [(p.one_pool, p.serial_numba) for c in compiled for p in _plans(c)] == [(True, False)] * 4
    assert cblas.blas_threads() == blas_before
    for i in range(len(xs)):
        for got, expected in zip(results[i], want[i]):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


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


@needs_thread_count
def test_one_thread_pool_nests_and_restores_openblas_after_the_last_exit():
    before = cblas.blas_threads()
    cblas.set_blas_threads(2)
    try:
        with pytest.raises(ValueError):
            with one_thread_pool():
                with one_thread_pool():
                    assert cblas.blas_threads() == 1
                assert cblas.blas_threads() == 1  # the outer run is still inside
                raise ValueError("a step failed")
        assert cblas.blas_threads() == 2
    finally:
        cblas.set_blas_threads(before)


def _whole_graph_blas_threads(monkeypatch):
    """OpenBLAS's thread count as each whole-graph call starts, recorded while the patch is on."""
    from nnc.codegen import whole_graph

    seen = []
    run = whole_graph.CompiledGraph.run

    def recording(compiled, arrays):
        seen.append(cblas.blas_threads())
        return run(compiled, arrays)

    monkeypatch.setattr(whole_graph.CompiledGraph, "run", recording)
    return seen


@needs_thread_count
@pytest.mark.parametrize("rows,width,hidden,large", [(64, 64, 192, False), (16, 1024, 512, True)])
def test_a_whole_graph_holds_openblas_to_one_thread_and_splits_large_products(monkeypatch, rows, width, hidden,
                                                                              large):
    """A GPT's batch-1 linears (64 rows, under a million multiply-adds) run on one OpenBLAS thread: its threads' join
    is what stalls beside busy processes. A product past SERIAL_BLAS_MAX_WORK splits over numba's threads, never
    OpenBLAS's: beside a parallel numba kernel two pools spin against each other."""
    from nnc.codegen.cpu import SERIAL_BLAS_MAX_WORK

    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)).eval()
    assert (rows * width * hidden >= SERIAL_BLAS_MAX_WORK) == large
    compiled, x = nnc.compile(model), runtime.randn(rows, width)
    before = cblas.blas_threads()
    cblas.set_blas_threads(2)
    try:
        with runtime.no_grad():
            want = model(x)
            compiled(x)
            plan = compiled.compilations[0].forward_plan
            assert plan.whole_graph and plan.serial_blas
            assert ("dot_threaded_f32(" in plan.steps[0].compiled.source) == large
            seen = _whole_graph_blas_threads(monkeypatch)
            for _ in range(2):  # the first fast-path hit, then its direct runner
                got = compiled(x)
        assert seen == [1] * 2
        assert cblas.blas_threads() == 2
    finally:
        cblas.set_blas_threads(before)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
