"""Whole-graph mode: a small no-grad forward runs as one numba function, computes what eager does, and falls back
to kernel-by-kernel execution (with a reason, and a warning when asked for or when compilation fails)."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import nnc
import runtime
from nnc.codegen import cache, cblas, cpu_matmul, whole_graph
from nnc.executor import Plan
from runtime import nn

import models


pytestmark = pytest.mark.usefixtures("fresh_kernel_cache")  # compile, not load a cache an earlier run left


def forward_plan(compiled) -> Plan:
    (artifact,) = compiled._cache.values()
    return artifact.forward_plan


def run_both(module, *inputs, whole_graph=None):
    """(eager result, compiled result, the compiled forward's Plan) under no_grad."""
    compiled = nnc.compile(copy.deepcopy(module), whole_graph=whole_graph)
    with runtime.no_grad():
        want, got = module(*inputs), compiled(*inputs)
    return want, got, forward_plan(compiled)


def assert_close(got, want, dtype=runtime.float32):
    tol = dict(rtol=1e-5, atol=1e-5) if dtype is runtime.float32 else dict(rtol=1e-10, atol=1e-10)
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_close(g, w, dtype)
        return
    assert tuple(got.shape) == tuple(want.shape) and got.dtype is want.dtype
    np.testing.assert_allclose(got.numpy(), want.numpy(), **tol)


def test_a_large_batch_1_linear_shares_its_weight_rows_with_the_helper_thread_not_openblas():
    """The MNIST CNN's fc1 at batch 1 (1 x 9216 by 128: past GEMV_BLAS_MIN_WORK) runs nnc.codegen.nowait's product
    in the whole graph, not OpenBLAS's gemv, whose two threads join after the product."""
    from nnc.codegen import nowait

    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    want, got, plan = run_both(model, runtime.randn(1, 9216))
    assert_close(got, want)
    assert plan.whole_graph and not plan.serial_blas
    source = plan.steps[0].compiled.source + "".join(plan.steps[0].compiled.kernel_sources.values())
    assert ("nowait_gemv(" in source) == nowait.AVAILABLE
    assert ("dot_f32(" in source) == (not nowait.AVAILABLE)


@pytest.mark.parametrize("dtype,batch", [(runtime.float32, 1), (runtime.float64, 3), (runtime.float32, 16)])
def test_mlp_forward_runs_as_one_numba_function(dtype, batch):
    runtime.manual_seed(0)
    model = models.MLP().to(dtype).eval()
    x = runtime.randn(batch, 784, dtype=dtype)
    want, got, plan = run_both(model, x)
    assert_close(got, want, dtype)
    if batch > cpu_matmul.FEW_ROWS and not (whole_graph._HAVE_SCIPY or cblas.AVAILABLE):  # BLAS inside numba
        assert not plan.whole_graph and "scipy" in plan.whole_graph_reason
        return
    assert plan.whole_graph and plan.whole_graph_reason == ""
    assert len(plan.steps) == 1 and plan.steps[0].kernels == plan.kernels
    assert "def run_graph(" in plan.steps[0].compiled.source
    assert got.grad_fn is None and not got.requires_grad


class Views(nn.Module):
    """Reshape, transpose and expand between kernels, a copy-reshape of a transposed value, several outputs (every
    matmul has at most 4 rows: generated loops, no BLAS)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 4)
        self.scale = nn.Parameter(runtime.randn(4))
        self.mix = nn.Parameter(runtime.randn(16, 5))

    def forward(self, x):
        h = self.proj(x).relu()                  # [1, 4, 4]
        t = h.transpose(1, 2)                    # not contiguous
        s = (t * 2.0).sum(dim=-1)                # [1, 4]
        e = self.scale.expand(2, 4).sum(0) + s   # a broadcast view feeding a kernel (a reduction: not folded)
        return e, t.reshape(4, 4) * 2.0, h.reshape(1, 16) @ self.mix


class WithGetitem(Views):
    def forward(self, x):
        e, flat, m = super().forward(x)
        return e, flat[:, INDEX, None], m        # an index tensor with None: an opaque node the function cannot hold


INDEX = runtime.tensor([1, 2])


class WithSlice(Views):
    def forward(self, x):
        e, flat, m = super().forward(x)
        # a basic getitem: numpy's strided view inside the function (flat is returned whole too, so the slice stays
        # below the ops computing it: nnc.passes.slices)
        return e, flat[1:, 1:4:2], m, flat


def test_views_between_kernels_fold_into_the_kernels_inside_the_function():
    """The transpose, expand and reshapes fold into the kernels reading them (nnc.passes.views): no view is left
    for run_graph to make (the reshape of the transposed [1, 4, 4] to [4, 4] is a view too)."""
    runtime.manual_seed(1)
    model = Views()
    x = runtime.randn(1, 4, 6)
    want, got, plan = run_both(model, x)
    assert plan.whole_graph, plan.whole_graph_reason
    assert_close(list(got), list(want))
    source = plan.steps[0].compiled.source
    assert "np.transpose(" not in source and "np.broadcast_to(" not in source
    assert sum(len(k.meta["views"]) for k in plan.kernels) >= 3
    assert [k.kind for k in plan.kernels] == ["matmul", "reduction", "reduction", "elementwise", "matmul"]


def test_an_opaque_node_keeps_the_graph_kernel_by_kernel_with_a_reason():
    runtime.manual_seed(2)
    model = WithGetitem()
    x = runtime.randn(1, 4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # automatic mode: no warning
        want, got, plan = run_both(model, x)
    assert not plan.whole_graph and "getitem" in plan.whole_graph_reason
    assert_close(list(got), list(want))
    with pytest.warns(RuntimeWarning, match="whole-graph mode is not available.*getitem"):
        _, got, plan = run_both(model, x, whole_graph=True)
    assert not plan.whole_graph
    assert_close(list(got), list(want))


def test_a_basic_getitem_output_is_a_strided_view_inside_the_function():
    runtime.manual_seed(2)
    want, got, plan = run_both(WithSlice(), runtime.randn(1, 4, 6))
    assert plan.whole_graph, plan.whole_graph_reason
    assert_close(list(got), list(want))
    assert "as_strided(" in plan.steps[0].compiled.source


def test_large_values_run_kernel_by_kernel():
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    x = runtime.randn(whole_graph.WHOLE_GRAPH_MAX_ELEMENTS // 8 + 1, 8)
    want, got, plan = run_both(model, x)
    assert not plan.whole_graph and "elements" in plan.whole_graph_reason
    assert_close(got, want)


def test_many_kernels_run_kernel_by_kernel_unless_asked_for(monkeypatch):
    """Past WHOLE_GRAPH_MAX_KERNELS a forward runs kernel by kernel (one numba function would compile longer than it
    saves) and says so; whole_graph=True still gets one function."""
    monkeypatch.setattr(whole_graph, "WHOLE_GRAPH_MAX_KERNELS", 2)
    model = models.MLP().eval()  # three matmul kernels
    x = runtime.randn(2, 784)
    want, got, plan = run_both(model, x)
    assert len(plan.kernels) == 3 and not plan.whole_graph and "3 kernels (> 2" in plan.whole_graph_reason
    assert_close(got, want)
    want, got, plan = run_both(model, x, whole_graph=True)
    assert plan.whole_graph
    assert_close(got, want)


class Unrolled(nn.Module):
    """The same layer applied four times: an unrolled loop's repeating kernels."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        for _ in range(4):
            x = self.fc(x).tanh()
        return x


def test_repeating_kernels_run_kernel_by_kernel_unless_asked_for(monkeypatch):
    """One numba function compiles every repeat of a kernel (an unrolled loop), kernel by kernel compiles it once:
    past WHOLE_GRAPH_FEW kernels repeating more than WHOLE_GRAPH_MAX_REPEATS times on average, a forward runs kernel
    by kernel and says why; whole_graph=True still gets one function."""
    monkeypatch.setattr(whole_graph, "WHOLE_GRAPH_FEW", 2)
    monkeypatch.setattr(whole_graph, "WHOLE_GRAPH_MAX_REPEATS", 2)
    x = runtime.randn(3, 6)
    want, got, plan = run_both(Unrolled().eval(), x)
    assert not plan.whole_graph and "repeat 1 distinct" in plan.whole_graph_reason, plan.whole_graph_reason
    assert_close(got, want)
    want, got, plan = run_both(Unrolled().eval(), x, whole_graph=True)
    assert plan.whole_graph
    assert_close(got, want)


def test_whole_graph_off_runs_kernel_by_kernel():
    model = models.MLP().eval()
    want, got, plan = run_both(model, runtime.randn(2, 784), whole_graph=False)
    assert not plan.whole_graph and len(plan.steps) == len(plan.kernels)
    assert_close(got, want)


class ReturnsInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x).sigmoid()
        return x, y, self.fc.weight, y, {"again": y * 2.0}


