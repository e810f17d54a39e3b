"""Tensor attributes, methods, factories, in-place ops, indexing and module functions vs torch (those tests skip
without torch; the runtime-only ones here still run)."""
import numpy as np
import pytest

import runtime

from helpers import dname, needs_torch, torch

RNG_SEED = 1234
DTYPE_NAMES = ["bool", "int32", "int64", "float16", "float32", "float64"]


def rng():
    return np.random.default_rng(RNG_SEED)


def rt_dtype(name):
    return getattr(runtime, name)


def th_dtype(name):
    return getattr(torch, name)


def pair(array):
    """The same data as a runtime tensor and a torch tensor (independent copies)."""
    array = np.asarray(array)
    return runtime.tensor(array.copy()), torch.tensor(array.copy())


def assert_same(r, t, exact=True):
    """runtime tensor r matches torch tensor t in shape, dtype and values."""
    assert isinstance(r, runtime.Tensor), type(r)
    assert tuple(r.shape) == tuple(t.shape), (tuple(r.shape), tuple(t.shape))
    assert dname(r.dtype) == dname(t.dtype), (r.dtype, t.dtype)
    expected = t.detach().numpy()
    got = np.asarray(r.detach().numpy())
    if exact or not np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)


def sample(shape, dtype_name, gen=None):
    gen = gen or rng()
    if dtype_name == "bool":
        return gen.random(shape) > 0.5
    if dtype_name.startswith("int"):
        return gen.integers(-5, 6, size=shape).astype(dtype_name)
    return gen.standard_normal(shape).astype(dtype_name)


# ---------------------------------------------------------------------------------------------
# attributes
# ---------------------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_dtype_and_shape_attributes(name):
    data = sample((2, 3, 4), name)
    r, t = pair(data)
    assert dname(r.dtype) == dname(t.dtype) == name
    assert r.dtype is rt_dtype(name)
    assert tuple(r.shape) == tuple(t.shape)
    assert tuple(r.size()) == tuple(t.size())
    assert r.shape == r.size()
    for d in range(-3, 3):
        assert r.size(d) == t.size(d)
    assert r.ndim == t.ndim == 3
    assert r.dim() == t.dim()
    assert r.numel() == t.numel() == 24
    assert r.is_floating_point() == t.is_floating_point()
    assert repr(r.shape) == repr(t.shape).replace("torch.", "runtime.")


@needs_torch
def test_size_dim_out_of_range():
    r, t = pair(np.zeros((2, 3)))
    with pytest.raises(IndexError) as t_err:
        t.size(2)
    with pytest.raises(type(t_err.value)):
        r.size(2)


@needs_torch
def test_zero_dim_attributes():
    r, t = pair(np.float32(2.5))
    assert tuple(r.shape) == tuple(t.shape) == ()
    assert r.ndim == t.ndim == 0
    assert r.numel() == t.numel() == 1
    assert r.item() == t.item()


@needs_torch
def test_device():
    r = runtime.zeros(2)
    t = torch.zeros(2)
    assert r.device.type == t.device.type == "cpu"
    assert str(r.device) == str(t.device)
    assert r.device == runtime.device("cpu")
    assert r.is_cuda is t.is_cuda is False


@needs_torch
def test_autograd_attributes_on_leaf_and_result():
    data = sample((3,), "float32")
    r = runtime.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    assert r.requires_grad is t.requires_grad is True
    assert r.is_leaf is t.is_leaf is True
    assert r.grad is None and t.grad is None
    assert r.grad_fn is None and t.grad_fn is None

    r_out, t_out = r * 2 + 1, t * 2 + 1
    assert r_out.requires_grad is t_out.requires_grad is True
    assert r_out.is_leaf is t_out.is_leaf is False
    assert r_out.grad_fn is not None
    assert r_out.grad_fn.name() == t_out.grad_fn.name() == "AddBackward0"

    r_out.sum().backward()
    t_out.sum().backward()
    assert_same(r.grad, t.grad)

    plain_r, plain_t = runtime.tensor(data), torch.tensor(data)
    assert plain_r.requires_grad is plain_t.requires_grad is False
    assert plain_r.is_leaf is plain_t.is_leaf is True
    assert (plain_r * 2).grad_fn is None


def test_requires_grad_setter():
    r = runtime.zeros(3)
    r.requires_grad = True
    assert r.requires_grad
    r.requires_grad_(False)
    assert not r.requires_grad


# ---------------------------------------------------------------------------------------------
# conversions
# ---------------------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_item_and_tolist(name):
    data = sample((2, 3), name)
    r, t = pair(data)
    assert r.tolist() == t.tolist()
    r0, t0 = pair(data[1, 2])
    assert r0.item() == t0.item()
    assert type(r0.item()) is type(t0.item())
    assert r0.tolist() == t0.tolist()
    # a one-element tensor of any rank has an item()
    r1, t1 = pair(data[:1, :1])
    assert r1.item() == t1.item()


def test_numpy_shares_memory():
    r = runtime.tensor([1.0, 2.0, 3.0])
    a = r.numpy()
    assert isinstance(a, np.ndarray)
    assert a.dtype == np.float32
    a[0] = 10.0
    assert r[0].item() == 10.0
    r.add_(1.0)
    np.testing.assert_array_equal(a, [11.0, 3.0, 4.0])


