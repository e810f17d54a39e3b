"""Folded views (nnc.passes.views): reshape, permute, expand, squeeze/unsqueeze and basic slicing read through the
index arithmetic of the elementwise, reduction and matmul kernels that read them, never as steps of their own;
compiled forward and backward against eager in float64, the kernel counts of the transformer block, and the maps."""
from __future__ import annotations

import copy
import random

import numpy as np
import pytest

import nnc
import runtime as torch
from nnc.executor import InterpretedStep, ViewStep
from nnc.graph import Graph
from nnc.passes import propagate_shapes
from nnc.passes.fusion import fuse, verify
from nnc.passes.views import ViewMap, view_maps
from runtime import nn

from helpers import call

F64 = torch.float64


class Fn(nn.Module):
    """A module around a function of its inputs and two parameters (w [6, 4], v [4, 6])."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.randn(6, 4, dtype=F64))
        self.v = nn.Parameter(torch.randn(4, 6, dtype=F64))

    def forward(self, x):
        return self.fn(self, x)


class Fn2(Fn):
    def forward(self, x, y):
        return self.fn(self, x, y)


def views_folded(compiled) -> int:
    """How many folded views the compiled plans' kernels read; asserts no kernel fell back to the interpreter and
    no view ran as a step of its own unless the graph returns it or an opaque node (index_put) reads it."""
    count = 0
    for compilation in compiled.compilations:
        for plan in compilation.plans:
            assert plan.fallbacks == [], plan.fallbacks
            for kernel, step in zip(plan.kernels, plan.steps):
                if isinstance(step, ViewStep):  # only a view the graph returns or an opaque node reads stays a step
                    assert "it is a graph output" in kernel.reason or "cannot index a strided input" in kernel.reason
                    assert not any(kind in kernel.reason for kind in ("matmul", "sum", "mul"))
                count += len(kernel.meta.get("views", {}))
    return count


def assert_matches_eager(fn, *shapes, grad=True):
    """Compiled fn matches eager fn (forward and every gradient, float64 to 1e-12); returns the compiled module."""
    torch.manual_seed(0)
    model = (Fn if len(shapes) == 1 else Fn2)(fn)
    compiled = nnc.compile(copy.deepcopy(model))
    inputs = [torch.randn(*s, dtype=F64) for s in shapes]
    eager_in = [x.clone().requires_grad_(grad) for x in inputs]
    compiled_in = [x.clone().requires_grad_(grad) for x in inputs]
    want, got = model(*eager_in), compiled(*compiled_in)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    if grad:
        seed = torch.randn(*want.shape, dtype=F64)
        (want * seed).sum().backward()
        (got * seed).sum().backward()
        for a, b in zip(eager_in, compiled_in):
            np.testing.assert_allclose(b.grad.numpy(), a.grad.numpy(), rtol=1e-12, atol=1e-12)
        for name, p in model.named_parameters():
            q = dict(compiled.named_parameters())[name]
            if p.grad is None:
                assert q.grad is None or not q.grad.numpy().any()
            else:
                np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-12, atol=1e-12)
    return compiled


# -- one case per view kind and kernel kind ----------------------------------------------------------------------

CASES = {
    # elementwise kernels reading views
    "permute_into_elementwise": (lambda m, x: (x.permute(2, 0, 1) * 2).sin() * 1.5, [(3, 4, 5)]),
    "permute_reshape_chain": (lambda m, x: (x.exp().permute(1, 0, 2).reshape(4, 15) + 1).tanh(), [(3, 4, 5)]),
    "reshape_permute_chain": (lambda m, x: (x.exp().reshape(3, 2, 10).permute(2, 0, 1) * 3).cos(), [(3, 4, 5)]),
    "expand_stride_0": (lambda m, x, y: x.exp().unsqueeze(1).expand(4, 5, 6) * y, [(4, 6), (4, 5, 6)]),
    "strided_slice": (lambda m, x: x.exp()[:, 1::2] * 2 + x.exp()[:, ::2], [(5, 8)]),
    "slice_with_offset": (lambda m, x: (x.sin()[1:4, 2:7:3] * 3).exp(), [(6, 9)]),
    "int_index_and_none": (lambda m, x: (x.exp()[2, :, None] + x.sin()[0, None, :]) * 2, [(3, 7)]),
    "squeeze_unsqueeze": (lambda m, x: x.exp().unsqueeze(0).squeeze(2).unsqueeze(-1) * 2, [(4, 1, 6)]),
    "view_of_input": (lambda m, x: x.permute(1, 0) * 2 + 1, [(5, 7)]),
    "view_of_parameter": (lambda m, x: x * m.w.permute(1, 0)[:, 1:5] + m.v[:, 2:6], [(4, 4)]),
    # reductions reading views
    "sum_of_permuted": (lambda m, x: (x.exp().permute(2, 1, 0) * 2).sum(-1), [(3, 4, 5)]),
    "softmax_of_transposed": (lambda m, x: torch.softmax(x.exp().transpose(0, 1), dim=-1), [(6, 5)]),
    "amax_of_slice": (lambda m, x: (x.sin()[:, 1::2] * 2).amax(1) + x.sin()[::2].sum(0).sum(), [(6, 8)]),
    "layer_norm_of_permuted": (lambda m, x: torch.nn.functional.layer_norm(x.tanh().permute(1, 0, 2), (5,)),
                               [(3, 4, 5)]),
    # matmuls reading views
    "linear_of_parameter_slice": (lambda m, x: torch.nn.functional.linear(x, m.w[1:5]), [(3, 4)]),
    "matmul_transposed": (lambda m, x: x.exp() @ x.sin().transpose(0, 1), [(5, 7)]),
    "batched_matmul_permuted": (lambda m, q, k: q.exp().permute(0, 2, 1, 3) @ k.sin().permute(0, 2, 3, 1),
                                [(2, 5, 3, 4), (2, 5, 3, 4)]),
    "matmul_of_strided_slice": (lambda m, x: x.exp()[:, ::2] @ m.v.sin()[:, 1::2], [(6, 8)]),
    "matmul_epilogue_reads_view": (lambda m, x, b: (x @ m.w.transpose(0, 1)) + b.exp().transpose(0, 1),
                                   [(3, 4), (6, 3)]),
    "big_matmul_operands": (lambda m, x, y: (x.exp().transpose(0, 1) @ y.tanh()[:, 2:40]).sin(), [(64, 48),
                                                                                                   (64, 48)]),
    # attention in small
    "attention": (lambda m, x: torch.softmax((x @ m.w.transpose(0, 1)).reshape(2, 3, 2, 3).permute(0, 2, 1, 3)
                                             @ x.reshape(2, 3, 2, 2).permute(0, 2, 1, 3), dim=-1)
                  .permute(0, 2, 1, 3).reshape(6, 4), [(6, 4)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_views_fold_and_match_eager(name):
    fn, shapes = CASES[name]
    compiled = assert_matches_eager(fn, *shapes)
    assert views_folded(compiled) > 0


@pytest.mark.parametrize("shape", [(1, 5, 1), (3, 1, 4), (1, 1, 1)])
def test_size_one_dims(shape):
    fn = lambda m, x: (x.exp().permute(2, 1, 0) * 2).sum(0) + x.sin().reshape(-1).sum()  # noqa: E731
    compiled = assert_matches_eager(fn, shape)
    assert views_folded(compiled) > 0


def test_size_zero_dims_run_interpreted_with_their_views():
    fn = lambda m, x: (x.exp().permute(1, 0) * 2).sum(1)  # noqa: E731
    compiled = assert_matches_eager(fn, (0, 4))
    steps = [s for c in compiled.compilations for p in c.plans for s in p.steps]
    assert any(isinstance(s, InterpretedStep) and s.views for s in steps)


def test_float32_attention_block_matches_eager():
    torch.manual_seed(1)
    block = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    compiled = nnc.compile(copy.deepcopy(block))
    x = torch.randn(2, 5, 16)
    xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    want, got = block(xe), compiled(xc)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    want.sum().backward()
    got.sum().backward()
    np.testing.assert_allclose(xc.grad.numpy(), xe.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert views_folded(compiled) > 0


# -- the transformer block's kernels -----------------------------------------------------------------------------

def test_block_runs_no_view_as_a_step():
    """examples/models.py:block at [2, 16, 32]: no view runs as a step; every view folds into the kernels reading
    it (a reshape of a permuted value reads a clone kernel's contiguous copy)."""
    from examples.models import TransformerBlock

    torch.manual_seed(0)
    report = nnc.explain(TransformerBlock().eval(), torch.randn(2, 16, 32), backward=True)
    for k in report.kernels + report.backward_kernels:
        assert not k.view, f"{k.name} runs a view as a step: {k.reason}"
        assert not (k.kind == "opaque" and set(k.ops) & {"reshape", "permute", "expand", "getitem"}), k
        assert k.reason, f"{k.name} has no boundary reason"
    # before folding: 34 forward (17 views) and 78 backward kernels (37 views)
    assert len(report.kernels) <= 18
    assert len(report.backward_kernels) <= 50


# -- the maps ----------------------------------------------------------------------------------------------------

def _graph(body, *shapes):
    g = Graph()
    xs = [g.placeholder(f"x{k}") for k in range(len(shapes))]
    out = body(g, *xs)
    g.output(out)
    examples = [torch.randn(*s, dtype=F64) for s in shapes]
    from nnc.graph_module import GraphModule

    gm = GraphModule(nn.Module(), g)
    propagate_shapes(gm, *examples)
    return gm, examples


def _check_map(gm, examples, view_name):
    interp = nnc.Interpreter(gm)
    interp.run(*examples)
    view = next(n for n in gm.graph.nodes if n.name == view_name)
    m = view_maps(gm.graph)[view]
    want = interp.env[view].numpy()
    np.testing.assert_array_equal(m.apply(interp.env[m.base].numpy()), want)
    return m


def test_maps_compose_through_chains():
    def body(g, x):
        p = call(g, "permute", call(g, "exp", x), dims=(2, 0, 1))
        s = call(g, "getitem", p, key=(("slice", 1, None, 2), ("int", 1)))
        e = call(g, "expand", call(g, "reshape", s, shape=(3, 1, 5)), shape=(3, 2, 5))
        return call(g, "neg", e)

    gm, examples = _graph(body, (4, 5, 6))
    m = _check_map(gm, examples, "expand")
    assert isinstance(m, ViewMap) and m.base.name == "exp" and m.strides[1] == 0
    assert m.offset == 1 * 1 + 1 * 30  # [1::2] along dim 2 (stride 1), then int 1 along dim 0 (stride 30)


def test_copying_reshape_has_no_map_and_gets_a_clone_kernel():
    def body(g, x):
        r = call(g, "reshape", call(g, "permute", call(g, "exp", x), dims=(1, 0)), shape=(20,))
        return call(g, "neg", r)

    gm, examples = _graph(body, (4, 5))
    maps = view_maps(gm.graph)
    assert [n.name for n in maps] == ["permute"]  # the reshape of a permuted value copies
    from nnc.passes.views import copy_strided_reshapes

    gm = copy_strided_reshapes(gm)
    kernels = fuse(gm.graph)
    verify(kernels, gm.graph)
    assert [k.meta["ops"] for k in kernels] == [["exp"], ["clone"], ["neg"]]
    assert [n.name for n in kernels[2].meta["views"]] == ["reshape"]
    interp = nnc.Interpreter(gm)
    np.testing.assert_allclose(interp.run(*examples).numpy(), -np.exp(examples[0].numpy()).T.reshape(20))


def test_negative_steps_and_graph_outputs_are_not_folded():
    def body(g, x):
        e = call(g, "exp", x)
        flipped = call(g, "getitem", e, key=(("slice", None, None, -1),))
        t = call(g, "permute", e, dims=(1, 0))
        return call(g, "neg", flipped), t

    gm, examples = _graph(body, (4, 5))
    kernels = fuse(gm.graph)
    verify(kernels, gm.graph)
    opaque = {k.nodes[0].name: k.reason for k in kernels if k.kind == "opaque"}
    assert "graph output" in opaque["permute"]
    assert "not one strided map" in opaque["getitem"]


# -- random view chains ------------------------------------------------------------------------------------------

def _random_view(rng, x, shape):
    """A random view op on x (of shape) and its result shape."""
    kind = rng.choice(["permute", "reshape", "slice", "expand", "unsqueeze"])
    if kind == "permute" and len(shape) > 1:
        dims = list(range(len(shape)))
        rng.shuffle(dims)
        return x.permute(*dims)
    if kind == "reshape":
        return x.reshape(-1) if len(shape) > 1 else x.reshape(1, -1)
    if kind == "slice" and shape and shape[-1] > 2:
        return x[..., rng.randrange(2)::rng.choice([1, 2])]
    if kind == "expand" and len(shape) < 4:
        return x.unsqueeze(0).expand(2, *shape)
    return x.unsqueeze(rng.randrange(len(shape) + 1))


@pytest.mark.parametrize("seed", range(12))
def test_random_view_chains_match_eager(seed):
    rng = random.Random(seed)
    ops = [rng.random() for _ in range(4)]

    def fn(m, x):
        y = x.exp()
        for r in ops:
            y = _random_view(random.Random(r), y, tuple(y.shape))
        z = (y * 2).sin()
        return z.sum(-1)

    assert_matches_eager(fn, (3, 4, 5))


# -- whole-graph mode --------------------------------------------------------------------------------------------

class Returns(nn.Module):
    """A copy-reshape of a transposed value (a clone kernel), a view of a folded view returned by the graph, and a
    transposed parameter read by a matmul."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 6, dtype=F64))

    def forward(self, x):
        e = x.exp()
        flat = e.transpose(0, 1).reshape(-1) * 2
        returned = e.transpose(0, 1).unsqueeze(0)
        return flat, returned, x @ self.w.transpose(0, 1)


@pytest.mark.parametrize("whole_graph", [True, False])
def test_inference_with_folded_views_matches_eager(whole_graph):
    torch.manual_seed(3)
    model = Returns()
    compiled = nnc.compile(copy.deepcopy(model), whole_graph=whole_graph)
    x = torch.randn(4, 6, dtype=F64)
    with torch.no_grad():
        want, got = model(x), compiled(x)
    for w, g in zip(want, got):
        assert tuple(g.shape) == tuple(w.shape)
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-12)
    plan = compiled.compilations[0].graphs[0].forward_plan
    assert plan.whole_graph is whole_graph, plan.whole_graph_reason
    assert any("clone" in k.meta["ops"] for k in plan.kernels)
    assert sum(len(k.meta["views"]) for k in plan.kernels) >= 3
