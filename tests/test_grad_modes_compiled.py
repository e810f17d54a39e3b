"""Compiled == eager where forward changes grad mode (no_grad blocks) or calls a custom autograd.Function."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import nnc
import runtime
from runtime import nn


class Square(runtime.autograd.Function):
    """x * x with a deliberately different backward (3x, not 2x): only the custom rule gives these gradients."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * g


class ScaleShift(runtime.autograd.Function):
    """Two outputs and a non-tensor argument; the backward is the true one."""

    @staticmethod
    def forward(ctx, x, w, factor):
        ctx.save_for_backward(x, w)
        ctx.factor = factor
        return x * w * factor, x + w

    @staticmethod
    def backward(ctx, g_prod, g_sum):
        x, w = ctx.saved_tensors
        return g_prod * w * ctx.factor + g_sum, g_prod * x * ctx.factor + g_sum, None


class NoGradBranch(nn.Module):
    """A no_grad block's values join the output: gradients flow through the other branch only."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        with runtime.no_grad():
            frozen = self.lin(x).relu()
        return self.lin(x).tanh() * frozen + frozen.sum(-1, keepdim=True)


class NoGradDecorated(nn.Module):
    """no_grad as a decorator on a helper, and a tuple result (max over a dim) made there."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)

    @runtime.no_grad()
    def _scale(self, x):
        return x.abs().max(dim=-1, keepdim=True)

    def forward(self, x):
        y = self.lin(x)
        values, _ = self._scale(y)
        return y / (values + 1)


class EnableGradInside(nn.Module):
    """enable_grad inside no_grad turns recording back on for its block."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        with runtime.no_grad():
            stopped = self.lin(x)
            with runtime.enable_grad():
                live = self.lin(x).sigmoid()
        return stopped * live


class BufferUpdateUnderNoGrad(nn.Module):
    """An in-place update of a buffer under no_grad (a running mean kept in forward) compiles."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)
        self.register_buffer("running", runtime.zeros(5, dtype=runtime.float64))

    def forward(self, x):
        y = self.lin(x)
        with runtime.no_grad():
            self.running.mul_(0.9).add_(0.1 * y.mean(0))
        return y - self.running


class InPlaceOnLiveValue(nn.Module):
    """An in-place write under no_grad to a value with history: eager keeps the history, so this is a graph break."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(5, 5)
        self.outer = nn.Linear(5, 5)

    def forward(self, x):
        y = self.inner(x)
        with runtime.no_grad():
            y.mul_(2)
        return self.outer(y.tanh())


class CustomSquare(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        return Square.apply(self.lin(x)).sin()


class CustomTwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)
        self.w = nn.Parameter(runtime.randn(5, dtype=runtime.float64))

    def forward(self, x):
        prod, total = ScaleShift.apply(self.lin(x), self.w, 0.5)
        return prod.tanh() + total


MODELS = [NoGradBranch, NoGradDecorated, EnableGradInside, BufferUpdateUnderNoGrad, InPlaceOnLiveValue,
          CustomSquare, CustomTwoOutputs]


def _grads(model, x, out):
    seed = runtime.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * seed).sum().backward()
    return [x.grad.numpy().copy()] + [p.grad.numpy().copy() if p.grad is not None else None
                                      for p in model.parameters()]


@pytest.mark.parametrize("make", MODELS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("rows", [0, 1, 3])
def test_compiled_matches_eager_forward_and_backward(make, rows):
    runtime.manual_seed(0)
    eager = make().double()
    compiled_model = copy.deepcopy(eager)
    compiled = nnc.compile(compiled_model)
    x = runtime.randn(rows, 5, dtype=runtime.float64)
    for _ in range(2):  # twice: the buffer-updating model changes its state on every call
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # falling back to eager for the whole model would warn
            got = compiled(xc)
        want = eager(xe)
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
        for g, w in zip(_grads(compiled_model, xc, got), _grads(eager, xe, want)):
            assert (g is None) == (w is None)
            if w is not None:
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
        for b_got, b_want in zip(compiled_model.buffers(), eager.buffers()):
            np.testing.assert_allclose(b_got.numpy(), b_want.numpy(), rtol=1e-12, atol=1e-15)
        eager.zero_grad()
        compiled_model.zero_grad()


@pytest.mark.parametrize("make", [CustomSquare, CustomTwoOutputs, NoGradBranch], ids=lambda m: m.__name__)
def test_inference_compiles_the_custom_function_and_no_grad_blocks_whole(make):
    runtime.manual_seed(1)
    model = make().double()
    compiled = nnc.compile(model)
    x = runtime.randn(4, 5, dtype=runtime.float64)
    with runtime.no_grad():
        got = compiled(x)
        want = model(x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
    (artifact,) = compiled._cache.values()
    assert not artifact.opaque  # no eager call: the Function's forward is part of the compiled graph


def test_custom_function_runs_eagerly_with_its_own_backward_when_training():
    model = CustomSquare().double()
    compiled = nnc.compile(model)
    compiled(runtime.randn(2, 5, dtype=runtime.float64)).sum().backward()
    (artifact,) = compiled._cache.values()
    reasons = [n.meta["opaque_reason"] for n in artifact.opaque]
    assert len(reasons) == 1 and "Square" in reasons[0] and "own backward" in reasons[0]


def test_in_place_write_to_a_live_value_under_no_grad_is_a_graph_break():
    compiled = nnc.compile(InPlaceOnLiveValue().double())
    compiled(runtime.randn(2, 5, dtype=runtime.float64))
    (artifact,) = compiled._cache.values()
    assert "under no_grad" in artifact.reason  # its forward runs eagerly, its linears compiled


def test_trace_marks_only_nodes_recorded_under_no_grad():
    graph = nnc.symbolic_trace(NoGradBranch()).graph
    marked = [n.name for n in graph.nodes if n.meta.get("no_grad")]
    unmarked = [n.name for n in graph.nodes if n.op == "call_module" and not n.meta.get("no_grad")]
    assert marked and unmarked  # the block's first linear and relu; the second linear outside it
    with runtime.no_grad():  # traced for inference: nothing needs marking
        graph = nnc.symbolic_trace(NoGradBranch()).graph
    assert not any(n.meta.get("no_grad") for n in graph.nodes)


@pytest.mark.parametrize("nested", [False, True], ids=["root", "in_sequential"])
def test_batchnorm_cumulative_average_compiles_and_matches_eager(nested):
    """momentum=None divides by num_batches_tracked right after incrementing it under no_grad: the root's trace
    keeps that buffer write, and a nested layer's replay reads the incremented count, not the stale one."""
    runtime.manual_seed(0)
    layer = nn.BatchNorm1d(4, momentum=None)
    eager = (nn.Sequential(layer, nn.Linear(4, 2)) if nested else layer).double()
    compiled_model = copy.deepcopy(eager)
    compiled = nnc.compile(compiled_model)
    bn = (lambda m: m[0]) if nested else (lambda m: m)
    for _ in range(3):
        x = runtime.randn(8, 4, dtype=runtime.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # compiled, not a fallback to eager
            (compiled(x) ** 2).sum().backward()
        (eager(x) ** 2).sum().backward()
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            np.testing.assert_allclose(getattr(bn(compiled_model), name).numpy(), getattr(bn(eager), name).numpy(),
                                       rtol=1e-12)
        for a, b in zip(compiled_model.parameters(), eager.parameters()):
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12)
