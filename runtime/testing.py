"""runtime.testing: torch.testing.assert_close over tensors, numpy arrays, numbers and containers of them."""
from __future__ import annotations

import cmath
import collections.abc
import numbers

import numpy as np

from .dtypes import NP_TO_DTYPE, bfloat16, float16, float32, float64
from .tensor import Size, Tensor

__all__ = ["assert_close"]

# (rtol, atol) by dtype when neither is given, as torch.testing documents them; other dtypes compare exactly
_TOLERANCES = {float16: (1e-3, 1e-5), bfloat16: (1.6e-2, 1e-5), float32: (1.3e-6, 1e-5), float64: (1e-7, 1e-7)}


class _Mismatch(AssertionError):
    """A failed comparison; `where` lists the container items it was found under, outermost first."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
        self.where: list[str] = []


def assert_close(actual, expected, *, allow_subclasses=True, rtol=None, atol=None, equal_nan=False,
                 check_device=True, check_dtype=True, check_layout=True, check_stride=False, msg=None):
    """Raise an AssertionError unless `actual` and `expected` are close, as torch.testing.assert_close does.

    Tensors and numpy arrays must agree in shape, and in dtype and device unless check_dtype / check_device are
    False; floating values are close when |actual - expected| <= atol + rtol * |expected| (NaNs only with
    equal_nan, infinities only equal to themselves), other values must be equal. Sequences and mappings compare
    item by item. `msg` replaces the generated message (a string), or makes it (a callable of the message)."""
    if (rtol is None) != (atol is None):
        raise ValueError("Both 'rtol' and 'atol' must be either specified or omitted, "
                         f"but got no {'rtol' if rtol is None else 'atol'}.")
    options = dict(rtol=rtol, atol=atol, equal_nan=equal_nan, check_device=check_device, check_dtype=check_dtype)
    try:
        _compare(actual, expected, options)
    except _Mismatch as failure:
        message = failure.message
        if failure.where:
            message += f"\n\nThe failure occurred for item {''.join(failure.where)}"
        if callable(msg):
            message = msg(message)
        elif msg is not None:
            message = msg
        raise AssertionError(message) from None


def _compare(actual, expected, options) -> None:
    """Compare one pair, descending into sequences and mappings."""
    if _is_tensor_like(actual) or _is_tensor_like(expected):
        if not (_is_tensor_like(actual) and _is_tensor_like(expected)):
            raise TypeError("No comparison pair was able to handle inputs of type "
                            f"{type(actual)} and {type(expected)}.")
        _compare_tensors(actual, expected, options)
    elif _is_number(actual) and _is_number(expected):
        _compare_numbers(actual, expected, options)
    elif isinstance(actual, collections.abc.Mapping) and isinstance(expected, collections.abc.Mapping):
        _compare_mappings(actual, expected, options)
    elif _is_sequence(actual) and _is_sequence(expected):
        if len(actual) != len(expected):
            raise _Mismatch(f"The length of the sequences mismatch: {len(actual)} != {len(expected)}")
        for k, (a, e) in enumerate(zip(actual, expected)):
            _compare_item(a, e, options, f"[{k}]")
    else:
        raise TypeError(f"No comparison pair was able to handle inputs of type {type(actual)} and {type(expected)}.")


def _compare_mappings(actual, expected, options) -> None:
    missing = [k for k in expected if k not in actual]
    extra = [k for k in actual if k not in expected]
    if missing or extra:
        lines = ["The keys of the mappings do not match:"]
        if missing:
            lines.append(f"Missing keys in the actual mapping: {sorted(missing, key=str)}")
        if extra:
            lines.append(f"Additional keys in the actual mapping: {sorted(extra, key=str)}")
        raise _Mismatch("\n".join(lines))
    for key in expected:
        _compare_item(actual[key], expected[key], options, f"[{key!r}]")


def _compare_item(actual, expected, options, where: str) -> None:
    try:
        _compare(actual, expected, options)
    except _Mismatch as failure:
        failure.where.insert(0, where)
        raise


def _is_tensor_like(value) -> bool:
    return isinstance(value, (Tensor, np.ndarray))


def _is_number(value) -> bool:
    return isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, np.ndarray)


def _is_sequence(value) -> bool:
    return isinstance(value, collections.abc.Sequence) and not isinstance(value, (str, bytes))


def _tolerances(dtypes, options) -> tuple:
    """(rtol, atol): the given ones, else the loosest of the dtypes' defaults."""
    if options["rtol"] is not None:
        return float(options["rtol"]), float(options["atol"])
    pairs = [_TOLERANCES.get(d, (0.0, 0.0)) for d in dtypes]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def _compare_tensors(actual, expected, options) -> None:
    a_dtype, e_dtype = _dtype_of(actual), _dtype_of(expected)
    a, e = _array(actual), _array(expected)
    a_shape, e_shape = Size(a.shape), Size(e.shape)
    if a_shape != e_shape:
        raise _Mismatch(f"The values for attribute 'shape' do not match: {a_shape} != {e_shape}.")
    if options["check_device"] and _device_of(actual) != _device_of(expected):
        raise _Mismatch(f"The values for attribute 'device' do not match: {_device_of(actual)} != "
                        f"{_device_of(expected)}.")
    if options["check_dtype"] and a_dtype != e_dtype:
        raise _Mismatch(f"The values for attribute 'dtype' do not match: {a_dtype} != {e_dtype}.")
    rtol, atol = _tolerances({a_dtype, e_dtype}, options)
    common = np.result_type(a.dtype, e.dtype)
    if common.kind == "b":
        common = np.dtype(np.int64)
    a, e = a.astype(common), e.astype(common)
    close = _close(a, e, rtol, atol, options["equal_nan"])
    if close.all():
        return
    exact = common.kind != "f" and rtol == 0 and atol == 0
    raise _Mismatch(_tensor_report(a, e, close, rtol, atol, exact))


