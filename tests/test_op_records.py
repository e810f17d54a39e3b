"""The op table's records for the compiler: every `Reducer` folds values to what its op's numpy forward computes, and
every no-op rule (`OpDef.noop`) only ever claims calls that return their input unchanged.

An op that gains a reducer or a no-op rule is swept here with no test of its own; tests/test_codegen_cpu.py compiles
every reducer (test_every_reducer_compiles), and nnc's remove_noops drops what the rules claim.
"""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime import ops
from runtime.ops import OPS, Kind

from opinfo import SAMPLES

REDUCERS = sorted(name for name, op in OPS.items() if op.reducer is not None)
NOOP_RULES = sorted(name for name, op in OPS.items() if op.noop is not None)
# The scalar functions a combine template may call, as numpy spells them (max/min propagate nan).
TEMPLATE_FUNCTIONS = {"max": np.maximum, "min": np.minimum}


def fold(reducer, values: np.ndarray, out_dtype: np.dtype):
    """The reducer's combine applied left to right from its identity, in its accumulator dtype, cast to out_dtype."""
    acc_dtype = np.dtype(reducer.accumulator(values.dtype, out_dtype))
    acc = acc_dtype.type(reducer.identity(acc_dtype))
    for v in values:
        acc = acc_dtype.type(eval(reducer.combine.format("acc", "v"), dict(TEMPLATE_FUNCTIONS),
                                  {"acc": acc, "v": acc_dtype.type(v)}))
    return out_dtype.type(acc)


def sample_values(dtype: str, rng) -> np.ndarray:
    if dtype == "bool":
        return rng.random(9) < 0.6
    if dtype == "int32":
        return rng.integers(-5, 6, 9).astype(np.int32)
    return rng.choice([0.0, 0.5, 1.0, 2.0, -1.5, 3.25], 9).astype(dtype)


def test_reductions_with_reducers():
    """The reductions code generation accumulates (argmax/argmin have none: they run as opaque nodes)."""
    assert REDUCERS == ["all", "amax", "amin", "any", "prod", "sum"]
    for name in REDUCERS:
        assert OPS[name].kind == Kind.REDUCTION
        assert OPS[name].reducer.block in ("fold", "max", "min", "all", "any")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "bool"])
@pytest.mark.parametrize("name", REDUCERS)
def test_reducer_folds_to_the_forward(name, dtype):
    op = OPS[name]
    rng = np.random.default_rng(len(name) + len(dtype))
    for trial in range(4):
        values = sample_values(dtype, rng)
        if trial == 3 and dtype != "bool":
            values[:] = values[0]  # all equal (ties, a row of one value)
        want = ops.apply(name, runtime.from_numpy(values), dims=(0,), keepdim=False).numpy()
        got = fold(op.reducer, values, want.dtype)
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{name} of {values}")


@pytest.mark.parametrize("name", REDUCERS)
def test_reducer_identity_is_neutral(name):
    reducer = OPS[name].reducer
    for values in (np.array([-2.5, 0.0, 7.0]), np.array([-3, 0, 4], np.int64), np.array([True, False])):
        acc_dtype = np.dtype(reducer.accumulator(values.dtype, values.dtype))
        identity = acc_dtype.type(reducer.identity(acc_dtype))
        for v in values.astype(acc_dtype):
            combined = eval(reducer.combine.format("i", "v"), dict(TEMPLATE_FUNCTIONS), {"i": identity, "v": v})
            assert combined == v, (name, identity, v)


@pytest.mark.parametrize("name", ["amax", "amin"])
def test_extreme_reducers_propagate_nan_like_their_forward(name):
    values = np.array([1.0, np.nan, -2.0])
    want = ops.apply(name, runtime.from_numpy(values), dims=(0,), keepdim=False).numpy()
    assert np.isnan(want) and np.isnan(fold(OPS[name].reducer, values, want.dtype))


# ---------------------------------------------------------------------------------------------------------------
# No-op rules
# ---------------------------------------------------------------------------------------------------------------

X = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
MASK = X > 0
# A call each rule must claim: (op, attrs, input) returns its input.
NOOP_CALLS = [("reshape", {"shape": (3, 4)}, X), ("expand", {"shape": (3, 4)}, X), ("permute", {"dims": (0, 1)}, X),
              ("cast", {"dtype": runtime.float32}, X)] + \
    [(name, {"dims": (), "keepdim": keepdim}, X) for name in ("sum", "prod", "amax", "amin") for keepdim in (0, 1)] + \
    [(name, {"dims": (), "keepdim": False}, MASK) for name in ("all", "any")]


def _claims(name, x, out, attrs) -> bool:
    return OPS[name].is_noop(tuple(x.shape), x.dtype, tuple(out.shape), out.dtype, attrs)


def test_every_noop_rule_has_a_call_it_claims():
    unclaimed = sorted(set(NOOP_RULES) - {name for name, _, _ in NOOP_CALLS})
    assert not unclaimed, f"ops with a no-op rule but no example call in NOOP_CALLS: {unclaimed}"


@pytest.mark.parametrize("name,attrs,array", NOOP_CALLS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(NOOP_CALLS)])
def test_noop_rule_claims_calls_that_return_their_input(name, attrs, array):
    x = runtime.from_numpy(array.copy())
    out = ops.apply(name, x, **attrs)
    assert _claims(name, x, out, attrs)
    assert out.dtype is x.dtype and tuple(out.shape) == tuple(x.shape)
    np.testing.assert_array_equal(out.numpy(), array)


@pytest.mark.parametrize("name", NOOP_RULES)
def test_noop_rule_never_claims_a_call_that_changes_its_input(name):
    """Every sample of the op (tests/opinfo.py) the rule claims returns its first input unchanged; the others are not
    claimed only because they change it."""
    for sample in SAMPLES[name]:
        inputs = [runtime.from_numpy(np.array(x)) if isinstance(x, np.ndarray) else x for x in sample.inputs]
        out = ops.apply(name, *inputs, **sample.attrs)
        x = inputs[0]
        same = out.dtype is x.dtype and tuple(out.shape) == tuple(x.shape) and np.array_equal(out.numpy(), x.numpy())
        if _claims(name, x, out, sample.attrs):
            assert same, (name, sample.attrs)


def test_rules_do_not_claim_unknown_shapes_or_dtypes():
    assert not OPS["reshape"].is_noop(None, None, None, None, {"shape": (3,)})
    assert not OPS["cast"].is_noop((3,), None, (3,), None, {"dtype": None})
    assert not OPS["sum"].is_noop((3,), runtime.int32, (3,), runtime.int64, {"dims": ()})  # the dtype changes
    assert OPS["permute"].is_noop(None, None, None, None, {"dims": (0, 1, 2)})
    assert not OPS["add"].is_noop((3,), runtime.float32, (3,), runtime.float32, {})  # no rule: never
