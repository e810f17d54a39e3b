"""runtime.testing.assert_close and the process-wide precision/determinism settings, checked against torch's."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import runtime

# (name, actual, expected, keyword arguments) built by `lib` (runtime or torch): pairs that pass and pairs that fail
CASES = [
    ("equal", lambda lib: (lib.tensor([1.0, 2.0]), lib.tensor([1.0, 2.0])), {}),
    ("within float32 tolerance", lambda lib: (lib.tensor([1.0]), lib.tensor([1.0 + 5e-6])), {}),
    ("one of three off", lambda lib: (lib.tensor([1.0, 2.0, 3.0]), lib.tensor([1.0, 2.5, 3.0])), {}),
    ("2-d all off", lambda lib: (lib.zeros(2, 3), lib.ones(2, 3)), {}),
    ("shapes differ", lambda lib: (lib.tensor([1.0, 2.0]), lib.tensor([1.0, 2.0, 3.0])), {}),
    ("dtypes differ", lambda lib: (lib.tensor([1.0]), lib.tensor([1.0], dtype=lib.float64)), {}),
    ("dtypes differ, unchecked", lambda lib: (lib.tensor([1.0]), lib.tensor([1.0], dtype=lib.float64)),
     {"check_dtype": False}),
    ("integers differ", lambda lib: (lib.tensor([1, 2]), lib.tensor([1, 3])), {}),
    ("bools differ", lambda lib: (lib.tensor([True]), lib.tensor([False])), {}),
    ("nan", lambda lib: (lib.tensor([math.nan]), lib.tensor([math.nan])), {}),
    ("nan, equal_nan", lambda lib: (lib.tensor([math.nan]), lib.tensor([math.nan])), {"equal_nan": True}),
    ("inf against finite", lambda lib: (lib.tensor([math.inf], dtype=lib.float64), lib.tensor([1e308],
                                                                                           dtype=lib.float64)), {}),
    ("loose tolerances", lambda lib: (lib.tensor([1.0]), lib.tensor([1.05])), {"rtol": 0.1, "atol": 0.0}),
    ("floats", lambda lib: (1.0, 1.5), {}),
    ("int against float", lambda lib: (1, 1.0), {}),
    ("sequence item", lambda lib: ([lib.tensor([1.0]), lib.tensor([2.0])], [lib.tensor([1.0]), lib.tensor([3.0])]),
     {}),
    ("sequence lengths", lambda lib: ([1, 2], [1, 2, 3]), {}),
    ("mapping item", lambda lib: ({"a": lib.tensor([1.0])}, {"a": lib.tensor([2.0])}), {}),
    ("mapping keys", lambda lib: ({"a": 1}, {"b": 1}), {}),
    ("numpy arrays", lambda lib: (np.array([1.0, 2.0]), np.array([1.0, 2.1])), {}),
    ("custom message", lambda lib: (lib.tensor([1.0]), lib.tensor([2.0])), {"msg": "custom"}),
    ("message callable", lambda lib: (lib.tensor([1.0]), lib.tensor([2.0])), {"msg": lambda m: "X" + m[:10]}),
]


def outcome(lib, make, kwargs):
    """(exception type name or 'ok', its message with library names made alike)."""
    actual, expected = make(lib)
    try:
        lib.testing.assert_close(actual, expected, **kwargs)
    except Exception as error:  # noqa: BLE001  (the outcome is what is compared)
        return type(error).__name__, str(error).replace("torch.", "runtime.")
    return "ok", ""


@pytest.mark.parametrize("name,make,kwargs", CASES, ids=[c[0] for c in CASES])
def test_assert_close_passes_fails_and_reports_as_torch(torch, name, make, kwargs):
    assert outcome(runtime, make, kwargs) == outcome(torch, make, kwargs)


def test_assert_close_names_the_greatest_difference_and_its_index():
    with pytest.raises(AssertionError) as failure:
        runtime.testing.assert_close(runtime.tensor([[1.0, 2.0], [3.0, 4.0]]), runtime.tensor([[1.0, 2.0], [3.0, 9.0]]))
    text = str(failure.value)
    assert "Mismatched elements: 1 / 4 (25.0%)" in text
    assert "Greatest absolute difference: 5.0 at index (1, 1)" in text


def test_assert_close_accepts_what_is_close_and_rejects_what_is_not():
    x = runtime.randn(5, 7)
    runtime.testing.assert_close(x, x.clone())
    runtime.testing.assert_close({"w": [x, 2]}, {"w": [x * 1.0, 2]})
    with pytest.raises(AssertionError, match=r"item \['w'\]\[0\]"):
        runtime.testing.assert_close({"w": [x, 2]}, {"w": [x + 1e-3, 2]})
    with pytest.raises(TypeError, match="No comparison pair"):
        runtime.testing.assert_close(x, 1.0)
    with pytest.raises(ValueError, match="no atol"):
        runtime.testing.assert_close(x, x, rtol=1e-3)


def test_float32_matmul_precision_is_remembered_and_a_bad_value_ignored():
    before = runtime.get_float32_matmul_precision()
    try:
        runtime.set_float32_matmul_precision("high")
        assert runtime.get_float32_matmul_precision() == "high"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runtime.set_float32_matmul_precision("bogus")
        assert "not one of 'highest', 'high', or 'medium'" in str(caught[0].message)
        assert runtime.get_float32_matmul_precision() == "high"
    finally:
        runtime.set_float32_matmul_precision(before)


def test_deterministic_algorithms_flags_follow_torch(torch):
    def flags(lib, *args, **kwargs):
        lib.use_deterministic_algorithms(*args, **kwargs)
        return lib.are_deterministic_algorithms_enabled(), lib.is_deterministic_algorithms_warn_only_enabled()

    try:
        for args, kwargs in [((True,), {}), ((True,), {"warn_only": True}), ((False,), {"warn_only": True}),
                             ((False,), {})]:
            assert flags(runtime, *args, **kwargs) == flags(torch, *args, **kwargs)
        with pytest.raises(TypeError):
            runtime.use_deterministic_algorithms(1)
        with pytest.raises(TypeError):
            torch.use_deterministic_algorithms(1)
    finally:
        runtime.use_deterministic_algorithms(False)
        torch.use_deterministic_algorithms(False)