@needs_torch
def test_numpy_on_requires_grad_raises():
    r = runtime.ones(2, requires_grad=True)
    t = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError) as t_err:
        t.numpy()
    with pytest.raises(type(t_err.value), match="detach"):
        r.numpy()
    np.testing.assert_array_equal(r.detach().numpy(), t.detach().numpy())


def test_detach_shares_memory_and_drops_grad():
    data = sample((4,), "float32")
    r = runtime.tensor(data, requires_grad=True)
    y = r * 3
    d = y.detach()
    assert d.requires_grad is False
    assert d.grad_fn is None
    assert d.is_leaf
    d[0] = 100.0
    assert y[0].item() == 100.0
    assert np.shares_memory(d.numpy(), y.detach().numpy())


@needs_torch
def test_clone_copies_and_keeps_grad():
    data = sample((2, 2), "float32")
    r = runtime.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    rc, tc = r.clone(), t.clone()
    assert_same(rc, tc)
    assert rc.requires_grad and not rc.is_leaf
    assert rc.grad_fn.name() == tc.grad_fn.name()
    (rc * rc).sum().backward()
    (tc * tc).sum().backward()
    assert_same(r.grad, t.grad, exact=False)

    plain = runtime.tensor(data)
    copy = plain.clone()
    copy[0, 0] = 99.0
    assert plain[0, 0].item() == data[0, 0]


@needs_torch
def test_contiguous():
    data = sample((3, 4), "float32")
    r, t = pair(data)
    r_t, t_t = r.t(), t.t()
    assert r_t.is_contiguous() == t_t.is_contiguous() is False
    rc, tc = r_t.contiguous(), t_t.contiguous()
    assert rc.is_contiguous() and tc.is_contiguous()
    assert_same(rc, tc)
    assert r.contiguous() is r
    assert t.contiguous() is t
    # contiguous output supports view
    assert_same(rc.view(12), tc.view(12))


@needs_torch
@pytest.mark.parametrize("src", DTYPE_NAMES)
@pytest.mark.parametrize("dst", DTYPE_NAMES)
def test_to_dtype(src, dst):
    data = sample((5,), src) * (3 if src != "bool" else 1)
    r, t = pair(data)
    assert_same(r.to(rt_dtype(dst)), t.to(th_dtype(dst)))
    assert_same(r.to(dtype=rt_dtype(dst)), t.to(dtype=th_dtype(dst)))


@needs_torch
@pytest.mark.parametrize("pytype", [float, int, bool], ids=["float", "int", "bool"])
def test_python_types_as_dtype(pytype):
    """torch maps dtype=float to float64 (not the default dtype), int to int64, bool to bool."""
    assert_same(runtime.ones(2, dtype=pytype), torch.ones(2, dtype=pytype))
    assert_same(runtime.tensor([1, 0], dtype=pytype), torch.tensor([1, 0], dtype=pytype))
    assert_same(runtime.tensor([1.5, 0.0]).to(pytype), torch.tensor([1.5, 0.0]).to(pytype))
    if pytype is not bool:  # torch has no bool arange
        assert_same(runtime.arange(3, dtype=pytype), torch.arange(3, dtype=pytype))


def test_to_same_dtype_and_cpu_return_self():
    r = runtime.zeros(3)
    assert r.to(runtime.float32) is r
    assert r.to("cpu") is r
    assert r.to(runtime.device("cpu")) is r
    assert r.cpu() is r
    out = r.to("cpu", runtime.float64)
    assert out.dtype is runtime.float64


@needs_torch
@pytest.mark.parametrize("method", ["float", "double", "half", "long", "int", "bool"])
def test_conversion_methods(method):
    data = sample((2, 3), "float64") * 4
    r, t = pair(data)
    assert_same(getattr(r, method)(), getattr(t, method)())


@pytest.mark.skipif(runtime.cuda.is_available(), reason="this machine has CUDA (tests/cuda covers it)")
def test_cuda_raises_clear_error():
    r = runtime.zeros(2)
    with pytest.raises(RuntimeError, match="(?i)cuda"):
        r.cuda()
    with pytest.raises(RuntimeError, match="(?i)cuda"):
        r.to("cuda")
    with pytest.raises(RuntimeError, match="(?i)cuda"):
        runtime.zeros(2, device="cuda")
    assert runtime.cuda.is_available() is False


# ---------------------------------------------------------------------------------------------
# repr
# ---------------------------------------------------------------------------------------------

def _repr_cases():
    gen = rng()
    return [
        ("float32", lambda m: m.tensor([1.0, 2.5, -3.0])),
        ("float64", lambda m: m.tensor([[0.5, 1.25], [3.0, 4.0]], dtype=m.float64)),
        ("int64", lambda m: m.tensor([1, 2, 3])),
        ("int32", lambda m: m.tensor([[1, -2], [3, 4]], dtype=m.int32)),
        ("bool", lambda m: m.tensor([True, False])),
        ("float16", lambda m: m.tensor([1.5, 2.0], dtype=m.float16)),
        ("scalar", lambda m: m.tensor(3.5)),
        ("empty", lambda m: m.zeros(0)),
        ("random", lambda m, d=gen.standard_normal((3, 4)).astype(np.float32): m.tensor(d)),
        ("requires_grad", lambda m: m.tensor([1.0, 2.0], requires_grad=True)),
        ("add_backward", lambda m: m.tensor([1.0, 2.0], requires_grad=True) + 1),
        ("mul_backward", lambda m: m.tensor([[1.0, 2.0]], requires_grad=True) * 3),
        ("sum_backward", lambda m: m.tensor([1.0, 2.0], requires_grad=True).sum()),
    ]


