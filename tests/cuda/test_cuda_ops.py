"""Eager ops on CUDA tensors against the CPU: every elementwise template, reductions, matmul and linear, views and
cat, on the op table's sample inputs (tests/opinfo.py), forward and gradients."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from opinfo import SAMPLES

import runtime
import runtime.nn.functional as F
from runtime.cuda.templates import NoLowering
from runtime.ops import OPS, Kind, apply

# NOTE: the counter-based draws (needs_index: philox_*) exist only in compiled graphs; eager CUDA has no lowering
ELEMENTWISE = sorted(name for name, op in OPS.items()
                     if op.kind == Kind.ELEMENTWISE and op.template and not op.needs_index)
REDUCTIONS = sorted(name for name, op in OPS.items() if op.kind == Kind.REDUCTION)
OTHERS = ["matmul", "linear", "reshape", "permute", "expand", "getitem", "cat", "index_put", "gather",
          "scatter_add", "log_softmax", "log_softmax_backward", "nll_loss", "nll_loss_backward", "im2col", "col2im",
          "max_pool", "max_pool_backward", "max_pool_pick", "cumsum", "cumprod", "constant_pad"]
def _complex(sample) -> bool:
    return any(np.iscomplexobj(v) for v in sample.inputs) or \
        any(getattr(v, "is_complex", False) is True for v in sample.attrs.values())


CASES = [(name, k) for name in ELEMENTWISE + REDUCTIONS + OTHERS for k, sample in enumerate(SAMPLES.get(name, []))
         if not _complex(sample)]  # complex tensors stay on the CPU (test_complex_tensors_stay_on_the_cpu)


def _tensors(values, device, dtype=None):
    """Sample inputs as tensors on a device (numpy arrays become tensors; float64 ones take `dtype` if given)."""
    out = []
    for v in values:
        if isinstance(v, np.ndarray):
            t = runtime.tensor(v)
            if dtype is not None and t.dtype is runtime.float64:
                t = t.to(dtype)
            out.append(t.to(device))
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], np.ndarray):
            out.extend(_tensors(v, device, dtype))
        else:
            out.append(v)
    return out


def _advanced_index(name, inputs) -> bool:
    return name in ("getitem", "index_put") and len(inputs) > (1 if name == "getitem" else 2)


def _check_same(cpu, dev, tol):
    assert dev.is_cuda and dev.shape == cpu.shape and dev.dtype is cpu.dtype
    got, want = dev.cpu().numpy(), cpu.numpy()
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


def _run(name, sample, dtype=None, tol=1e-12):
    cpu_in = _tensors(sample.inputs, "cpu", dtype)
    dev_in = _tensors(sample.inputs, "cuda", dtype)
    try:
        want = apply(name, *cpu_in, **sample.attrs)
    except Exception as e:  # noqa: BLE001 - the sample is an error case: CUDA gives the same error
        with pytest.raises(type(e)):
            apply(name, *dev_in, **sample.attrs)
        return
    got = apply(name, *dev_in, **sample.attrs)
    _check_same(want, got, tol)
    _check_gradients(name, sample, cpu_in, dev_in, want, got, tol)


def _check_gradients(name, sample, cpu_in, dev_in, want, got, tol):
    """The gradient of sum(out * w) for each float input, with w fixed: CUDA against the CPU."""
    if not OPS[name].differentiable or not want.dtype.is_floating_point or not sample.fd:
        return
    cpu_leaves = [t.detach().requires_grad_() if isinstance(t, runtime.Tensor) and t.dtype.is_floating_point
                  else t for t in cpu_in]
    dev_leaves = [t.detach().requires_grad_() if isinstance(t, runtime.Tensor) and t.dtype.is_floating_point
                  else t for t in dev_in]
    if not any(isinstance(t, runtime.Tensor) and t.requires_grad for t in cpu_leaves):
        return
    weight = runtime.tensor(np.random.default_rng(7).standard_normal(tuple(want.shape)), dtype=want.dtype)
    (apply(name, *cpu_leaves, **sample.attrs) * weight).sum().backward()
    (apply(name, *dev_leaves, **sample.attrs) * weight.cuda()).sum().backward()
    for c, d in zip(cpu_leaves, dev_leaves):
        if isinstance(c, runtime.Tensor) and c.grad is not None:
            assert d.grad is not None and d.grad.is_cuda
            _check_same(c.grad, d.grad, tol)


@pytest.mark.parametrize("name,k", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_op_on_cuda_matches_cpu_float64(name, k):
    sample = SAMPLES[name][k]
    if _advanced_index(name, sample.inputs):
        try:  # one integer index tensor on one dim runs; other advanced keys raise, naming the op
            _run(name, sample)
        except NoLowering as e:
            assert name in str(e)
        return
    _run(name, sample)


@pytest.mark.parametrize("name", ELEMENTWISE + REDUCTIONS + ["matmul", "linear"])
def test_op_on_cuda_matches_cpu_float32(name):
    for sample in [s for s in SAMPLES[name] if not _complex(s)][:3]:
        if not _advanced_index(name, sample.inputs):
            _run(name, sample, dtype=runtime.float32, tol=2e-5)


def test_complex_tensors_stay_on_the_cpu():
    z = runtime.tensor([1 + 2j])
    with pytest.raises(TypeError, match="complex tensors stay on the CPU"):
        z.to("cuda")
    with pytest.raises(TypeError, match="complex tensors stay on the CPU"):
        runtime.zeros(2, dtype=runtime.cfloat, device="cuda")


def test_every_elementwise_template_has_samples():
    assert set(ELEMENTWISE) - {"detach"} <= set(SAMPLES)


@pytest.mark.parametrize("dtype", [runtime.float32, runtime.float64, runtime.int64, runtime.int32, runtime.bool])
def test_dtypes_and_broadcasting(dtype):
    rng = np.random.default_rng(3)
    a = runtime.tensor(rng.integers(-3, 4, (2, 1, 4)) != 0 if dtype is runtime.bool else
                       rng.integers(1, 4, (2, 1, 4)), dtype=dtype)
    b = runtime.tensor(rng.integers(1, 4, (3, 1)), dtype=dtype)
    for fn in (lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x == y, lambda x, y: runtime.maximum(x, y),
               lambda x, y: x > y, lambda x, y: (x * 1.5).to(dtype), lambda x, y: x.sum((0, 2)),
               lambda x, y: runtime.where(x > 1, x, y)):
        _check_same(fn(a, b), fn(a.cuda(), b.cuda()), 1e-6)


def test_reductions_over_dims_with_keepdim():
    x = runtime.randn(3, 4, 5, dtype=runtime.float64)
    y = x.cuda()
    for dims in (0, 1, 2, (0, 2), (1, 2), (0, 1, 2), -1):
        for keepdim in (False, True):
            _check_same(x.sum(dims, keepdim=keepdim), y.sum(dims, keepdim=keepdim), 1e-12)
            _check_same(x.mean(dims, keepdim=keepdim), y.mean(dims, keepdim=keepdim), 1e-12)
            _check_same(x.amax(dims, keepdim=keepdim), y.amax(dims, keepdim=keepdim), 0)
    for dim in (0, 1, 2):
        for keepdim in (False, True):
            want, got = x.max(dim, keepdim=keepdim), y.max(dim, keepdim=keepdim)
            _check_same(want.values, got.values, 0)
            _check_same(want.indices, got.indices, 0)
            _check_same(x.argmin(dim, keepdim=keepdim), y.argmin(dim, keepdim=keepdim), 0)
    _check_same(x.max(), y.max(), 0)
    _check_same(x.argmax(), y.argmax(), 0)
    # more columns than a block has threads, on a transposed (strided) input
    wide = runtime.randn(37, 3, dtype=runtime.float64)
    _check_same(wide.T.sum(1), wide.cuda().T.sum(1), 1e-12)
    _check_same(wide.T.argmax(1), wide.cuda().T.argmax(1), 0)


def test_nan_and_edge_sizes():
    x = runtime.tensor([[1.0, float("nan"), 3.0], [2.0, 0.5, -1.0]], dtype=runtime.float64)
    for fn in (lambda t: t.amax(1), lambda t: t.argmax(1), lambda t: runtime.maximum(t, t * 0),
               lambda t: t.relu(), lambda t: t.sign(), lambda t: t.clamp(0.0, 2.0)):
        _check_same(fn(x), fn(x.cuda()), 0)
    for shape in ((0, 3), (1, 1), (1,), ()):
        t = runtime.randn(*shape, dtype=runtime.float64)
        for fn in (lambda v: v * 2 + 1, lambda v: v.sum(), lambda v: v.exp().reshape(-1)):
            _check_same(fn(t), fn(t.cuda()), 1e-12)


@pytest.mark.parametrize("a_shape,b_shape", [((5, 7), (7, 6)), ((1, 1), (1, 1)), ((3, 5, 7), (7, 2)),
                                             ((2, 3, 4, 5), (3, 5, 6)), ((9,), (9, 4)), ((4, 9), (9,)),
                                             ((0, 3), (3, 2))])
def test_matmul_shapes_and_gradients(a_shape, b_shape):
    a = runtime.randn(*a_shape, dtype=runtime.float64)
    b = runtime.randn(*b_shape, dtype=runtime.float64)
    ca, cb = a.cuda().requires_grad_(), b.cuda().requires_grad_()
    a.requires_grad_(), b.requires_grad_()
    want, got = a @ b, ca @ cb
    _check_same(want.detach(), got.detach(), 1e-12)
    want.sum().backward()
    got.sum().backward()
    _check_same(a.grad, ca.grad, 1e-12)
    _check_same(b.grad, cb.grad, 1e-12)


def test_linear_batched_with_bias_and_transposed_input():
    x = runtime.randn(2, 3, 6, dtype=runtime.float64)
    w = runtime.randn(4, 6, dtype=runtime.float64)
    bias = runtime.randn(4, dtype=runtime.float64)
    _check_same(F.linear(x, w, bias), F.linear(x.cuda(), w.cuda(), bias.cuda()), 1e-12)
    xt = x.transpose(0, 2).contiguous().transpose(0, 2)  # a non-contiguous input
    _check_same(F.linear(xt, w), F.linear(xt.cuda(), w.cuda()), 1e-12)


def test_views_share_memory_and_see_writes():
    base = runtime.zeros(4, 6, device="cuda", dtype=runtime.float64)
    v = base[1:3].reshape(12)
    t = base.T
    v[0] = 5.0
    assert base[1, 0].item() == 5.0 and t[0, 1].item() == 5.0
    col = base[:, 2]
    col.fill_(1.0)
    assert base.sum().item() == 5.0 + 4.0
    assert base._version == col._version
    moved = base.permute(1, 0).reshape(24)  # not viewable: a copy, like the CPU's
    moved[0] = 100.0
    assert base[0, 0].item() == 0.0


def test_view_ops_and_their_gradients():
    x = runtime.randn(2, 3, 4, dtype=runtime.float64)
    steps = [lambda t: t.reshape(6, 4), lambda t: t.permute(2, 0, 1), lambda t: t.transpose(0, 1),
             lambda t: t[:, 1:, ::2], lambda t: t[1, ..., None], lambda t: t.unsqueeze(1).expand(2, 5, 3, 4),
             lambda t: t.flatten(1), lambda t: t.squeeze(), lambda t: t.view(3, 8), lambda t: t.unbind(1)[2],
             lambda t: runtime.cat([t, t * 2], 1), lambda t: runtime.stack([t, t], 0), lambda t: t.chunk(2, 2)[1],
             lambda t: t.narrow(2, 1, 2), lambda t: t.mT.contiguous()]
    for step in steps:
        c, d = x.detach().requires_grad_(), x.cuda().requires_grad_()
        want, got = step(c), step(d)
        _check_same(want.detach(), got.detach(), 0)
        w = runtime.randn(*want.shape, dtype=runtime.float64)
        (want * w).sum().backward()
        (got * w.cuda()).sum().backward()
        _check_same(c.grad, d.grad, 1e-12)


def test_composites_softmax_layer_norm_cross_entropy_with_gradients():
    x = runtime.randn(4, 5, dtype=runtime.float64)
    target = runtime.tensor([0, 3, 4, 1])
    ln_w, ln_b = runtime.randn(5, dtype=runtime.float64), runtime.randn(5, dtype=runtime.float64)
    fns = [lambda t, y: t.softmax(1), lambda t, y: F.log_softmax(t, 1), lambda t, y: F.gelu(t),
           lambda t, y: F.layer_norm(t, (5,), ln_w.to(t.device), ln_b.to(t.device)),
           lambda t, y: F.cross_entropy(t, y), lambda t, y: F.mse_loss(t, t.detach() * 0.5),
           lambda t, y: t.var(1), lambda t, y: t.tanh().sigmoid().log1p()]
    for fn in fns:
        c, d = x.detach().requires_grad_(), x.cuda().requires_grad_()
        want, got = fn(c, target), fn(d, target.cuda())
        _check_same(want.detach(), got.detach(), 1e-12)
        want.sum().backward()
        got.sum().backward()
        _check_same(c.grad, d.grad, 1e-12)


def test_integer_division_by_zero_raises_as_on_the_cpu():
    a, b = runtime.tensor([4, 5]), runtime.tensor([2, 0])
    for fn in (lambda x, y: x // y, lambda x, y: x % y):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(a, b)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(a.cuda(), b.cuda())
    assert (a.cuda() // 2).tolist() == [2, 2]


def test_kernels_are_cached_per_op_dtypes_and_rank():
    from runtime.cuda import kernels

    x = runtime.randn(3, 4, device="cuda", dtype=runtime.float64)
    x - x
    compiled = len(kernels.sources())
    runtime.randn(5, 2, device="cuda", dtype=runtime.float64) - runtime.randn(5, 1, device="cuda",
                                                                             dtype=runtime.float64)
    assert len(kernels.sources()) == compiled  # the same op, dtypes and rank: the same kernel, broadcast or not
    keys = [key for key in kernels.sources() if key[:2] == ("elementwise", "sub")]
    assert any(key[2] == (np.dtype(np.float64),) * 2 and key[5] == 2 for key in keys)
    assert all("cuda.grid(1)" in kernels.sources()[key] for key in keys)


def test_indexing_one_dim_with_an_integer_tensor_and_embedding():
    x = runtime.randn(3, 5, dtype=runtime.float64)
    for key in ([0, 2, 2], runtime.tensor([[1, -1], [0, 0]]), (slice(None), [4, 0, -5])):
        c, d = x.detach().requires_grad_(), x.cuda().requires_grad_()
        want, got = c[key], d[key]
        _check_same(want.detach(), got.detach(), 0)
        w = runtime.randn(*want.shape, dtype=runtime.float64)
        (want * w).sum().backward()
        (got * w.cuda()).sum().backward()
        _check_same(c.grad, d.grad, 1e-12)  # repeated indices add their gradients up
    y, z = x.clone(), x.cuda()
    y[:, [1, 3]] = runtime.tensor([7.0, 8.0], dtype=runtime.float64)
    z[:, [1, 3]] = runtime.tensor([7.0, 8.0], dtype=runtime.float64)
    _check_same(y, z, 0)
    with pytest.raises(IndexError, match="out of bounds"):
        z[runtime.tensor([3])]
    with pytest.raises(NotImplementedError, match="getitem"):
        z[[0, 1], [1, 2]]
    runtime.manual_seed(0)
    emb = runtime.nn.Embedding(10, 4, padding_idx=0).double()
    dev = copy.deepcopy(emb).cuda()
    idx = runtime.tensor([[1, 2, 1], [9, 0, 3]])
    want, got = emb(idx), dev(idx.cuda())
    _check_same(want.detach(), got.detach(), 0)
    want.sum().backward()
    got.sum().backward()
    _check_same(emb.weight.grad, dev.weight.grad, 0)


def test_floor_keeps_nan_inf_and_large_values():
    x = runtime.tensor([1.5, -1.5, float("inf"), -float("inf"), float("nan"), 1e30, -0.5, 2.0 ** 60],
                       dtype=runtime.float64)
    _check_same(x.floor(), x.cuda().floor(), 0)
    _check_same(x.float().floor(), x.float().cuda().floor(), 0)
