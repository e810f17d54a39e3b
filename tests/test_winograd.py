"""Winograd convolution (runtime/_winograd.py, nnc/passes/winograd.py, nnc/codegen/cpu_winograd.py): the transforms
against a float64 im2col convolution and as exact adjoints; compiled 3x3 stride-1 convolutions (rewritten to
Winograd) against eager (im2col) and torch, forward and both gradients, float64 and float32, over padding, odd and
even sizes, partial tiles, batch 1 and 0; the generated kernels against the interpreter's numpy forwards; and which
convolutions are rewritten."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import nnc
import runtime
from nnc.passes import winograd as winograd_pass
from runtime import _winograd
from runtime.ops import _np_im2col

from helpers import needs_torch, whole_graph_forward


@pytest.fixture(autouse=True)
def _rewrite_small_convolutions(monkeypatch):
    """The tests' convolutions are small: rewrite them whatever their work (the threshold is tested on its own)."""
    monkeypatch.setattr(winograd_pass, "MIN_DIRECT_WORK", 0)


def _reference(x, w, padding):
    """The convolution by im2col, in float64: (O, N * Ho * Wo)."""
    cols = _np_im2col(x.astype(np.float64), (3, 3), (1, 1), padding, (1, 1))
    return w.astype(np.float64).reshape(w.shape[0], -1) @ cols


@pytest.mark.parametrize("tile", _winograd.TILES)
@pytest.mark.parametrize("shape,padding", [((2, 3, 7, 6), ((0, 0), (0, 0))), ((1, 2, 5, 9), ((1, 1), (1, 1))),
                                           ((3, 2, 3, 3), ((0, 0), (0, 0))), ((1, 1, 4, 4), ((2, 1), (0, 2)))])