@needs_torch
@pytest.mark.parametrize("name,make", _repr_cases(), ids=[c[0] for c in _repr_cases()])
def test_repr_matches_torch(name, make):
    r, t = make(runtime), make(torch)
    assert repr(r) == repr(t).replace("torch.", "runtime.")


def test_repr_grad_fn_suffix():
    r = runtime.tensor([1.0, 2.0], requires_grad=True)
    assert repr(r).endswith("requires_grad=True)")
    assert repr(r + r).endswith("grad_fn=<AddBackward0>)")


# ---------------------------------------------------------------------------------------------
# factories
# ---------------------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("data", [
    [1, 2, 3], [1.0, 2.0], [True, False], [[1, 2], [3, 4]], 5, 2.5, True, [1, 2.5], [],
])
def test_tensor_from_python_data(data):
    assert_same(runtime.tensor(data), torch.tensor(data))


@needs_torch
@pytest.mark.parametrize("make", [
    lambda m: m.tensor(np.float64(1.5)), lambda m: m.tensor(np.int32(3)), lambda m: m.tensor(np.bool_(True)),
    lambda m: m.tensor([m.tensor(1.5), m.tensor(2.5)]), lambda m: m.tensor(m.tensor([1, 2], dtype=m.int32)),
    lambda m: m.tensor(np.arange(6).reshape(2, 3).T), lambda m: m.tensor([[True], [False]]),
    lambda m: m.tensor(range(4)), lambda m: m.tensor((1.0, 2)),
], ids=["np_f64", "np_i32", "np_bool", "list_of_0d", "from_tensor", "np_transposed", "bool_2d", "range", "tuple"])
def test_tensor_from_other_data(make):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about tensor(tensor)
        assert_same(make(runtime), make(torch))


@needs_torch
@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_tensor_from_numpy_keeps_dtype_and_copies(name):
    data = sample((2, 3), name)
    r, t = runtime.tensor(data), torch.tensor(data)
    assert_same(r, t)
    original = data.copy()
    data[...] = data[0, 0] if name == "bool" else 0
    np.testing.assert_array_equal(r.numpy(), original)


@needs_torch
def test_tensor_with_dtype_argument():
    for name in DTYPE_NAMES:
        assert_same(runtime.tensor([0, 1, 2], dtype=rt_dtype(name)), torch.tensor([0, 1, 2], dtype=th_dtype(name)))


@needs_torch
def test_as_tensor_shares_memory_with_numpy_and_tensor():
    a = np.arange(4, dtype=np.float32)
    r = runtime.as_tensor(a)
    t = torch.as_tensor(a.copy())
    assert_same(r, t)
    a[0] = 42.0
    assert r[0].item() == 42.0
    base = runtime.tensor([1.0, 2.0])
    assert runtime.as_tensor(base) is base
    converted = runtime.as_tensor(a, dtype=runtime.float64)
    assert converted.dtype is runtime.float64
    a[1] = -1.0
    assert converted[1].item() == 1.0  # a converted tensor is a copy
    assert_same(runtime.as_tensor([1, 2]), torch.as_tensor([1, 2]))


@needs_torch
@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_from_numpy_shares_memory(name):
    a = sample((3,), name)
    r, t = runtime.from_numpy(a), torch.from_numpy(a.copy())
    assert_same(r, t)
    a[0] = not a[0] if name == "bool" else 7
    assert r[0].item() == a[0].item()
    r[1] = a[0].item()
    assert a[1] == a[0]


def test_from_numpy_rejects_non_array():
    with pytest.raises(TypeError):
        runtime.from_numpy([1, 2, 3])


@needs_torch
@pytest.mark.parametrize("factory", ["zeros", "ones", "empty"])
def test_zeros_ones_empty(factory):
    for size_args in [(2, 3), ((2, 3),), ([4],), ((),), (0, 2)]:
        r, t = getattr(runtime, factory)(*size_args), getattr(torch, factory)(*size_args)
        assert tuple(r.shape) == tuple(t.shape)
        assert dname(r.dtype) == dname(t.dtype)
        if factory != "empty":
            assert_same(r, t)
    for name in DTYPE_NAMES:
        r = getattr(runtime, factory)(2, dtype=rt_dtype(name))
        t = getattr(torch, factory)(2, dtype=th_dtype(name))
        assert dname(r.dtype) == dname(t.dtype)
        assert tuple(r.shape) == tuple(t.shape)


def test_zeros_requires_grad():
    r = runtime.zeros(2, requires_grad=True)
    assert r.requires_grad and r.is_leaf


@needs_torch
@pytest.mark.parametrize("fill", [3, 2.5, True, -1, 0.0, False])
def test_full_infers_dtype_from_fill_value(fill):
    assert_same(runtime.full((2, 3), fill), torch.full((2, 3), fill))


@needs_torch
@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_full_with_dtype(name):
    assert_same(runtime.full((3,), 1, dtype=rt_dtype(name)), torch.full((3,), 1, dtype=th_dtype(name)))