def _close(a: np.ndarray, e: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> np.ndarray:
    """Elementwise closeness; infinities are close only to the same infinity, NaN only to NaN with equal_nan."""
    if a.dtype.kind != "f":
        if rtol == 0 and atol == 0:
            return a == e
        a, e = a.astype(np.float64), e.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        close = a == e
        finite = np.isfinite(a) & np.isfinite(e)
        close |= finite & (np.abs(a - e) <= atol + rtol * np.abs(e))
    if equal_nan:
        close |= np.isnan(a) & np.isnan(e)
    return close


def _tensor_report(a, e, close, rtol, atol, exact) -> str:
    """torch's message for mismatching tensors: how many elements differ, and where the greatest differences are."""
    bad = int((~close).sum())
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        diff = np.abs(a - e) if a.dtype.kind == "f" else np.abs(a.astype(np.int64) - e.astype(np.int64))
        quotient = a.dtype if a.dtype.kind == "f" else np.dtype(np.float32)  # torch divides integers in float32
        rel = diff.astype(quotient) / np.abs(e).astype(quotient)
    lines = [f"Tensor-likes are not {'equal' if exact else 'close'}!", "",
             f"Mismatched elements: {bad} / {close.size} ({100 * bad / close.size:.1f}%)"]
    for label, values, tol in (("absolute", diff, atol), ("relative", rel, rtol)):
        flat = values.reshape(-1)
        k = int(np.argmax(np.where(np.isnan(flat), np.inf, flat))) if flat.size else 0
        index = tuple(int(i) for i in np.unravel_index(k, values.shape)) if values.ndim else ()
        value = flat[k].item() if flat.size else 0
        allowed = "" if exact else f" (up to {tol} allowed)"
        lines.append(f"Greatest {label} difference: {value} at index {index}{allowed}")
    return "\n".join(lines)


def _compare_numbers(actual, expected, options) -> None:
    if options["check_dtype"] and type(actual) is not type(expected):
        raise _Mismatch(f"The (d)types do not match: {type(actual)} != {type(expected)}.")
    dtypes = {_number_dtype(actual), _number_dtype(expected)}
    rtol, atol = _tolerances(dtypes, options)
    a, e = complex(actual), complex(expected)
    if a == e or (options["equal_nan"] and cmath.isnan(a) and cmath.isnan(e)):
        return
    diff = abs(a - e)
    if cmath.isfinite(a) and cmath.isfinite(e) and diff <= atol + rtol * abs(e):
        return
    rel = diff / abs(e) if e != 0 else float("inf")
    raise _Mismatch(f"Scalars are not close!\n\nExpected {expected} but got {actual}.\n"
                    f"Absolute difference: {diff} (up to {atol} allowed)\n"
                    f"Relative difference: {rel} (up to {rtol} allowed)")


def _number_dtype(value):
    """The dtype whose default tolerances a Python or numpy number gets (Python floats: float64, as in torch)."""
    if isinstance(value, (bool, np.bool_, numbers.Integral)):
        return None
    if isinstance(value, np.generic):
        return NP_TO_DTYPE.get(value.dtype)
    return float64


def _array(value) -> np.ndarray:
    array = value.detach().numpy() if isinstance(value, Tensor) else np.asarray(value)
    return array.astype(np.float32) if array.dtype == bfloat16.np else array  # its values exactly, as numpy floats


def _dtype_of(value):
    """A runtime dtype; a numpy dtype runtime has none for (uint8, complex64) stays a numpy dtype."""
    return value.dtype if isinstance(value, Tensor) else NP_TO_DTYPE.get(value.dtype, value.dtype)


def _device_of(value) -> str:
    return str(getattr(value, "device", "cpu"))

