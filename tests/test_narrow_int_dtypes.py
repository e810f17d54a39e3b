"""uint8, int8 and int16 tensors: promotion, wrapping arithmetic, reductions and conversions, checked by hand and
against torch on the same data."""
from __future__ import annotations

import numpy as np
import pytest

import runtime

from helpers import dname, needs_torch, torch

NARROW = ["uint8", "int8", "int16"]
PARTNERS = NARROW + ["bool", "int32", "int64", "float16", "float32"]


def test_uint8_with_int8_promotes_to_int16():
    u = runtime.tensor([200, 255], dtype=runtime.uint8)
    c = runtime.tensor([-1, 100], dtype=runtime.int8)
    out = u + c
    assert out.dtype is runtime.int16 and out.tolist() == [199, 355]
    assert runtime.promote_types(runtime.uint8, runtime.int8) is runtime.int16
    assert runtime.promote_types(runtime.uint8, runtime.int16) is runtime.int16
    assert runtime.promote_types(runtime.bool, runtime.uint8) is runtime.uint8


def test_uint8_arithmetic_wraps_and_python_ints_keep_the_dtype():
    u = runtime.tensor([250, 3], dtype=runtime.uint8)
    assert (u + 10).dtype is runtime.uint8 and (u + 10).tolist() == [4, 13]
    assert (u + 300).tolist() == [38, 47]  # 300 wraps to 44, as torch casts the scalar
    assert (u + (-1)).tolist() == [249, 2]
    assert (u - 5).tolist() == [245, 254] and (-u).tolist() == [6, 253]
    assert (runtime.tensor([100], dtype=runtime.int8) * 3).tolist() == [44]


def test_integer_division_and_float_scalars_give_the_default_float():
    u = runtime.tensor([255, 3], dtype=runtime.uint8)
    assert (u / 255).dtype is runtime.float32 and (u / 255).tolist() == [1.0, pytest.approx(3 / 255)]
    assert (u * 1.5).dtype is runtime.float32 and (u // 2).dtype is runtime.uint8
    assert (u.float() / 255).dtype is runtime.float32


def test_reductions_of_narrow_integers():
    u = runtime.tensor([200, 100, 0], dtype=runtime.uint8)
    assert u.sum().dtype is runtime.int64 and u.sum().item() == 300
    assert u.cumsum(0).tolist() == [200, 300, 300]
    assert u.all().dtype is runtime.uint8 and u.all().item() == 0 and u.any().item() == 1
    assert runtime.tensor([1, -2], dtype=runtime.int8).all().dtype is runtime.bool
    with pytest.raises(RuntimeError, match="mean.*Got: runtime.uint8"):
        u.mean()


def test_bad_conversion_target_is_named():
    with pytest.raises(ValueError, match="invalid type: 'torch.UByteTensor'"):
        runtime.zeros(2).type("torch.UByteTensor")


OPS = {
    "add": lambda m, x, y: x + y, "sub": lambda m, x, y: x - y, "mul": lambda m, x, y: x * y,
    "div": lambda m, x, y: x / y, "floordiv": lambda m, x, y: x // y, "remainder": lambda m, x, y: x % y,
    "eq": lambda m, x, y: x == y, "maximum": lambda m, x, y: m.maximum(x, y), "cat": lambda m, x, y: m.cat([x, y]),
    "where": lambda m, x, y: m.where(x > 2, x, y), "and": lambda m, x, y: x & y, "xor": lambda m, x, y: x ^ y,
}
UNARY = {
    "add_300": lambda m, x: x + 300, "add_minus_1": lambda m, x: x + (-1), "rsub_255": lambda m, x: 255 - x,
    "mul_float": lambda m, x: x * 1.5, "neg": lambda m, x: -x, "abs": lambda m, x: x.abs(), "sum": lambda m, x: x.sum(),
    "prod": lambda m, x: x.prod(), "cumsum": lambda m, x: x.cumsum(0), "argmax": lambda m, x: x.argmax(),
    "invert": lambda m, x: ~x, "shift": lambda m, x: x << 1, "byte": lambda m, x: x.byte(),
    "char": lambda m, x: x.char(),
    "short": lambda m, x: x.short(), "scaled": lambda m, x: x.float() / 255, "pow": lambda m, x: x ** 2,
    "clamp": lambda m, x: x.clamp(0, 50), "sort": lambda m, x: x.sort()[0], "zero_dim": lambda m, x: x + m.tensor(5),
    "masked": lambda m, x: x[x > 3], "any": lambda m, x: x.any(0), "all": lambda m, x: x.all(),
}


def _data(name, rng, size=6):
    if name == "bool":
        return rng.integers(0, 2, size).astype(bool)
    low = 0 if name == "uint8" else -100
    return rng.integers(low, 120, size).astype(name) if name[0] in "iu" else rng.uniform(1, 9, size).astype(name)


def _agree(ours, theirs) -> bool:
    return dname(ours.dtype) == dname(theirs.dtype) and np.array_equal(ours.numpy(), theirs.numpy())


@needs_torch
@pytest.mark.parametrize("op", list(OPS))
def test_binary_ops_match_torch(op):
    rng, fn = np.random.default_rng(7), OPS[op]
    for a in NARROW:
        for b in PARTNERS:
            if (op in ("and", "xor") and b.startswith("float")) or (op == "sub" and b == "bool"):
                continue  # torch refuses these too
            x = _data(a, rng)
            y = np.abs(_data(b, rng)) + 1 if b != "bool" else np.ones(6, bool)  # nonzero divisors
            ours = fn(runtime, runtime.from_numpy(x.copy()), runtime.from_numpy(y.astype(b)))
            theirs = fn(torch, torch.from_numpy(x.copy()), torch.from_numpy(y.astype(b)))
            assert _agree(ours, theirs), (op, a, b, ours, theirs)


@needs_torch
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_ops_match_torch(op):
    rng, fn = np.random.default_rng(11), UNARY[op]
    for a in NARROW:
        x = _data(a, rng)
        ours, theirs = fn(runtime, runtime.from_numpy(x.copy())), fn(torch, torch.from_numpy(x.copy()))
        assert _agree(ours, theirs), (op, a, ours, theirs)


@needs_torch
@pytest.mark.parametrize("name", NARROW)
def test_in_place_ops_keep_the_dtype_as_torchs(name):
    x = _data(name, np.random.default_rng(3))
    ours, theirs = runtime.from_numpy(x.copy()), torch.from_numpy(x.copy())
    for t in (ours, theirs):
        t.add_(200).mul_(3)
        t[0] = 7
    assert _agree(ours, theirs)