@needs_torch
@pytest.mark.parametrize("args", [(5,), (2, 9), (1, 10, 3), (10, 1, -2), (0,), (3, 3)])
def test_arange_int(args):
    assert_same(runtime.arange(*args), torch.arange(*args))


@needs_torch
@pytest.mark.parametrize("args", [(2.5,), (0.0, 1.0, 0.1), (1, 4.5), (0, 1, 0.25), (-1.0, 1.0, 0.3)])
def test_arange_float(args):
    assert_same(runtime.arange(*args), torch.arange(*args), exact=False)


@needs_torch
def test_arange_dtype():
    assert_same(runtime.arange(5, dtype=runtime.float64), torch.arange(5, dtype=torch.float64))
    assert_same(runtime.arange(0, 6, 2, dtype=runtime.int32), torch.arange(0, 6, 2, dtype=torch.int32))


@needs_torch
@pytest.mark.parametrize("args", [(0, 1, 5), (-2.0, 3.0, 7), (1, 1, 1), (0, 10, 0), (5, -5, 11)])
def test_linspace(args):
    assert_same(runtime.linspace(*args), torch.linspace(*args), exact=False)
    assert_same(runtime.linspace(*args, dtype=runtime.float64), torch.linspace(*args, dtype=torch.float64),
                exact=False)


@needs_torch
@pytest.mark.parametrize("args", [(3,), (2, 4), (4, 2), (0,)])
def test_eye(args):
    assert_same(runtime.eye(*args), torch.eye(*args))
    assert_same(runtime.eye(*args, dtype=runtime.int64), torch.eye(*args, dtype=torch.int64))


@needs_torch
def test_rand_randn_shapes_dtypes_ranges():
    for size in [(3, 4), ((2, 5),), (7,)]:
        r, t = runtime.rand(*size), torch.rand(*size)
        assert tuple(r.shape) == tuple(t.shape) and dname(r.dtype) == dname(t.dtype)
        values = r.numpy()
        assert values.min() >= 0.0 and values.max() < 1.0
    big = runtime.rand(2000).numpy()
    assert 0.4 < big.mean() < 0.6
    normal = runtime.randn(4000).numpy()
    assert abs(normal.mean()) < 0.1 and 0.9 < normal.std() < 1.1
    for name in ["float16", "float32", "float64"]:
        assert dname(runtime.rand(3, dtype=rt_dtype(name)).dtype) == dname(torch.rand(3, dtype=th_dtype(name)).dtype)
        assert dname(runtime.randn(3, dtype=rt_dtype(name)).dtype) == name
    assert runtime.rand(2, requires_grad=True).requires_grad


@needs_torch
def test_randint_forms():
    r, t = runtime.randint(10, (3, 4)), torch.randint(10, (3, 4))
    assert tuple(r.shape) == tuple(t.shape) and dname(r.dtype) == dname(t.dtype)
    values = runtime.randint(-3, 4, (1000,)).numpy()
    assert values.min() >= -3 and values.max() <= 3
    assert set(np.unique(values).tolist()) == set(range(-3, 4))
    r = runtime.randint(0, 5, size=(6,), dtype=runtime.int32)
    t = torch.randint(0, 5, size=(6,), dtype=torch.int32)
    assert dname(r.dtype) == dname(t.dtype)
    r = runtime.randint(0, 5, (2,), dtype=runtime.float32)
    assert r.dtype is runtime.float32


@needs_torch
@pytest.mark.parametrize("name", ["float32", "float64", "int32", "int64", "bool", "float16"])
def test_like_factories(name):
    data = sample((2, 3), name)
    r, t = pair(data)
    for fn in ["zeros_like", "ones_like", "empty_like"]:
        rr, tt = getattr(runtime, fn)(r), getattr(torch, fn)(t)
        assert tuple(rr.shape) == tuple(tt.shape) and dname(rr.dtype) == dname(tt.dtype)
        if fn != "empty_like":
            assert_same(rr, tt)
    assert_same(runtime.full_like(r, 1), torch.full_like(t, 1))
    assert_same(runtime.zeros_like(r, dtype=runtime.float64), torch.zeros_like(t, dtype=torch.float64))


@needs_torch
def test_random_like_factories():
    data = sample((3, 2), "float64")
    r, t = pair(data)
    for fn in ["rand_like", "randn_like"]:
        rr, tt = getattr(runtime, fn)(r), getattr(torch, fn)(t)
        assert tuple(rr.shape) == tuple(tt.shape) and dname(rr.dtype) == dname(tt.dtype)
    u = runtime.rand_like(r).numpy()
    assert u.min() >= 0 and u.max() < 1
    ri, ti = runtime.tensor(sample((4,), "int64")), torch.tensor(sample((4,), "int64"))
    rr, tt = runtime.randint_like(ri, 5), torch.randint_like(ti, 5)
    assert tuple(rr.shape) == tuple(tt.shape) and dname(rr.dtype) == dname(tt.dtype)
    assert rr.numpy().min() >= 0 and rr.numpy().max() < 5
    rr = runtime.randint_like(ri, 2, 4)
    assert rr.numpy().min() >= 2 and rr.numpy().max() < 4


