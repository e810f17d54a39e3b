"""Convolution and pooling as generated window kernels: compiled == eager (float64, 1e-9) and == torch, forward and
backward, over edge geometries; the window ops run as numba kernels (never interpreted); their schedules as values."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import nnc
import runtime
from nnc.codegen.cpu_conv import WindowSchedule, window_schedule
from nnc.codegen.cpu_elementwise import PARALLEL_MIN_ELEMENTS

from helpers import needs_torch, whole_graph_forward

# (name, nd, input shape, out channels, kernel, conv kwargs)
CONVS = [
    ("plain", 2, (2, 3, 7, 6), 4, (3, 3), {}),
    ("padding_stride", 2, (2, 3, 9, 8), 5, (3, 2), {"stride": 2, "padding": 1}),
    ("stride_gt_kernel", 2, (1, 2, 9, 9), 3, (2, 2), {"stride": 3}),
    ("dilation", 2, (2, 2, 9, 8), 3, (3, 3), {"dilation": (2, 1), "padding": (2, 0)}),
    ("groups", 2, (2, 4, 6, 6), 6, (3, 3), {"groups": 2, "padding": 1}),
    ("depthwise", 2, (1, 3, 5, 5), 3, (3, 3), {"groups": 3}),
    ("kernel_1", 2, (2, 3, 4, 5), 2, (1, 1), {}),
    ("channel_1_batch_1", 2, (1, 1, 6, 6), 1, (3, 3), {"padding": 2}),
    ("same", 2, (2, 2, 6, 5), 3, (4, 3), {"padding": "same"}),
    ("conv1d", 1, (2, 3, 11), 4, (3,), {"stride": 2, "padding": 2, "dilation": 2}),
    ("conv1d_groups", 1, (1, 4, 9), 4, (2,), {"groups": 4}),
    # the window kernels check bounds only in dims a window can leave: padding in the last dim only, in the first
    # only, a stride with padding on a non-square input, and a 1-d convolution padded on one side ('same')
    ("pad_last_dim_only", 2, (2, 2, 5, 7), 3, (3, 3), {"padding": (0, 1)}),
    ("pad_first_dim_only", 2, (1, 2, 6, 4), 2, (2, 3), {"padding": (1, 0), "stride": (1, 2)}),
    ("stride_pad_non_square", 2, (2, 3, 11, 5), 2, (3, 2), {"stride": (2, 3), "padding": 1, "dilation": (1, 2)}),
    ("conv1d_same_even", 1, (2, 2, 8), 3, (4,), {"padding": "same"}),
    ("batch_0", 2, (0, 3, 6, 5), 2, (3, 3), {"padding": 1}),
    ("no_bias", 2, (2, 3, 6, 5), 4, (3, 3), {"bias": False, "padding": 1}),
    ("groups_no_bias", 2, (1, 4, 5, 6), 4, (1, 3), {"groups": 2, "bias": False}),
    ("conv1d_no_bias", 1, (3, 2, 7), 2, (1,), {"bias": False}),
    ("mnist_conv2", 2, (2, 4, 12, 10), 6, (3, 3), {}),
    # one input channel and >= 4096 output positions: the product and its input gradient are "short_sum_wide" loops
    ("one_channel_wide", 2, (2, 1, 48, 48), 9, (3, 3), {}),
    ("one_channel_wide_padded", 2, (1, 1, 66, 64), 12, (3, 3), {"padding": 1, "bias": False}),
]

# (name, function name, input shape, kwargs)
POOLS = [
    ("max2d", "max_pool2d", (2, 3, 8, 7), {"kernel_size": 2}),
    ("max2d_pad_stride", "max_pool2d", (1, 2, 9, 9), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("max2d_ceil", "max_pool2d", (2, 2, 7, 6), {"kernel_size": 2, "ceil_mode": True}),
    ("max2d_dilation", "max_pool2d", (1, 1, 9, 8), {"kernel_size": 2, "stride": 1, "dilation": 2}),
    ("max2d_stride_gt_kernel", "max_pool2d", (2, 2, 9, 9), {"kernel_size": 2, "stride": 3}),
    ("max1d", "max_pool1d", (2, 3, 10), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("avg2d", "avg_pool2d", (2, 3, 8, 6), {"kernel_size": 2}),
    ("avg2d_pad", "avg_pool2d", (1, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("avg2d_pad_exclude", "avg_pool2d", (1, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1,
                                                       "count_include_pad": False}),
    ("avg2d_ceil", "avg_pool2d", (2, 1, 7, 6), {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
    ("avg1d", "avg_pool1d", (2, 2, 9), {"kernel_size": 3, "stride": 2, "padding": 1}),
    # windows that tile the input exactly (each element in one window), and ones that overlap (shared maxima add up)
    ("max2d_tiles", "max_pool2d", (2, 3, 8, 6), {"kernel_size": 2}),
    ("max2d_tiles_rect", "max_pool2d", (1, 2, 9, 8), {"kernel_size": (3, 2)}),
    ("max1d_tiles", "max_pool1d", (2, 2, 12), {"kernel_size": 3}),
    ("max2d_overlap", "max_pool2d", (2, 2, 7, 7), {"kernel_size": 3, "stride": 1}),
    ("max2d_batch_0", "max_pool2d", (0, 2, 6, 6), {"kernel_size": 2}),
    ("avg2d_batch_0", "avg_pool2d", (0, 2, 6, 6), {"kernel_size": 2}),
]


def _conv_module(lib, nd, shape, out_ch, kernel, kw):
    conv = (lib.nn.Conv1d if nd == 1 else lib.nn.Conv2d)(shape[1], out_ch, kernel, **kw)

    class M(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return lib.tanh(self.conv(x)) * 1.5

    return M()


def _pool_module(lib, fn, kw):
    class M(lib.nn.Module):
        def forward(self, x):
            return getattr(lib.nn.functional, fn)(x * 2.0, **kw) * 0.5

    return M()


def _data(shape, seed=0):
    # distinct values (no ties in any max-pool window, so every library picks the same element)
    rng = np.random.default_rng(seed)
    return rng.permutation(np.prod(shape)).reshape(shape).astype(np.float64) / np.prod(shape) - 0.5


def _eager_and_compiled(module, x, gy):
    """(outputs, input grads, param grads) eagerly and compiled, with the compiled module's plans."""
    results = []
    compiled = nnc.compile(module)
    for run in (module, compiled):
        xt = runtime.tensor(x, requires_grad=True)
        for p in module.parameters():
            p.grad = None
        out = run(xt)
        out.backward(runtime.tensor(gy))
        results.append((out.detach().numpy().copy(), xt.grad.numpy().copy(),
                        [p.grad.numpy().copy() for p in module.parameters()]))
    return results, compiled


