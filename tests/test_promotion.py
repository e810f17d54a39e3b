"""dtype promotion vs torch: binary ops, comparisons, maximum, where and cat over every dtype pair,
Python scalars on either side, zero-dim vs dimensioned tensors, unary float ops and reductions."""
import itertools
import operator

import numpy as np
import pytest

import runtime

from helpers import dname, needs_torch, torch

pytestmark = needs_torch  # every test here compares with torch

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
SCALARS = {"pybool": True, "pyint": 2, "pyfloat": 2.5}
DATA_RNG = np.random.default_rng(20240611)


def _values(dtype, shape):
    """Nonzero, positive data (so division and floor division are defined everywhere)."""
    if dtype == "bool":
        return np.ones(shape, dtype=bool)
    if dtype.startswith(("int", "uint")):
        return DATA_RNG.integers(1, 5, size=shape).astype(dtype)
    return (DATA_RNG.random(shape) * 3 + 0.5).astype(dtype)


class Operand:
    """One operand spec, built identically for runtime and torch: a [3] tensor, a 0-d tensor or a scalar."""

    def __init__(self, kind, dtype):
        self.kind, self.dtype = kind, dtype
        if kind == "dim":
            self.array = _values(dtype, (3,))
        elif kind == "zero":
            self.array = _values(dtype, ())
        else:
            self.array = None

    def build(self, module):
        if self.kind == "scalar":
            return SCALARS[self.dtype]
        return module.tensor(self.array.copy(), dtype=getattr(module, self.dtype))

    def __repr__(self):
        return f"{self.kind}:{self.dtype}"


def operands(kind):
    names = list(SCALARS) if kind == "scalar" else DTYPES
    return [Operand(kind, n) for n in names]


def compare(fn, *specs):
    """None when runtime agrees with torch on fn(*specs) (dtype, shape and values, or the error type);
    otherwise a description of the disagreement."""
    t_args = [s.build(torch) for s in specs]
    r_args = [s.build(runtime) for s in specs]
    try:
        expected = fn(torch, *t_args)
    except NotImplementedError:  # torch has no kernel for it (e.g. bool // bool): nothing to compare
        return None
    except (RuntimeError, TypeError) as t_err:
        try:
            got = fn(runtime, *r_args)
        except type(t_err):
            return None
        except Exception as r_err:  # noqa: BLE001
            return f"{specs}: torch raised {type(t_err).__name__}, runtime raised {type(r_err).__name__}: {r_err}"
        return f"{specs}: torch raised {type(t_err).__name__} ({t_err}), runtime returned {got.dtype}"
    try:
        got = fn(runtime, *r_args)
    except Exception as r_err:  # noqa: BLE001
        return f"{specs}: torch gave {dname(expected.dtype)}, runtime raised {type(r_err).__name__}: {r_err}"
    if dname(got.dtype) != dname(expected.dtype):
        return f"{specs}: torch {dname(expected.dtype)}, runtime {dname(got.dtype)}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"{specs}: torch shape {tuple(expected.shape)}, runtime {tuple(got.shape)}"
    want = expected.numpy().astype(np.float64)
    have = np.asarray(got.numpy()).astype(np.float64)
    tol = 2e-3 if "float16" in dname(expected.dtype) else 1e-6
    if not np.allclose(have, want, rtol=tol, atol=tol, equal_nan=True):
        return f"{specs}: values differ: torch {want.tolist()}, runtime {have.tolist()}"
    return None


def check_all(fn, pairs):
    problems = [p for p in (compare(fn, *pair) for pair in pairs) if p is not None]
    assert not problems, f"{len(problems)} mismatches:\n" + "\n".join(problems)


BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "eq": operator.eq, "ne": operator.ne, "lt": operator.lt,
    "le": operator.le, "gt": operator.gt, "ge": operator.ge,
}

KIND_PAIRS = [
    ("dim", "dim"), ("dim", "zero"), ("zero", "dim"), ("zero", "zero"),
    ("dim", "scalar"), ("scalar", "dim"), ("zero", "scalar"), ("scalar", "zero"),
]


def _pairs(kinds, op=None):
    pairs = list(itertools.product(operands(kinds[0]), operands(kinds[1])))
    if op in ("sub", "sub_"):  # torch refuses bool operands to `-`: see test_sub_with_bool_operand_raises
        pairs = [p for p in pairs if not any(o.dtype in ("bool", "pybool") for o in p)]
    return pairs


def _bool_pairs(kinds):
    return [p for p in itertools.product(operands(kinds[0]), operands(kinds[1]))
            if any(o.dtype in ("bool", "pybool") for o in p)]


@pytest.mark.parametrize("kinds", KIND_PAIRS, ids=["-".join(k) for k in KIND_PAIRS])
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_operator_promotion(op, kinds):
    fn = BINARY[op]
    check_all(lambda m, a, b: fn(a, b), _pairs(kinds, op))