def test_manual_seed_reproducibility():
    for fn, args in [(runtime.rand, (5,)), (runtime.randn, (2, 3)), (runtime.randint, (0, 100, (8,))),
                     (runtime.randperm, (10,))]:
        runtime.manual_seed(7)
        first = fn(*args).numpy().copy()
        runtime.manual_seed(7)
        second = fn(*args).numpy().copy()
        np.testing.assert_array_equal(first, second)
        third = fn(*args).numpy()
        if fn is not runtime.randperm:
            assert not np.array_equal(first, third)
    runtime.manual_seed(1)
    a = runtime.rand(5).numpy().copy()
    runtime.manual_seed(2)
    b = runtime.rand(5).numpy().copy()
    assert not np.array_equal(a, b)
    assert runtime.manual_seed(3) is not None
    assert runtime.initial_seed() == 3


def test_generator_argument():
    g1 = runtime.Generator().manual_seed(11)
    g2 = runtime.Generator()
    g2.manual_seed(11)
    assert isinstance(g1, runtime.Generator)
    a = runtime.rand(6, generator=g1).numpy().copy()
    runtime.manual_seed(0)  # the default generator must not affect an explicit one
    b = runtime.rand(6, generator=g2).numpy().copy()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(runtime.randn(3, generator=g1).numpy(), runtime.randn(3, generator=g2).numpy())
    np.testing.assert_array_equal(runtime.randint(0, 50, (4,), generator=g1).numpy(),
                                  runtime.randint(0, 50, (4,), generator=g2).numpy())
    # drawing from an explicit generator leaves the default stream untouched
    runtime.manual_seed(5)
    expected = runtime.rand(3).numpy().copy()
    runtime.manual_seed(5)
    runtime.rand(4, generator=g1)
    np.testing.assert_array_equal(runtime.rand(3).numpy(), expected)
    assert g1.initial_seed() == 11


def test_generator_state_roundtrip():
    g = runtime.Generator().manual_seed(3)
    state = g.get_state()
    a = runtime.rand(4, generator=g).numpy().copy()
    g.set_state(state)
    np.testing.assert_array_equal(runtime.rand(4, generator=g).numpy(), a)


# ---------------------------------------------------------------------------------------------
# in-place ops
# ---------------------------------------------------------------------------------------------

def _inplace_check(make_data, op):
    """Apply op to a base tensor and to a view of it; compare with torch and check identity/aliasing."""
    r, t = pair(make_data())
    r_view, t_view = r[1:], t[1:]
    r_ret, t_ret = op(r_view), op(t_view)
    assert r_ret is r_view
    assert t_ret is t_view
    assert_same(r_view, t_view, exact=False)
    assert_same(r, t, exact=False)  # the write is seen through the base
    assert r_view._version == t_view._version and r._version == t._version  # one bump, shared with the base
    return r, t


FLOAT_DATA = rng().standard_normal((4, 3)).astype(np.float32)
INT_DATA = rng().integers(-9, 10, size=(4, 3))


@needs_torch
@pytest.mark.parametrize("name,op", [
    ("add_scalar", lambda x: x.add_(2)),
    ("add_tensor", lambda x: x.add_(x.new_ones(3) * 0.5)),
    ("add_alpha", lambda x: x.add_(x.new_ones(3), alpha=3)),
    ("add_broadcast_row", lambda x: x.add_(x.new_ones(1, 3))),
    ("mul_scalar", lambda x: x.mul_(-1.5)),
    ("mul_tensor", lambda x: x.mul_(x.clone())),
    ("zero_", lambda x: x.zero_()),
    ("fill_", lambda x: x.fill_(0.25)),
    ("copy_", lambda x: x.copy_(x.clone() * 2 - 1)),
    ("copy_broadcast", lambda x: x.copy_(x.new_ones(3) * 4)),
    ("clamp_both", lambda x: x.clamp_(-0.5, 0.5)),
    ("clamp_min", lambda x: x.clamp_(min=0.0)),
    ("clamp_max", lambda x: x.clamp_(max=0.1)),
    ("iadd", lambda x: x.__iadd__(1)),
    ("imul", lambda x: x.__imul__(2)),
])
def test_inplace_float(name, op):
    _inplace_check(lambda: FLOAT_DATA, op)


@needs_torch
@pytest.mark.parametrize("name,op", [
    ("add_scalar", lambda x: x.add_(2)),
    ("mul_scalar", lambda x: x.mul_(3)),
    ("zero_", lambda x: x.zero_()),
    ("fill_", lambda x: x.fill_(7)),
    ("clamp_", lambda x: x.clamp_(-3, 3)),
    ("copy_from_float", lambda x: x.copy_(x.float() * 1.5)),
])
def test_inplace_int(name, op):
    _inplace_check(lambda: INT_DATA, op)


@needs_torch
def test_copy_converts_dtype():
    r, t = pair(np.zeros(3, dtype=np.int32))
    src = np.array([1.7, -2.2, 3.9])
    r.copy_(runtime.tensor(src))
    t.copy_(torch.tensor(src))
    assert_same(r, t)


@needs_torch
def test_inplace_on_transposed_view():
    r, t = pair(FLOAT_DATA)
    r.t().mul_(2)
    t.t().mul_(2)
    assert_same(r, t)
    r.t()[0].fill_(-1)
    t.t()[0].fill_(-1)
    assert_same(r, t)