def _plans(compiled):
    return [getattr(a, label) for a in compiled._cache.values()
            for label in ("forward_plan", "training_plan", "backward_plan") if getattr(a, label, None) is not None]


def _check_window_kernels_run(compiled, expect_backward=True):
    plans = _plans(compiled)
    assert plans and all(not p.fallbacks for p in plans)
    labels = [label for a in compiled._cache.values() for label in ("training_plan", "backward_plan")
              if getattr(a, label, None) is not None]
    if expect_backward:
        assert labels == ["training_plan", "backward_plan"], "the backward is compiled"
    windows = [s for p in plans for s in p.steps if getattr(getattr(s, "kernel", None), "kind", None) == "window"]
    assert windows and all(hasattr(s, "compiled") for s in windows)
    interpreted = [n.target.op.name for p in plans for s in p.steps for n in getattr(s, "nodes", [])
                   if hasattr(n.target, "op")]
    assert not {"im2col", "col2im", "max_pool", "max_pool_backward", "cat", "getitem"} & set(interpreted)


def _compare(a, b, tol=1e-12):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("name,nd,shape,out_ch,kernel,kw", CONVS, ids=[c[0] for c in CONVS])
def test_conv_compiled_matches_eager(name, nd, shape, out_ch, kernel, kw):
    runtime.manual_seed(0)
    m = _conv_module(runtime, nd, shape, out_ch, kernel, kw).double()
    x = _data(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = m(runtime.tensor(x))
        gy = _data(tuple(y.shape), 1)
        (eo, ex, ep), (co, cx, cp) = _eager_and_compiled(m, x, gy)[0]
    _compare(co, eo)
    _compare(cx, ex)
    for a, b in zip(cp, ep):
        _compare(a, b)


# a size-0 value runs through the interpreter by design (nothing to loop over)
NONEMPTY_CONVS = [c for c in CONVS if c[2][0] > 0]


@pytest.mark.parametrize("name,nd,shape,out_ch,kernel,kw", NONEMPTY_CONVS, ids=[c[0] for c in NONEMPTY_CONVS])
def test_conv_kernels_are_generated(name, nd, shape, out_ch, kernel, kw):
    m = _conv_module(runtime, nd, shape, out_ch, kernel, kw).double()
    x = _data(shape)
    gy = _data(tuple(m(runtime.tensor(x)).shape), 1)
    _, compiled = _eager_and_compiled(m, x, gy)
    _check_window_kernels_run(compiled)


@needs_torch
@pytest.mark.parametrize("name,nd,shape,out_ch,kernel,kw", CONVS, ids=[c[0] for c in CONVS])
def test_conv_compiled_matches_torch(torch, name, nd, shape, out_ch, kernel, kw):
    m = _conv_module(runtime, nd, shape, out_ch, kernel, kw).double()
    t = _conv_module(torch, nd, shape, out_ch, kernel, kw).double()
    with torch.no_grad():
        for p, q in zip(t.parameters(), m.parameters()):
            p.copy_(torch.from_numpy(q.detach().numpy()))
    x = _data(shape)
    xt = torch.tensor(x, requires_grad=True)
    out = t(xt)
    gy = _data(tuple(out.shape), 1)
    out.backward(torch.tensor(gy))
    (_, (co, cx, cp)), _ = _eager_and_compiled(m, x, gy)
    _compare(co, out.detach().numpy())
    _compare(cx, xt.grad.numpy())
    for a, p in zip(cp, t.parameters()):
        _compare(a, p.grad.numpy())


@pytest.mark.parametrize("name,fn,shape,kw", POOLS, ids=[p[0] for p in POOLS])
def test_pool_compiled_matches_eager_and_torch(name, fn, shape, kw, request):
    m = _pool_module(runtime, fn, kw)
    x = _data(shape)
    y = m(runtime.tensor(x))
    gy = _data(tuple(y.shape), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ((eo, ex, _), (co, cx, _)), compiled = _eager_and_compiled(m, x, gy)
    _compare(co, eo)
    _compare(cx, ex)
    if shape[0]:
        _check_window_kernels_run(compiled)
    try:
        torch = request.getfixturevalue("torch")
    except pytest.skip.Exception:
        return
    xt = torch.tensor(x, requires_grad=True)
    out = _pool_module(torch, fn, kw)(xt)
    out.backward(torch.tensor(gy))
    _compare(co, out.detach().numpy())
    _compare(cx, xt.grad.numpy())


def test_max_pool_gradient_goes_to_the_first_maximum():
    # a relu'd plane of zeros: every window ties; torch gives the whole gradient to the first element
    m = _pool_module(runtime, "max_pool2d", {"kernel_size": 2})
    x = np.zeros((1, 1, 4, 4))
    gy = np.ones((1, 1, 2, 2))
    (_, (_, cx, _)), _ = _eager_and_compiled(m, x, gy)
    want = np.zeros((4, 4))
    want[::2, ::2] = 1.0
    np.testing.assert_array_equal(cx[0, 0], want)


def test_mnist_cnn_float32_compiled_matches_eager():
    nn = runtime.nn
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(16 * 12 * 12, 10))
    x = _data((4, 1, 28, 28)).astype(np.float32)
    gy = _data((4, 10), 1).astype(np.float32)
    ((eo, ex, ep), (co, cx, cp)), compiled = _eager_and_compiled(model, x, gy)
    np.testing.assert_allclose(co, eo, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(cx, ex, rtol=1e-4, atol=1e-5)
    for a, b in zip(cp, ep):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    _check_window_kernels_run(compiled)


@pytest.mark.parametrize("batch", [1, 3])
def test_cnn_inference_in_whole_graph_mode_matches_eager(batch):
    """The no_grad forward runs as one numba function (window kernels, the wide short sum, BLAS inside numba)."""
    nn = runtime.nn
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 9, 3), nn.ReLU(), nn.Conv2d(9, 16, 3, padding=1), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 31 * 31, 10)).double()
    x = runtime.tensor(_data((batch, 1, 64, 64)))
    _, got, want = whole_graph_forward(model, x)
    _compare(got, want)