def test_outputs_that_are_inputs_parameters_or_repeated():
    model = ReturnsInputs()
    x = runtime.randn(3, 4)
    compiled = nnc.compile(model)
    with runtime.no_grad():
        want, got = model(x), compiled(x)
    plan = forward_plan(compiled)
    assert plan.whole_graph, plan.whole_graph_reason
    assert got[0] is x and got[2] is model.fc.weight
    assert_close(got[1], want[1])
    assert_close(got[3], want[3])
    assert_close(got[4]["again"], want[4]["again"])


def test_non_contiguous_and_read_only_inputs_are_copied_not_misread():
    model = models.MLP().eval()
    compiled = nnc.compile(copy.deepcopy(model))
    x = runtime.randn(784, 2)
    with runtime.no_grad():
        compiled(x.t().contiguous())  # compile for [2, 784]
        assert forward_plan(compiled).whole_graph
        strided = x.t()               # same shape, not C-contiguous
        assert_close(compiled(strided), model(strided))
        frozen = np.ascontiguousarray(x.t().numpy())
        frozen.flags.writeable = False
        t = runtime.from_numpy(frozen) if hasattr(runtime, "from_numpy") else runtime.tensor(frozen)
        assert_close(compiled(t), model(t))


def test_a_parameter_rebound_to_another_shape_is_a_clear_error():
    """New data of another shape in the same parameter is refused by name before the whole-graph function reads it;
    a new parameter object compiles anew (the module-tree guard), which fails as eager does."""
    model = nn.Linear(4, 3)
    compiled = nnc.compile(model)
    x = runtime.randn(2, 4)
    with runtime.no_grad():
        compiled(x)
        assert forward_plan(compiled).whole_graph
        model.weight.data = runtime.randn(5, 4)
        with pytest.raises(ValueError, match="weight.*float32\\[3, 4\\]"):
            compiled(x)
        model.weight = nn.Parameter(runtime.randn(5, 4))
        with pytest.raises(RuntimeError, match="size of tensor a \\(5\\) must match"), \
                pytest.warns(RuntimeWarning, match="could not compile"):
            compiled(x)