@needs_torch
def test_inplace_on_nonleaf_is_recorded():
    data = sample((3,), "float32")
    r = runtime.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    ry, ty = r * 2, t * 2
    ry.add_(1)
    ty.add_(1)
    factor = sample((3,), "float32", np.random.default_rng(5))
    ry.mul_(runtime.tensor(factor))
    ty.mul_(torch.tensor(factor))
    assert_same(ry, ty, exact=False)
    ry.sum().backward()
    ty.sum().backward()
    assert_same(r.grad, t.grad, exact=False)


# ---------------------------------------------------------------------------------------------
# indexing
# ---------------------------------------------------------------------------------------------

IDX_DATA = rng().standard_normal((4, 5, 6)).astype(np.float32)

BASIC_KEYS = [
    1, -1, (0, 2), (1, 2, 3), (-1, -2, -3),
    slice(1, 3), slice(None, None, 2), slice(None, None, 3), (slice(None), slice(1, None, 2)),
    (slice(None, 3), 1, slice(0, 6, 4)),
    slice(-3, None), slice(10, 20), slice(2, 1),
    None, (None, 0), (slice(None), None, 2), (None, Ellipsis, None),
    Ellipsis, (Ellipsis, 0), (0, Ellipsis), (Ellipsis, slice(1, 3), None), (1, Ellipsis, slice(None, None, 2)),
]


@needs_torch
@pytest.mark.parametrize("key", BASIC_KEYS, ids=[repr(k) for k in BASIC_KEYS])
def test_basic_indexing(key):
    r, t = pair(IDX_DATA)
    assert_same(r[key], t[key])


@needs_torch
def test_basic_indexing_returns_view():
    r, t = pair(IDX_DATA)
    rv, tv = r[1, ::2], t[1, ::2]
    rv.fill_(0.0)
    tv.fill_(0.0)
    assert_same(r, t)


@needs_torch
def test_index_by_zero_dim_int_tensor():
    r, t = pair(IDX_DATA)
    assert_same(r[runtime.tensor(2)], t[torch.tensor(2)])


def _adv_keys(m):
    mask_np = IDX_DATA[:, :, 0] > 0
    return [
        m.tensor([0, 2, 3]),
        m.tensor([[0, 1], [3, 2]]),
        [1, 0, 1],
        [-1, 0],
        (m.tensor([0, 1]), m.tensor([2, 3])),
        (slice(None), m.tensor([4, 0])),
        (m.tensor([0, 3]), slice(1, 3), m.tensor([5, 0])),
        (Ellipsis, m.tensor([1, 1, 2])),
        (1, [0, 2], slice(None)),
        m.tensor(mask_np[:, 0]),
        m.tensor(mask_np),
        (m.tensor(mask_np[:, 0]), 2),
        (slice(None), m.tensor(mask_np[0])),
        m.tensor(IDX_DATA > 0.5),
        (m.tensor([True, False, True, False]), slice(None), m.tensor([0, 5])),
    ]


@needs_torch
@pytest.mark.parametrize("k", range(len(_adv_keys(runtime))))
def test_advanced_indexing(k):
    r, t = pair(IDX_DATA)
    assert_same(r[_adv_keys(runtime)[k]], t[_adv_keys(torch)[k]])


@needs_torch
@pytest.mark.parametrize("key", [
    np.array([3, 1]), np.array([[0], [2]]), (np.array([0, 1]), np.array([1, 4])),
    IDX_DATA[:, 0, 0] > 0, [True, False, True, True], ([0, 1], [2, 3]),
], ids=["np_int", "np_int_2d", "np_pair", "np_bool", "list_bool", "list_pair"])
def test_advanced_indexing_with_numpy_and_list_keys(key):
    r, t = pair(IDX_DATA)
    assert_same(r[key], t[key])


@needs_torch
def test_advanced_indexing_returns_copy():
    r, t = pair(IDX_DATA)
    r_sel, t_sel = r[[0, 1]], t[[0, 1]]
    r_sel.fill_(5.0)
    t_sel.fill_(5.0)
    assert_same(r, t)


@needs_torch
def test_int32_index_tensor():
    r, t = pair(IDX_DATA)
    assert_same(r[runtime.tensor([2, 0], dtype=runtime.int32)], t[torch.tensor([2, 0], dtype=torch.int32)])


@needs_torch
def test_indexing_gradient():
    data = sample((4, 3), "float32")
    r = runtime.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    (r[[0, 0, 2], 1:].sum() + r[1].sum() * 2).backward()
    (t[[0, 0, 2], 1:].sum() + t[1].sum() * 2).backward()
    assert_same(r.grad, t.grad)