def test_a_window_kernel_that_fails_to_compile_falls_back(monkeypatch):
    from nnc.codegen import cpu

    def broken(kb):
        raise RuntimeError("no window kernels today")

    monkeypatch.setitem(cpu.SKELETONS, "window", broken)
    m = _pool_module(runtime, "max_pool2d", {"kernel_size": 2, "padding": 1})
    x = _data((2, 2, 5, 5))
    with pytest.warns(RuntimeWarning, match="failed to compile"):
        ((eo, ex, _), (co, cx, _)), _ = _eager_and_compiled(m, x, _data((2, 2, 3, 3), 1))
    _compare(co, eo)
    _compare(cx, ex)


@pytest.mark.parametrize("op,in_shape,kernel,out_sizes,want", [
    # im2col: one task per (channel, kernel offset, sample) row of its columns
    ("im2col", (64, 32, 26, 26), (3, 3), (24, 24), WindowSchedule("im2col", 32 * 9 * 64, 576, True)),
    ("im2col", (1, 1, 6, 6), (3, 3), (4, 4), WindowSchedule("im2col", 9, 16, False)),
    # the scatters and pooling: one task per (sample, channel) plane, which it alone writes
    ("col2im", (64, 32, 26, 26), (3, 3), (24, 24), WindowSchedule("col2im", 64 * 32, 576 * 9, True)),
    ("max_pool", (64, 64, 24, 24), (2, 2), (12, 12), WindowSchedule("max_pool", 64 * 64, 144 * 4, True)),
    ("max_pool_backward", (2, 3, 8, 8), (2, 2), (4, 4), WindowSchedule("max_pool_backward", 6, 64, False)),
])
def test_window_schedule(op, in_shape, kernel, out_sizes, want):
    got = window_schedule(op, in_shape, kernel, out_sizes)
    assert got == want
    assert got.loop == ("prange" if want.parallel else "range")
    assert got.parallel == (got.tasks * got.work >= PARALLEL_MIN_ELEMENTS)