@pytest.mark.parametrize("kinds", KIND_PAIRS, ids=["-".join(k) for k in KIND_PAIRS])
def test_sub_with_bool_operand_raises(kinds):
    """torch: 'Subtraction, the `-` operator, with a bool tensor is not supported' (a RuntimeError)."""
    check_all(lambda m, a, b: a - b, _bool_pairs(kinds))
    check_all(lambda m, a, b: m.sub(a, b), _bool_pairs(kinds))


FUNCTIONS = ["add", "sub", "mul", "div", "floor_divide", "eq", "lt", "ge"]


@pytest.mark.parametrize("kinds", [("dim", "dim"), ("zero", "dim"), ("dim", "scalar")], ids=str)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_module_function_promotion(name, kinds):
    check_all(lambda m, a, b: getattr(m, name)(a, b), _pairs(kinds, name))


@pytest.mark.parametrize("kinds", [("dim", "dim"), ("dim", "zero"), ("zero", "dim"), ("zero", "zero")], ids=str)
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_promotion(name, kinds):
    check_all(lambda m, a, b: getattr(m, name)(a, b), _pairs(kinds))


WHERE_KINDS = KIND_PAIRS + [("scalar", "scalar")]


@pytest.mark.parametrize("kinds", WHERE_KINDS, ids=["-".join(k) for k in WHERE_KINDS])
def test_where_promotion(kinds):
    cond = np.array([True, False, True])

    def fn(m, a, b):
        return m.where(m.tensor(cond), a, b)

    check_all(fn, _pairs(kinds))


def test_cat_promotion():
    check_all(lambda m, a, b: m.cat([a, b]), _pairs(("dim", "dim")))


def test_cat_promotion_three_tensors():
    triples = list(itertools.product(operands("dim"), repeat=3))[::7]
    check_all(lambda m, a, b, c: m.cat([a, b, c]), triples)


