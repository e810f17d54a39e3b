"""torch.finfo / torch.iinfo against torch, and the dtype objects themselves (pickling, signedness)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import runtime

from helpers import needs_torch, torch


@needs_torch
@pytest.mark.parametrize("name", ["float16", "float32", "float64", "bfloat16", None])
def test_finfo_matches_torch(name):
    ours = runtime.finfo(getattr(runtime, name)) if name else runtime.finfo()
    theirs = torch.finfo(getattr(torch, name)) if name else torch.finfo()
    for field in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert repr(ours) == repr(theirs)


@needs_torch
@pytest.mark.parametrize("name", ["uint8", "int8", "int16", "int32", "int64", "bool"])
def test_iinfo_matches_torch(name):
    if name == "bool":
        assert runtime.iinfo(runtime.bool).max == 255  # torch refuses bool; runtime reads it as a byte
        return
    ours, theirs = runtime.iinfo(getattr(runtime, name)), torch.iinfo(getattr(torch, name))
    assert (ours.bits, ours.min, ours.max, ours.dtype) == (theirs.bits, theirs.min, theirs.max, theirs.dtype)
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("name, bits, low, signed", [("uint8", 8, 0, False), ("int8", 8, -128, True),
                                                     ("int16", 16, -32768, True), ("bool", 8, 0, False)])
def test_narrow_integer_limits_and_signedness(name, bits, low, signed):
    d = getattr(runtime, name)
    info = runtime.iinfo(d)
    assert (info.bits, info.min, info.max) == (bits, low, low + 2 ** bits - 1)
    assert d.is_signed is signed and not d.is_floating_point and d.itemsize == bits // 8
    if torch is not None:
        assert getattr(torch, name).is_signed is signed


def test_finfo_and_iinfo_refuse_the_other_kind():
    with pytest.raises(TypeError, match="requires a floating point input type"):
        runtime.finfo(runtime.int64)
    with pytest.raises(TypeError, match="requires an integer input type"):
        runtime.iinfo(runtime.float32)
    assert runtime.finfo(runtime.float32).eps == float(np.finfo(np.float32).eps)


def test_bfloat16_is_a_storable_dtype():
    table = {"float32": runtime.float32, "bfloat16": runtime.bfloat16, "float16": runtime.float16}  # nanoGPT's
    assert table["bfloat16"].is_floating_point and runtime.bfloat16.itemsize == 2
    assert pickle.loads(pickle.dumps(runtime.bfloat16)) is runtime.bfloat16
    for make in (lambda: runtime.zeros(2, dtype=runtime.bfloat16), lambda: runtime.ones(2).to(runtime.bfloat16),
                 lambda: runtime.ones(2).bfloat16(), lambda: runtime.tensor([1.0, 1.0], dtype=runtime.bfloat16)):
        t = make()
        assert t.dtype is runtime.bfloat16 and t.float().tolist() == [t.tolist()[0]] * 2
    assert runtime.promote_types(runtime.float32, runtime.bfloat16) is runtime.float32
    assert runtime.promote_types(runtime.float16, runtime.bfloat16) is runtime.float32
    assert runtime.promote_types(runtime.int64, runtime.bfloat16) is runtime.bfloat16