F32_CONVS = [c for c in CONVS if c[0] in ("plain", "padding_stride", "pad_last_dim_only", "conv1d", "mnist_conv2")]
F32_POOLS = [p for p in POOLS if p[0] in ("max2d", "max2d_pad_stride", "max2d_tiles", "max1d_tiles", "avg2d_pad")]


@pytest.mark.parametrize("name,nd,shape,out_ch,kernel,kw", F32_CONVS, ids=[c[0] for c in F32_CONVS])
def test_conv_float32_compiled_matches_eager(name, nd, shape, out_ch, kernel, kw):
    runtime.manual_seed(0)
    m = _conv_module(runtime, nd, shape, out_ch, kernel, kw)
    x = _data(shape).astype(np.float32)
    gy = _data(tuple(m(runtime.tensor(x)).shape), 1).astype(np.float32)
    ((eo, ex, ep), (co, cx, cp)), compiled = _eager_and_compiled(m, x, gy)
    assert co.dtype == np.float32 and cx.dtype == np.float32
    for a, b in [(co, eo), (cx, ex)] + list(zip(cp, ep)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    _check_window_kernels_run(compiled)


@pytest.mark.parametrize("name,fn,shape,kw", F32_POOLS, ids=[p[0] for p in F32_POOLS])
def test_pool_float32_compiled_matches_eager(name, fn, shape, kw):
    m = _pool_module(runtime, fn, kw)
    x = _data(shape).astype(np.float32)
    gy = _data(tuple(m(runtime.tensor(x)).shape), 1).astype(np.float32)
    ((eo, ex, _), (co, cx, _)), compiled = _eager_and_compiled(m, x, gy)
    np.testing.assert_allclose(co, eo, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(cx, ex, rtol=1e-6, atol=1e-7)
    _check_window_kernels_run(compiled)


@pytest.mark.parametrize("kw", [{"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1},
                                {"kernel_size": 3, "stride": 1}, {"kernel_size": 2, "ceil_mode": True}],
                         ids=["tiles", "padding", "overlap", "ceil"])
def test_max_pool_ties_and_nan_match_eager(kw):
    # many ties (values on a coarse grid, a plane of zeros) and a nan: the same element wins compiled and eager
    x = np.round(_data((2, 2, 7, 7)) * 4) / 4
    x[0, 1] = 0.0
    x[1, 0, 2, 3] = np.nan
    m = _pool_module(runtime, "max_pool2d", kw)
    gy = _data(tuple(m(runtime.tensor(x)).shape), 1)
    ((eo, ex, _), (co, cx, _)), compiled = _eager_and_compiled(m, x, gy)
    np.testing.assert_array_equal(co, eo)
    _compare(cx, ex)  # overlapping windows sum their gradients in another order
    assert np.isnan(co).any()
    _check_window_kernels_run(compiled)


def test_im2col_and_col2im_take_their_row_width_as_an_argument():
    # a constant-length row loop stays scalar (LLVM unrolls it and cannot rule out overlapping slices); the launcher
    # passes the output width of the last dim, 5 here, and the row loops run over it
    m = _conv_module(runtime, 2, (2, 3, 7, 7), 4, (3, 3), {}).double()
    ((eo, ex, _), (co, cx, _)), compiled = _eager_and_compiled(m, _data((2, 3, 7, 7)), _data((2, 4, 5, 5), 1))
    _compare(co, eo)
    _compare(cx, ex)
    sources = {s.kernel.nodes[0].target.op.name: s.compiled.source for p in _plans(compiled) for s in p.steps
               if getattr(getattr(s, "kernel", None), "kind", None) == "window"}
    assert set(sources) == {"im2col", "col2im"}
    for source in sources.values():
        assert "width = 5" in source and "in range(width):" in source
