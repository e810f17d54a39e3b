"""The behaviour differences issue 15 lists for torch.* functions and Tensor methods, each checked as torch does it."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.autograd import gradcheck


def T(values, **kw):
    return runtime.tensor(values, **kw)


def test_cat_skips_an_empty_1d_tensor_but_promotes_with_it():
    out = runtime.cat([runtime.tensor([], dtype=runtime.float64), runtime.ones(2, 3)])
    assert out.shape == (2, 3) and out.dtype is runtime.float64
    assert runtime.cat([runtime.ones(2, 3), runtime.zeros(0)], 1).shape == (2, 3)
    assert runtime.cat([runtime.zeros(0), runtime.zeros(0)]).shape == (0,)


def test_concatenate_takes_axis():
    a, b = runtime.ones(2, 2), runtime.zeros(2, 1)
    assert runtime.concatenate([a, b], axis=1).shape == (2, 3)
    assert runtime.cat((a, a), axis=0).shape == (4, 2)


@pytest.mark.parametrize("factory", ["zeros", "ones", "empty", "rand", "randn"])
def test_factories_take_size_keyword(factory):
    out = getattr(runtime, factory)(size=(2, 3), dtype=runtime.float64)
    assert out.shape == (2, 3) and out.dtype is runtime.float64


def test_round_with_decimals(torch):
    values = [1.2345, 2.5, -0.125, 1250.0, 0.5, 1.5, -2.675]
    for decimals in (0, 1, 2, -1, -2):
        ours = runtime.round(T(values, dtype=runtime.float64), decimals=decimals).numpy()
        theirs = torch.round(torch.tensor(values, dtype=torch.float64), decimals=decimals).numpy()
        np.testing.assert_array_equal(ours, theirs)
    assert runtime.round(T([1, 2])).tolist() == [1, 2]


def test_take_along_dim_without_dim_flattens(torch):
    x, i = np.arange(12.0).reshape(3, 4), np.array([[0, 5], [11, 2]])
    ours = runtime.take_along_dim(T(x), T(i))
    np.testing.assert_array_equal(ours.numpy(), torch.take_along_dim(torch.tensor(x), torch.tensor(i)).numpy())
    # with dim, the two broadcast over the other dims
    j = np.array([[0], [3], [1]])
    np.testing.assert_array_equal(runtime.take_along_dim(T(x), T(j), 1).numpy(),
                                  torch.take_along_dim(torch.tensor(x), torch.tensor(j), 1).numpy())


def test_where_with_one_argument_is_nonzero_as_tuple():
    rows, cols = runtime.where(T([[0.0, 1.0], [2.0, 0.0]]))
    assert rows.tolist() == [0, 1] and cols.tolist() == [1, 0] and rows.dtype is runtime.int64


@pytest.mark.parametrize("call", [lambda x: runtime.div(x, 2.0, rounding_mode="floor"),
                                  lambda x: runtime.floor_divide(x, 2.0), lambda x: x // 2])
def test_floor_division_keeps_requires_grad_with_a_zero_gradient(call):
    x = runtime.randn(3, requires_grad=True)
    out = call(x)
    assert out.requires_grad
    out.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0]


def test_clamp_in_place_with_tensor_bounds(torch):
    x = np.array([-2.0, 0.3, 5.0])
    lo, hi = np.array([-1.0, 0.5, 0.0]), np.array([1.0, 1.0, 4.0])
    for name in ("clamp_", "clip_"):
        ours, theirs = T(x), torch.tensor(x)
        getattr(ours, name)(T(lo), T(hi))
        getattr(theirs, name)(torch.tensor(lo), torch.tensor(hi))
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    # recorded for autograd
    w = runtime.tensor(x, requires_grad=True)
    y = w * 1
    y.clamp_(min=T(lo))
    y.sum().backward()
    assert w.grad.tolist() == [0.0, 0.0, 1.0]  # clamped entries get no gradient


@pytest.mark.parametrize("mode", ["floor", "trunc", None])
def test_div_in_place_with_rounding_mode(torch, mode):
    x = np.array([-7.0, 7.5, 3.0])
    ours, theirs = T(x), torch.tensor(x)
    ours.div_(2.0, rounding_mode=mode)
    theirs.div_(2.0, rounding_mode=mode)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    ints = T([7, -7])
    ints.div_(2, rounding_mode="floor")
    assert ints.tolist() == [3, -4] and ints.dtype is runtime.int64


def test_type_names_as_torch():
    assert runtime.zeros(2).type() == "torch.FloatTensor"
    assert runtime.zeros(2, dtype=runtime.float64).type() == "torch.DoubleTensor"
    assert runtime.zeros(2, dtype=runtime.int64).type() == "torch.LongTensor"
    assert runtime.zeros(2, dtype=runtime.bool).type() == "torch.BoolTensor"
    assert runtime.zeros(2).type("torch.DoubleTensor").dtype is runtime.float64
    assert runtime.zeros(2).type(runtime.int32).dtype is runtime.int32
    with pytest.raises(ValueError, match="invalid type"):
        runtime.zeros(2).type("torch.Nonsense")


def test_view_as_another_dtype(torch):
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    for dtype in ("int32", "float16", "float64"):
        ours = T(a).view(getattr(runtime, dtype))
        theirs = torch.tensor(a).view(getattr(torch, dtype))
        assert tuple(ours.shape) == tuple(theirs.shape)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    x = runtime.ones(4)
    v = x.view(runtime.int32)
    v[0] = 0  # shares memory and version counter
    assert x[0].item() == 0.0 and x._version == v._version
    with pytest.raises(RuntimeError, match="must be divisible by 2"):
        runtime.ones(3).view(runtime.float64)
    with pytest.raises(RuntimeError, match="stride"):
        runtime.ones(4, 2).t().view(runtime.float64)
    with pytest.raises(RuntimeError, match="cannot be 0"):
        runtime.zeros(()).view(runtime.float16)


def test_dtype_is_signed():
    assert not runtime.bool.is_signed
    assert all(d.is_signed for d in (runtime.int32, runtime.int64, runtime.float16, runtime.float32, runtime.float64))
    assert runtime.ones(2).is_signed()


def test_tensors_hash_by_identity():
    a, b = runtime.ones(2), runtime.ones(2)
    table = {a: "a", b: "b"}
    assert table[a] == "a" and table[b] == "b" and len({a, a, b}) == 2


def test_sign_and_isclose_of_bools(torch):
    b = T([True, False])
    assert runtime.sign(b).tolist() == [True, False]
    assert runtime.isclose(b, b).tolist() == [True, True]


def test_squeeze_several_dims_and_broadcast_to_varargs():
    x = runtime.zeros(1, 3, 1)
    assert x.squeeze(0, 2).shape == (3,)
    assert runtime.zeros(3).broadcast_to(2, 3).shape == (2, 3)


def test_in_place_composites_record_gradients():
    x = runtime.tensor([0.3, 0.6], dtype=runtime.float64, requires_grad=True)
    assert gradcheck(lambda t: (t * 1).atan_().sinh_(), (x,))
    assert gradcheck(lambda t: (t * 1).cumsum_(0), (x,))


def test_equality_with_none_strings_and_containers_is_pythons_answer_as_in_torch():
    """torch's == and != return NotImplemented for such operands: `t == None` is False, and a tensor can be looked
    for in a list of options (`mask in (None, "causal")`) without the ambiguous-bool error."""
    t = runtime.ones(2)
    assert (t == None) is False and (t != None) is True  # noqa: E711
    assert (t == "causal") is False and t not in (None, "causal") and (t == [1.0, 1.0]) is False
    assert (t == 1.0).tolist() == [True, True] and (t != runtime.zeros(2)).tolist() == [True, True]


def test_a_numpy_array_operand_is_a_tensor_of_its_dtype_as_in_torch(torch):
    for op in (lambda t, a: t + a, lambda t, a: t * a, lambda t, a: t == a, lambda t, a: t - a):
        for array in (np.ones(2), np.arange(2), np.ones(2, np.float32)):
            got, want = op(runtime.ones(2), array), op(torch.ones(2), array)
            assert got.dtype.name == str(want.dtype).removeprefix("torch.")
            assert got.tolist() == want.tolist()


def _float32_pair(seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(4099) * 3).astype(np.float32) for _ in range(2)]


@pytest.mark.parametrize("weight", [0.0, 0.2, 0.7, 0.95, 1.0])
def test_lerp_is_exact_at_its_ends_and_one_rounding_in_between(weight):
    """torch's two-sided formula (end - (1 - w)(end - start) from w = 0.5 on) as one fused multiply-add: a number
    weight taken in float32, the sum rounded once (here: the float64 result of the float32 steps, rounded)."""
    a, b = _float32_pair()
    out = runtime.from_numpy(a).lerp(runtime.from_numpy(b), weight).numpy()
    w = np.float64(np.float32(weight))
    diff = (b - a).astype(np.float64)  # the difference itself is a float32 operation
    exact = (a + w * diff) if w < 0.5 else (b + (w - 1) * diff)
    np.testing.assert_array_equal(out, exact.astype(np.float32))
    if weight == 1.0:
        np.testing.assert_array_equal(out, b)


@pytest.mark.parametrize("weight", [0.3, 0.95, "tensor"])
def test_lerp_and_lerp_in_place_give_torchs_bits(torch, weight):
    a, b = _float32_pair(1)
    w = np.linspace(-0.2, 1.2, a.size, dtype=np.float32)
    results = []
    for lib in (runtime, torch):
        weight_ = lib.from_numpy(w) if weight == "tensor" else weight
        start = lib.from_numpy(a.copy())
        out = start.lerp(lib.from_numpy(b), weight_)
        start.lerp_(lib.from_numpy(b), weight_)
        results.append((out.numpy(), start.numpy()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_lerp_in_place_records_its_gradient():
    start = runtime.tensor([1.0, 2.0], dtype=runtime.float64, requires_grad=True)
    end = runtime.tensor([3.0, -1.0], dtype=runtime.float64, requires_grad=True)
    h = start * 1
    h.lerp_(end, 0.75)
    h.sum().backward()
    np.testing.assert_allclose(start.grad.numpy(), [0.25, 0.25])
    np.testing.assert_allclose(end.grad.numpy(), [0.75, 0.75])


def test_a_scaled_add_of_a_narrower_float_is_not_rounded_to_it_first():
    """param.add_(update, alpha=-lr) with a bfloat16 update into float32 (as Muon does): alpha * update at float32,
    not rounded to bfloat16 before the sum; out of place too."""
    p = runtime.tensor([1.0, 2.0, -3.0])
    update = runtime.tensor([0.3, 0.7, 0.11], dtype=runtime.bfloat16)
    exact = (p.numpy().astype(np.float64) + 0.1 * update.float().numpy().astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(runtime.add(p, update, alpha=0.1).numpy(), exact)
    np.testing.assert_array_equal(p.clone().add_(update, alpha=0.1).numpy(), exact)
    exact_sub = (p.numpy().astype(np.float64) - 0.1 * update.float().numpy()).astype(np.float32)
    np.testing.assert_array_equal(p.clone().sub_(update, alpha=0.1).numpy(), exact_sub)


def test_logaddexp_promotes_a_bool_operand(torch):
    x, b = [0.3, -0.5, 2.0], [True, False, True]
    for fn in ("logaddexp", "logaddexp2"):
        ours = getattr(runtime, fn)(runtime.tensor(x), runtime.tensor(b))
        theirs = getattr(torch, fn)(torch.tensor(x), torch.tensor(b))
        assert ours.dtype is runtime.float32
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)


@pytest.mark.parametrize("eps", [None, 0.1, 0.6, 1.0])
def test_logit_takes_eps_below_eps_and_one_minus_eps_above(torch, eps):
    """With eps above 0.5 the two bounds cross: torch still maps x < eps to eps and x > 1 - eps to 1 - eps (a clamp
    would give 1 - eps everywhere). The gradient is zero where a bound was taken."""
    values = [0.3, 0.0, 1.0, 0.9, 0.05, 0.5]
    results = []
    for lib in (runtime, torch):
        x = lib.tensor(values, dtype=lib.float64, requires_grad=True)
        out = lib.logit(x, eps)
        out.sum().backward()
        results.append((out.detach().numpy(), x.grad.numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0])
    np.testing.assert_allclose(results[0][1], results[1][1])


def test_mvlgamma_takes_values_below_its_old_domain(torch):
    x = [0.3, 2.0, 3.0, -0.7]
    np.testing.assert_allclose(runtime.mvlgamma(runtime.tensor(x, dtype=runtime.float64), 2).numpy(),
                               torch.mvlgamma(torch.tensor(x, dtype=torch.float64), 2).numpy())


def test_random_fills_a_bool_tensor_with_both_values():
    runtime.manual_seed(0)
    out = runtime.zeros(1000, dtype=runtime.bool).random_()
    assert out.dtype is runtime.bool and 0.4 < out.float().mean().item() < 0.6


_ELEMENT_CASES = {
    "float64_scalar": lambda lib: [lib.tensor(1.5, dtype=lib.float64)],
    "float64_with_number": lambda lib: [lib.tensor(1.5, dtype=lib.float64), 2.0],
    "float16_scalar": lambda lib: [lib.tensor(1.0, dtype=lib.float16)],
    "int32_scalar": lambda lib: [lib.tensor(1, dtype=lib.int32)],
    "int32_with_float": lambda lib: [lib.tensor(1, dtype=lib.int32), 2.5],
    "nested_int32_with_int": lambda lib: [[lib.tensor(1, dtype=lib.int32)], [2]],
    "one_element_tensor": lambda lib: [lib.tensor([1.5], dtype=lib.float64)],
    "numpy_scalar_with_float": lambda lib: [np.int32(3), 2.5],
    "numpy_float64": lambda lib: [np.float64(1.5)],
    "bfloat16_with_number": lambda lib: [lib.tensor(1.5, dtype=lib.bfloat16), 2.0],
}


@pytest.mark.parametrize("case", sorted(_ELEMENT_CASES))
def test_tensor_of_a_list_holding_tensors_or_numpy_values_takes_their_dtypes(torch, case):
    """A value target built as torch.tensor([R]) from a float64 return keeps float64 (actor-critic scripts): the
    elements' dtypes and the Python numbers' promote together; a one-element tensor is a scalar."""
    ours = runtime.tensor(_ELEMENT_CASES[case](runtime))
    theirs = torch.tensor(_ELEMENT_CASES[case](torch))
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.") and tuple(ours.shape) == tuple(theirs.shape)
    np.testing.assert_array_equal(ours.float().numpy(), theirs.float().numpy())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_linspace_and_affine_grid_give_torchs_bits(torch, dtype):
    """torch counts the first half of linspace up from start and the rest down from end, each point one fused
    multiply-add (np.linspace gave 5.6e-17 off the midpoint's 0); affine_grid scales that by (n - 1) then / n.
    An identity affine_grid lands the spatial transformer tutorial's samples exactly on pixel centres, where a
    last-bit difference moves grid_sample's floor and its gradient."""
    for steps in list(range(0, 70)) + [1000, 4097]:
        for start, end in ((-1, 1), (0, 1), (1e-4, 0.02), (-3.7, 12.1)):
            ours = runtime.linspace(start, end, steps, dtype=getattr(runtime, dtype)).numpy()
            theirs = torch.linspace(start, end, steps, dtype=getattr(torch, dtype)).numpy()
            assert np.array_equal(ours, theirs) or (dtype == "float64" and np.abs(ours - theirs).max() < 1e-15)
    for size in ((1, 1, 7, 7), (2, 3, 28, 33)):
        theta = np.tile(np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], dtype=dtype), (size[0], 1, 1))
        ours = runtime.nn.functional.affine_grid(runtime.tensor(theta), size, align_corners=False).numpy()
        theirs = torch.nn.functional.affine_grid(torch.tensor(theta), size, align_corners=False).numpy()
        np.testing.assert_array_equal(ours, theirs)