def test_a_failed_whole_graph_compile_warns_and_runs_kernel_by_kernel(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated numba failure")

    monkeypatch.setattr(whole_graph, "compile_graph", broken)
    model = models.MLP().eval()
    with pytest.warns(RuntimeWarning, match="whole-graph compilation of MLP failed.*simulated numba failure"):
        want, got, plan = run_both(model, runtime.randn(1, 784))
    assert not plan.whole_graph and len(plan.steps) == len(plan.kernels)
    assert_close(got, want)


def test_a_second_load_comes_from_the_disk_cache():
    model = nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Linear(7, 2))
    x = runtime.randn(1, 5)
    _, _, first = run_both(model, x)
    assert first.whole_graph
    cache.forget()  # as a new process would: import the files again, load the machine code from numba's cache
    want, got, second = run_both(model, x)
    assert second.whole_graph and second.cache_hits == 1
    assert second.steps[0].compiled.cache_hit
    assert_close(got, want)


def test_hooked_submodules_stay_calls_and_their_hooks_fire():
    model = models.MLP().eval()
    seen = []
    model.fc2.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    want, got, plan = run_both(model, runtime.randn(1, 784))
    assert not plan.whole_graph and "fc2" in plan.whole_graph_reason
    assert seen == [(1, 512), (1, 512)]  # the eager run and the compiled run
    assert_close(got, want)


def test_explain_says_whether_the_forward_runs_whole():
    report = nnc.explain(models.MLP(), runtime.randn(1, 784))
    assert report.whole_graph and "whole-graph mode" in str(report)
    assert all(k.generated for k in report.kernels) and all(k.source for k in report.kernels)
    report = nnc.explain(models.MLP(), runtime.randn(1, 784), backward=True)
    assert not report.whole_graph and "kernel by kernel" in str(report)


def test_without_scipy_a_blas_matmul_calls_numpys_openblas(monkeypatch):
    if not cblas.AVAILABLE:
        pytest.skip("numpy's OpenBLAS symbols were not found (a numpy built with another BLAS)")
    monkeypatch.setattr(whole_graph, "_HAVE_SCIPY", False)  # numba's np.dot needs scipy, which nnc does not require
    runtime.manual_seed(0)
    model = models.MLP().eval()
    for batch in (cpu_matmul.FEW_ROWS + 4, 1):
        want, got, plan = run_both(model, runtime.randn(batch, 784))
        assert plan.whole_graph, plan.whole_graph_reason
        assert ("dot_f32(" in plan.steps[0].compiled.source) == (batch > cpu_matmul.FEW_ROWS)
        assert "np.dot(" not in plan.steps[0].compiled.source
        assert_close(got, want)


def test_without_scipy_or_cblas_a_blas_matmul_keeps_the_graph_kernel_by_kernel(monkeypatch):
    monkeypatch.setattr(whole_graph, "_HAVE_SCIPY", False)  # numba's np.dot needs scipy, which nnc does not require
    monkeypatch.setattr(cblas, "AVAILABLE", False)
    model = models.MLP().eval()
    want, got, plan = run_both(model, runtime.randn(cpu_matmul.FEW_ROWS + 4, 784))
    assert not plan.whole_graph and "scipy" in plan.whole_graph_reason
    assert_close(got, want)
    want, got, plan = run_both(model, runtime.randn(1, 784))  # generated matmul loops: no BLAS, no scipy
    assert plan.whole_graph
    assert_close(got, want)