def _setitem_cases(m):
    mask = IDX_DATA > 0
    return [
        (0, 1.5),
        ((1, 2), -3.0),
        ((1, 2, 3), 9.0),
        (slice(None, None, 2), 0.0),
        ((slice(None), slice(1, None, 2)), 7),
        (Ellipsis, 2.0),
        ((Ellipsis, 0), m.tensor(np.arange(5, dtype=np.float32))),          # broadcast over dim 0
        ((0,), m.tensor(np.arange(6, dtype=np.float32))),                   # [6] into [5, 6]
        ((slice(None), 0), m.tensor(np.ones((4, 1), dtype=np.float32)) * 3),   # [4, 1] into [4, 6]
        ((slice(None), 0), m.tensor(np.ones((1, 4, 6), dtype=np.float32))),    # leading 1 dropped
        (m.tensor([0, 2]), m.tensor(np.full((5, 6), -1.0, dtype=np.float32))),
        ([1, 3], 4.0),
        ((m.tensor([0, 1]), m.tensor([2, 3])), m.tensor([10.0, 20.0])),
        (m.tensor(mask), 0.0),
        (m.tensor(mask[:, 0, 0]), m.tensor(np.zeros((5, 6), dtype=np.float32))),
        ((slice(1, 3), None, 0), m.tensor(np.float32(8.0))),
        ((1, slice(None)), m.tensor(np.ones(6, dtype=np.float64))),       # float64 source into float32
        ((2, 3), m.tensor([1, 2, 3, 4, 5, 6])),                            # int source into float32
    ]


@needs_torch
@pytest.mark.parametrize("k", range(len(_setitem_cases(runtime))))
def test_setitem(k):
    r, t = pair(IDX_DATA)
    r_key, r_val = _setitem_cases(runtime)[k]
    t_key, t_val = _setitem_cases(torch)[k]
    try:
        t[t_key] = t_val
    except RuntimeError as t_err:
        with pytest.raises(type(t_err)):
            r[r_key] = r_val
        return
    r[r_key] = r_val
    assert_same(r, t)


@needs_torch
def test_setitem_into_int_tensor_truncates_float():
    r, t = pair(INT_DATA)
    r[0] = 2.7
    t[0] = 2.7
    r[1] = runtime.tensor([1.9, -1.9, 0.5])
    t[1] = torch.tensor([1.9, -1.9, 0.5])
    assert_same(r, t)


@needs_torch
def test_setitem_writes_through_views():
    r, t = pair(IDX_DATA)
    rv, tv = r[1], t[1]
    rv[2:4] = 0.5
    tv[2:4] = 0.5
    assert_same(r, t)
    assert_same(rv, tv)


@needs_torch
def test_setitem_bumps_version_and_grad_flows():
    data = sample((4,), "float32")
    r = runtime.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    r2, t2 = r * 1, t * 1
    r2[1:3] = r[:2] * 5
    t2[1:3] = t[:2] * 5
    assert_same(r2, t2)
    r2.sum().backward()
    t2.sum().backward()
    assert_same(r.grad, t.grad)


# ---------------------------------------------------------------------------------------------
# module-level functions
# ---------------------------------------------------------------------------------------------

UNARY = ["abs", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "relu", "neg", "floor", "ceil",
         "sign", "log1p", "rsqrt", "reciprocal", "erf", "square", "round", "isnan", "isinf", "isfinite"]


@needs_torch
@pytest.mark.parametrize("name", UNARY)
def test_module_unary_functions(name):
    data = np.abs(sample((3, 4), "float32")) + 0.1
    data[0] *= -1
    r, t = pair(data)
    rr, tt = getattr(runtime, name)(r), getattr(torch, name)(t)
    assert_same(rr, tt, exact=False)
    assert_same(getattr(r, name)(), tt, exact=False)


@needs_torch
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "eq", "lt", "ge",
                                  "floor_divide", "remainder"])
def test_module_binary_functions(name):
    gen = rng()
    a = gen.standard_normal((3, 4)).astype(np.float32)
    b = gen.standard_normal((4,)).astype(np.float32) + 2.0
    if name == "pow":
        a = np.abs(a)
    (ra, ta), (rb, tb) = pair(a), pair(b)
    assert_same(getattr(runtime, name)(ra, rb), getattr(torch, name)(ta, tb), exact=False)
    if name not in ("maximum", "minimum"):  # torch takes only tensors there
        assert_same(getattr(runtime, name)(ra, 2), getattr(torch, name)(ta, 2), exact=False)


@needs_torch
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_and_stack(dim):
    gen = rng()
    parts = [gen.standard_normal((2, 3)).astype(np.float32) for _ in range(3)]
    rs, ts = [runtime.tensor(p) for p in parts], [torch.tensor(p) for p in parts]
    assert_same(runtime.stack(rs, dim), torch.stack(ts, dim))
    assert_same(runtime.stack(rs, dim=dim), torch.stack(ts, dim=dim))
    assert_same(runtime.cat(rs, dim), torch.cat(ts, dim))
    assert_same(runtime.cat(tuple(rs), dim=dim), torch.cat(tuple(ts), dim=dim))


@needs_torch
def test_cat_uneven_sizes():
    gen = rng()
    a, b = gen.standard_normal((2, 3)).astype(np.float32), gen.standard_normal((4, 3)).astype(np.float32)
    assert_same(runtime.cat([runtime.tensor(a), runtime.tensor(b)]), torch.cat([torch.tensor(a), torch.tensor(b)]))
    c = gen.standard_normal((2, 5)).astype(np.float32)
    assert_same(runtime.cat([runtime.tensor(a), runtime.tensor(c)], 1),
                torch.cat([torch.tensor(a), torch.tensor(c)], 1))