def test_transforms_compute_the_convolution(tile, shape, padding):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(shape), rng.standard_normal((4, shape[1], 3, 3))
    size = _winograd.output_sizes(shape[2:], padding)
    m = np.matmul(_winograd.np_filter(w, tile), _winograd.np_input(x, tile, padding))
    np.testing.assert_allclose(_winograd.np_output(m, tile, size), _reference(x, w, padding), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("tile", _winograd.TILES)
def test_backward_transforms_are_the_adjoints(tile):
    rng = np.random.default_rng(1)
    x, w, padding = rng.standard_normal((2, 3, 6, 7)), rng.standard_normal((4, 3, 3, 3)), ((1, 1), (0, 0))
    size = _winograd.output_sizes(x.shape[2:], padding)
    v = _winograd.np_input(x, tile, padding)
    dv = rng.standard_normal(v.shape)
    assert np.isclose(np.vdot(v, dv), np.vdot(x, _winograd.np_input_backward(dv, x.shape[2:], tile, padding)))
    u = _winograd.np_filter(w, tile)
    du = rng.standard_normal(u.shape)
    assert np.isclose(np.vdot(u, du), np.vdot(w, _winograd.np_filter_backward(du, tile)))
    m = rng.standard_normal((u.shape[0], 4, v.shape[2]))
    y = _winograd.np_output(m, tile, size)
    dy = rng.standard_normal(y.shape)
    assert np.isclose(np.vdot(y, dy), np.vdot(m, _winograd.np_output_backward(dy, tile, size)))


def test_float32_error_of_the_large_tile_is_small():
    """F(4x4, 3x3) loses float32 accuracy (its points reach +-2): measured ~5e-6 of the largest output."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 32, 26, 26)).astype(np.float32)
    w = (rng.standard_normal((16, 32, 3, 3)) * 0.1).astype(np.float32)
    pad = ((0, 0), (0, 0))
    m = np.matmul(_winograd.np_filter(w, 4), _winograd.np_input(x, 4, pad))
    y = _winograd.np_output(m, 4, (24, 24))
    ref = _reference(x, w, pad)
    assert np.abs(y - ref).max() <= 2e-5 * np.abs(ref).max()


# (name, input shape, out channels, padding, bias, activation): at least MIN_CHANNELS input channels, so the rewrite
# applies; with a bias the output transform takes the bias add (winograd_output_bias), and a relu after it too
# NOTE: every (shape, dtype) compiles its own kernels (their sizes are constants in the source), several seconds
# each for F(4x4) on an empty kernel cache, so the cases are few and each covers several edges at once
CONVS = [
    ("valid_odd", (2, 8, 7, 9), 5, 0, True, "tanh"),
    ("padded_even", (3, 8, 6, 8), 4, 1, False, "relu"),
    ("large_tile_partial_padded", (2, 9, 11, 13), 3, 1, True, "relu"),
    ("one_output", (2, 8, 3, 3), 2, 0, True, "relu"),
    ("padding_2", (1, 8, 5, 6), 3, 2, True, "relu"),
    ("batch_0", (0, 8, 6, 6), 3, 1, True, "tanh"),
]
# float32 runs one case of each tile size (F(4x4)'s float32 error is checked on a real size above)
FLOAT32_CONVS = ("valid_odd", "large_tile_partial_padded")


def _module(lib, shape, out_ch, padding, bias=True, act="tanh"):
    """A 3x3 convolution (with or without a bias), then the activation (its only use), then a scaling."""
    conv = lib.nn.Conv2d(shape[1], out_ch, 3, padding=padding, bias=bias)
    activation = getattr(lib, act)

    class M(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return activation(self.conv(x)) * 1.5

    return M()


def _run(module, run, x, gy):
    xt = runtime.tensor(x, requires_grad=True)
    for p in module.parameters():
        p.grad = None
    out = run(xt)
    out.backward(runtime.tensor(gy))
    return [out.detach().numpy().copy(), xt.grad.numpy().copy()] + [p.grad.numpy().copy()
                                                                     for p in module.parameters()]


def _plans(compiled):
    return [getattr(a, label) for a in compiled._cache.values()
            for label in ("forward_plan", "training_plan", "backward_plan") if getattr(a, label, None) is not None]


def _ops_in(compiled) -> list[str]:
    """The ops every step of every plan runs (a whole-graph step's kernels included)."""
    def nodes(step):
        kernels = getattr(step, "kernels", None) or [getattr(step, "kernel", None)]
        found = [n for k in kernels if k is not None for n in k.nodes]
        return found or getattr(step, "nodes", [])
    return [n.target.op.name for p in _plans(compiled) for s in p.steps for n in nodes(s) if hasattr(n.target, "op")]


_EAGER_CASES = [(*c, np.float64, 1e-10) for c in CONVS] + [(*c, np.float32, 2e-4) for c in CONVS
                                                             if c[0] in FLOAT32_CONVS]


@pytest.mark.parametrize("name,shape,out_ch,padding,bias,act,dtype,tol", _EAGER_CASES,
                         ids=[f"{c[0]}-{np.dtype(c[6]).name}" for c in _EAGER_CASES])
def test_compiled_winograd_matches_eager(name, shape, out_ch, padding, bias, act, dtype, tol):
    runtime.manual_seed(0)
    m = _module(runtime, shape, out_ch, padding, bias, act).to(runtime.float64 if dtype == np.float64
                                                               else runtime.float32)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(dtype)
    gy = rng.standard_normal((shape[0], out_ch) + _winograd.output_sizes(shape[2:], ((padding,) * 2,) * 2))
    gy = gy.astype(dtype)
    compiled = nnc.compile(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want, got = _run(m, m, x, gy), _run(m, compiled, x, gy)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    ops = _ops_in(compiled)
    if shape[0]:  # a size-0 batch keeps im2col (nothing to tile) and runs in the interpreter
        output = "winograd_output_bias" if bias else "winograd_output"
        assert {"winograd_input", output, "winograd_output_backward", "winograd_input_backward",
                "winograd_filter_backward"} <= set(ops)
        assert not {"im2col", "col2im"} & set(ops)
        assert ("relu" in ops) == (act == "relu" and not bias)  # the output transform's epilogue when it has a bias
        plans = _plans(compiled)
        assert all(not p.fallbacks for p in plans)
        winograd_steps = [s for p in plans for s in p.steps if getattr(getattr(s, "kernel", None), "kind", None)
                          == "winograd"]
        assert len(winograd_steps) == 6 and all(hasattr(s, "compiled") for s in winograd_steps)


@pytest.mark.parametrize("name,shape,out_ch,padding,bias,act", CONVS[:5], ids=[c[0] for c in CONVS[:5]])
def test_winograd_kernels_match_the_interpreter(name, shape, out_ch, padding, bias, act):
    """The generated kernels against the ops' numpy forwards: the same rewritten graph, run without codegen."""
    runtime.manual_seed(0)
    m = _module(runtime, shape, out_ch, padding, bias, act).double()
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape)
    gy = rng.standard_normal((shape[0], out_ch) + _winograd.output_sizes(shape[2:], ((padding,) * 2,) * 2))
    interpreted = nnc.compile(m, codegen=False)
    want = _run(m, interpreted, x, gy)
    assert "winograd_input" in _ops_in(interpreted)
    got = _run(m, nnc.compile(m), x, gy)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@needs_torch
@pytest.mark.parametrize("name,shape,out_ch,padding,bias,act", CONVS, ids=[c[0] for c in CONVS])
def test_compiled_winograd_matches_torch(torch, name, shape, out_ch, padding, bias, act):
    m = _module(runtime, shape, out_ch, padding, bias, act).double()
    t = _module(torch, shape, out_ch, padding, bias, act).double()
    with torch.no_grad():
        for p, q in zip(t.parameters(), m.parameters()):
            p.copy_(torch.from_numpy(q.detach().numpy()))
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape)
    xt = torch.tensor(x, requires_grad=True)
    out = t(xt)
    gy = rng.standard_normal(tuple(out.shape))
    out.backward(torch.tensor(gy))
    got = _run(m, nnc.compile(m), x, gy)
    want = [out.detach().numpy(), xt.grad.numpy()] + [p.grad.numpy() for p in t.parameters()]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


def test_only_3x3_stride_1_convolutions_with_enough_channels_are_rewritten():
    nn = runtime.nn
    runtime.manual_seed(0)
    cases = [(nn.Conv2d(8, 4, 3), True), (nn.Conv2d(winograd_pass.MIN_CHANNELS - 1, 4, 3), False),
             (nn.Conv2d(8, 4, 3, stride=2), False), (nn.Conv2d(8, 4, 3, dilation=2), False),
             (nn.Conv2d(8, 4, 3, groups=2), False), (nn.Conv2d(8, 4, (3, 2)), False)]
    for conv, rewritten in cases:
        compiled = nnc.compile(conv, codegen=False)  # the rewrite is the pipeline's choice; kernels are tested above
        x = runtime.randn(2, conv.in_channels, 9, 9)
        with runtime.no_grad():
            np.testing.assert_allclose(compiled(x).numpy(), conv(x).numpy(), rtol=1e-4, atol=1e-5)
        ops = _ops_in(compiled)
        assert ("winograd_input" in ops) == rewritten, (conv, ops)
        assert ("im2col" in ops) != rewritten, (conv, ops)


def test_which_small_convolutions_keep_im2col(monkeypatch):
    monkeypatch.undo()
    conv = runtime.nn.Conv2d(32, 64, 3)
    for batch, rewritten in ((1, True), (2, False), (8, True)):
        compiled = nnc.compile(conv, codegen=False)  # the rewrite is the pipeline's choice; kernels are tested above
        x = runtime.randn(batch, 32, 26, 26)
        with runtime.no_grad():
            np.testing.assert_allclose(compiled(x).numpy(), conv(x).numpy(), rtol=1e-4, atol=1e-4)
        assert ("winograd_input" in _ops_in(compiled)) == rewritten


@pytest.mark.parametrize("out_sizes,tile", [((24, 24), 4), ((8, 30), 4), ((7, 24), 2), ((3, 3), 2)])
def test_tile_choice(out_sizes, tile):
    assert winograd_pass.tile_for(out_sizes) == tile


def test_mnist_cnn_inference_in_whole_graph_mode(monkeypatch):
    """The batch-1 forward with Winograd's kernels and its batched product in the one numba function (the im2col
    variant too: its product reads the weight, an argument of the function, directly)."""
    nn = runtime.nn
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(9216, 10))
    x = runtime.randn(1, 1, 28, 28)
    compiled, got, want = whole_graph_forward(model, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert "winograd_input" in _ops_in(compiled)
    monkeypatch.setattr(winograd_pass, "MIN_CHANNELS", 10 ** 9)
    compiled, got, _ = whole_graph_forward(model, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert "im2col" in _ops_in(compiled)


def test_the_rewrite_stays_off_cuda_graphs():
    from nnc import pipeline

    conv = runtime.nn.Conv2d(8, 4, 3)
    x = runtime.randn(1, 8, 6, 6)
    c = pipeline.run_stages(pipeline.Compilation(conv, {}, {"input": x}, needs_grad=False, target="cuda"),
                           "simplify")
    names = [n.target.op.name for n in c.forward.graph.nodes if hasattr(n.target, "op")]
    assert "im2col" in names and "winograd_input" not in names