def test_result_type_and_promote_types():
    problems = []
    for a, b in itertools.product(DTYPES, DTYPES):
        want = dname(torch.promote_types(getattr(torch, a), getattr(torch, b)))
        got = dname(runtime.promote_types(getattr(runtime, a), getattr(runtime, b)))
        if want != got:
            problems.append(f"promote_types({a}, {b}): torch {want}, runtime {got}")
    for kinds in KIND_PAIRS:
        for x, y in _pairs(kinds):
            want = dname(torch.result_type(x.build(torch), y.build(torch)))
            got = dname(runtime.result_type(x.build(runtime), y.build(runtime)))
            if want != got:
                problems.append(f"result_type({x}, {y}): torch {want}, runtime {got}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# the cases named in torch's documentation of type promotion
# ---------------------------------------------------------------------------------------------

def test_zero_dim_float64_plus_dimensioned_float32_is_float32():
    r = runtime.tensor(1.5, dtype=runtime.float64) + runtime.ones(3, dtype=runtime.float32)
    t = torch.tensor(1.5, dtype=torch.float64) + torch.ones(3, dtype=torch.float32)
    assert dname(r.dtype) == dname(t.dtype)
    np.testing.assert_allclose(r.numpy(), t.numpy())


def test_zero_dim_float_plus_int_tensor_is_the_float_dtype():
    for name in ["float16", "float32", "float64"]:
        for int_name in ["int32", "int64", "bool"]:
            r = runtime.tensor(0.5, dtype=getattr(runtime, name)) + runtime.ones(3, dtype=getattr(runtime, int_name))
            t = torch.tensor(0.5, dtype=getattr(torch, name)) + torch.ones(3, dtype=getattr(torch, int_name))
            assert dname(r.dtype) == dname(t.dtype) == name


def test_int_scalar_keeps_int32_and_float_scalar_gives_default():
    a_r, a_t = runtime.tensor([1, 2], dtype=runtime.int32), torch.tensor([1, 2], dtype=torch.int32)
    assert dname((a_r + 5).dtype) == dname((a_t + 5).dtype)
    assert dname((a_r * 2.5).dtype) == dname((a_t * 2.5).dtype)
    h_r, h_t = runtime.ones(2, dtype=runtime.float16), torch.ones(2, dtype=torch.float16)
    assert dname((h_r * 2.5).dtype) == dname((h_t * 2.5).dtype)
    assert dname((h_r + runtime.tensor(1.0, dtype=runtime.float64)).dtype) == \
        dname((h_t + torch.tensor(1.0, dtype=torch.float64)).dtype)


@pytest.fixture
def default_float64():
    runtime.set_default_dtype(runtime.float64)
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        runtime.set_default_dtype(runtime.float32)
        torch.set_default_dtype(torch.float32)


def test_promotion_follows_default_dtype(default_float64):
    assert runtime.get_default_dtype() is runtime.float64
    pairs = _pairs(("dim", "scalar")) + _pairs(("dim", "dim"))
    check_all(lambda m, a, b: a / b, pairs)
    check_all(lambda m, a, b: a * b, pairs)
    check_all(lambda m, a, b: m.tensor([1.0, 2.0]) + b, pairs)
    check_all(lambda m, a: m.exp(a), [(o,) for o in operands("dim")])


# ---------------------------------------------------------------------------------------------
# unary ops and reductions
# ---------------------------------------------------------------------------------------------

FLOAT_UNARY = ["exp", "sqrt", "sigmoid", "log", "sin", "cos", "tanh", "rsqrt", "log1p", "reciprocal", "erf"]


@pytest.mark.parametrize("name", FLOAT_UNARY)
def test_unary_float_ops_on_every_dtype(name):
    check_all(lambda m, a: getattr(m, name)(a), [(o,) for o in operands("dim") + operands("zero")])


@pytest.mark.parametrize("name", ["exp", "sqrt", "sigmoid"])
def test_unary_float_op_on_int64_is_float32(name):
    r = getattr(runtime, name)(runtime.tensor([1, 4, 9]))
    t = getattr(torch, name)(torch.tensor([1, 4, 9]))
    assert dname(r.dtype) == dname(t.dtype) == "float32"
    np.testing.assert_allclose(r.numpy(), t.numpy(), rtol=1e-6)


@pytest.mark.parametrize("name", ["neg", "abs", "relu", "floor", "sign"])
def test_dtype_preserving_unary_ops(name):
    specs = [(o,) for o in operands("dim") if o.dtype != "bool"]
    check_all(lambda m, a: getattr(m, name)(a), specs)


CLAMP_BOUNDS = [(0, 2), (0.5, 2.5), (None, 1.5), (1, None), (True, None), (0, 2.5)]


@pytest.mark.parametrize("bounds", CLAMP_BOUNDS, ids=str)
def test_clamp_with_scalar_bounds_promotes(bounds):
    """torch: clamp's result type is result_type(input, min, max), so int.clamp(0.5, 2.5) is float32."""
    lo, hi = bounds
    check_all(lambda m, a: m.clamp(a, lo, hi), [(o,) for o in operands("dim") + operands("zero")])
    check_all(lambda m, a: a.clamp(min=lo, max=hi), [(o,) for o in operands("dim")])


def test_clamp_with_tensor_bounds_promotes():
    def fn(m, a, b):
        return m.clamp(a, min=b)

    check_all(fn, _pairs(("dim", "dim")) + _pairs(("dim", "zero")))


def test_square_dtype():
    check_all(lambda m, a: m.square(a), [(o,) for o in operands("dim")])


@pytest.mark.parametrize("name", ["sum", "prod"])
def test_sum_prod_dtypes(name):
    specs = [(o,) for o in operands("dim") + operands("zero")]
    check_all(lambda m, a: getattr(m, name)(a), specs)
    check_all(lambda m, a: getattr(a, name)(0), [s for s in specs if s[0].kind == "dim"])


def test_sum_of_int32_and_bool_is_int64():
    for name in ["int32", "bool", "int64"]:
        r = runtime.ones(4, dtype=getattr(runtime, name)).sum()
        t = torch.ones(4, dtype=getattr(torch, name)).sum()
        assert dname(r.dtype) == dname(t.dtype) == "int64"
        assert r.item() == t.item()


def test_sum_with_dtype_argument():
    check_all(lambda m, a: m.sum(a, dtype=m.float64), [(o,) for o in operands("dim")])


def test_mean_on_int_tensor_raises():
    r, t = runtime.tensor([1, 2, 3]), torch.tensor([1, 2, 3])
    with pytest.raises(RuntimeError) as t_err:
        t.mean()
    with pytest.raises(type(t_err.value), match="int64"):
        r.mean()
    assert dname(r.mean(dtype=runtime.float32).dtype) == dname(t.mean(dtype=torch.float32).dtype)
    np.testing.assert_allclose(r.float().mean().item(), t.float().mean().item())


@pytest.mark.parametrize("name", ["mean", "amax", "amin", "argmax", "all", "any"])
def test_other_reduction_dtypes(name):
    specs = [(o,) for o in operands("dim")]
    check_all(lambda m, a: getattr(a, name)(), specs)


# ---------------------------------------------------------------------------------------------
# in-place ops keep the destination dtype, or refuse when the result can't be cast back
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kinds", [("dim", "dim"), ("dim", "zero"), ("dim", "scalar")], ids=str)
@pytest.mark.parametrize("name", ["add_", "mul_", "sub_"])
def test_inplace_promotion(name, kinds):
    def fn(m, a, b):
        return getattr(a, name)(b)

    check_all(fn, _pairs(kinds, name))


def test_failed_inplace_cast_leaves_values():
    a_r = runtime.tensor([1, 2, 3])
    a_t = torch.tensor([1, 2, 3])
    with pytest.raises(RuntimeError) as t_err:
        a_t.add_(torch.tensor([0.5, 0.5, 0.5]))
    with pytest.raises(type(t_err.value)):
        a_r.add_(runtime.tensor([0.5, 0.5, 0.5]))
    assert a_r.tolist() == a_t.tolist()