@needs_torch
def test_where():
    gen = rng()
    cond = gen.random((3, 4)) > 0.5
    a = gen.standard_normal((3, 4)).astype(np.float32)
    b = gen.standard_normal((4,)).astype(np.float32)
    rc, tc = pair(cond)
    (ra, ta), (rb, tb) = pair(a), pair(b)
    assert_same(runtime.where(rc, ra, rb), torch.where(tc, ta, tb))
    assert_same(runtime.where(rc, ra, 0.0), torch.where(tc, ta, 0.0))
    assert_same(runtime.where(rc, 1.0, rb), torch.where(tc, 1.0, tb))
    assert_same(runtime.where(ra > 0, ra, -ra), torch.where(ta > 0, ta, -ta))
    assert_same(ra.where(rc, rb), ta.where(tc, tb))


@needs_torch
@pytest.mark.parametrize("name,kwargs", [
    ("sum", {}), ("sum", {"dim": 1}), ("sum", {"dim": (0, 1), "keepdim": True}),
    ("mean", {}), ("mean", {"dim": -1}), ("prod", {"dim": 0}),
    ("amax", {"dim": 1}), ("amin", {}), ("argmax", {}), ("argmax", {"dim": 1}), ("argmin", {"dim": 0}),
    ("var", {"dim": 1}), ("std", {}), ("logsumexp", {"dim": 1}), ("softmax", {"dim": 1}),
    ("log_softmax", {"dim": 0}), ("all", {}), ("any", {"dim": 1}),
])
def test_module_reductions(name, kwargs):
    data = sample((3, 4), "float32")
    if name in ("all", "any"):
        data = data > 0
    r, t = pair(data)
    assert_same(getattr(runtime, name)(r, **kwargs), getattr(torch, name)(t, **kwargs), exact=False)


@needs_torch
def test_module_max_min_with_dim():
    data = sample((3, 4), "float32")
    r, t = pair(data)
    rv, ri = runtime.max(r, 1)
    tv, ti = torch.max(t, 1)
    assert_same(rv, tv)
    assert_same(ri, ti)
    rv, ri = runtime.min(r, dim=0, keepdim=True)
    tv, ti = torch.min(t, dim=0, keepdim=True)
    assert_same(rv, tv)
    assert_same(ri, ti)
    assert_same(runtime.max(r), torch.max(t))


@needs_torch
@pytest.mark.parametrize("name,args", [
    ("reshape", ((4, 3),)), ("transpose", (0, 1)), ("permute", ((1, 0),)), ("flatten", ()),
    ("unsqueeze", (1,)), ("squeeze", ()), ("t", ()), ("clamp", (-0.5, 0.5)), ("matmul", None),
    ("numel", ()), ("is_tensor", ()), ("is_floating_point", ()), ("clone", ()), ("detach", ()),
    ("chunk", (2, 1)), ("split", (2, 1)), ("unbind", (0,)), ("narrow", (1, 1, 2)), ("select", (1, 2)),
])
def test_module_shape_and_misc_functions(name, args):
    data = sample((3, 4), "float32")
    r, t = pair(data)
    if name == "matmul":
        other = sample((4, 2), "float32")
        rr, tt = runtime.matmul(r, runtime.tensor(other)), torch.matmul(t, torch.tensor(other))
    else:
        rr, tt = getattr(runtime, name)(r, *args), getattr(torch, name)(t, *args)
    if isinstance(tt, (tuple, list)):
        assert len(rr) == len(tt)
        for a, b in zip(rr, tt):
            assert_same(a, b)
    elif isinstance(tt, torch.Tensor):
        assert_same(rr, tt, exact=False)
    else:
        assert rr == tt


@needs_torch
def test_module_functions_accept_keywords():
    data = sample((2, 3), "float32")
    r, t = pair(data)
    assert_same(runtime.add(r, r, alpha=2), torch.add(t, t, alpha=2))
    assert_same(runtime.sum(r, dim=0, keepdim=True), torch.sum(t, dim=0, keepdim=True))
    assert_same(runtime.clamp(r, min=0.0), torch.clamp(t, min=0.0))
    assert_same(runtime.div(r, 0.7, rounding_mode="floor"), torch.div(t, 0.7, rounding_mode="floor"), exact=False)
    assert_same(runtime.div(r, 0.7, rounding_mode="trunc"), torch.div(t, 0.7, rounding_mode="trunc"), exact=False)


@needs_torch
def test_operators_with_python_scalars_on_left():
    data = np.abs(sample((3,), "float32")) + 0.5
    r, t = pair(data)
    for fn in [lambda x: 2 + x, lambda x: 2 - x, lambda x: 2 * x, lambda x: 2 / x, lambda x: 2 ** x,
               lambda x: 7 // x, lambda x: 7 % x, lambda x: -x, lambda x: abs(-x), lambda x: x ** 2]:
        assert_same(fn(r), fn(t), exact=False)


@needs_torch
def test_numpy_scalar_operands():
    data = sample((3,), "float32")
    r, t = pair(data)
    assert_same(r * np.float64(2.0), t * np.float64(2.0))
    assert_same(r + np.int64(3), t + np.int64(3))


def test_memory_and_device_attributes_as_torch_has_them():
    t = runtime.ones(2, 3)
    assert t.is_cpu and not (t.is_xpu or t.is_mps or t.is_xla) and not t.is_pinned() and t.pin_memory() is t
    assert (t.itemsize, t.nbytes) == (4, 24) and runtime.ones(2, dtype=runtime.float64).itemsize == 8
    assert t.data_ptr() == t[0].data_ptr() and t[1].data_ptr() == t.data_ptr() + 12