def test_scaled_adds_addcmul_and_addcdiv_give_torchs_float32_bits(torch):
    """torch computes self + alpha * other and self + value * t1 * t2 as one fused multiply-add (alpha and value in
    float32): an EMA's mul_(decay).add_(p, alpha=1 - decay) differed from torch's in 23 of 10,000 elements."""
    s, t1, t2 = np.random.default_rng(0).standard_normal((3, 10000)).astype(np.float32)
    results = []
    for lib in (runtime, torch):
        a, b, c = (lib.tensor(v) for v in (s, t1, t2))
        results.append([lib.add(a, b, alpha=-0.37), lib.sub(a, b, alpha=0.3), a.clone().mul_(0.999).add_(b, alpha=1e-3),
                        a.clone().sub_(b, alpha=0.7), a.addcmul(b, c, value=0.01), a.clone().addcmul_(b, c, value=-2.5),
                        a.addcdiv(b, c.abs() + 1, value=0.5), a.clone().addcdiv_(b, c.abs() + 1, value=3.0)])
    for ours, theirs in zip(*results):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_foreach_functions_give_torchs_values(torch):
    """torch._foreach_*, as timm's ModelEmaV3 and optimizer code call them: lists in, a tuple out, in place too."""
    values = np.random.default_rng(1).standard_normal((4, 500)).astype(np.float32)
    results = []
    for lib in (runtime, torch):
        xs, ys = [lib.tensor(values[0]), lib.tensor(values[1])], [lib.tensor(values[2]), lib.tensor(values[3])]
        lib._foreach_mul_(xs, 0.9)
        lib._foreach_add_(xs, ys, alpha=0.1)
        lib._foreach_lerp_(xs, ys, 0.3)
        lib._foreach_addcmul_(xs, ys, ys, value=0.01)
        lib._foreach_addcdiv_(xs, ys, [y.abs() + 1 for y in ys], [0.5, 0.25])
        out = lib._foreach_maximum(xs, ys)
        assert isinstance(out, tuple)
        norms = lib._foreach_norm(xs)
        copies = lib._foreach_clone(xs)
        lib._foreach_zero_(ys)
        results.append([*xs, *out, *norms, *copies, *lib._foreach_neg(copies), *ys])
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-7)
