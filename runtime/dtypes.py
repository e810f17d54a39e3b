"""Tensor dtypes (runtime.float32, ...), the default dtype, and torch's type-promotion rules."""
from __future__ import annotations

import ml_dtypes
import numpy as np


class dtype:
    """A tensor element type; `runtime.float32` etc. are the only instances."""

    __slots__ = ("name", "np", "category", "is_floating_point", "is_differentiable", "itemsize", "is_signed")

    # NOTE: categories order the promotion lattice: bool < integer < floating < complex.
    def __init__(self, name: str, np_dtype, category: int):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.category = category
        self.is_floating_point = category == FLOAT
        self.is_differentiable = category >= FLOAT  # floating and complex tensors carry gradients, as in torch
        self.itemsize = self.np.itemsize
        self.is_signed = category != BOOL and self.np.kind != "u"

    @property
    def is_complex(self) -> bool:
        return self.category == COMPLEX

    def to_real(self) -> "dtype":
        """The dtype of a complex dtype's real and imaginary parts (complex64 -> float32); other dtypes unchanged."""
        return _REAL_OF.get(self, self)

    def to_complex(self) -> "dtype":
        """The complex dtype whose parts have this floating dtype (float32 -> complex64), as torch's to_complex."""
        if self.category == COMPLEX:
            return self
        if self.category != FLOAT:
            raise RuntimeError(f"to_complex: expected a floating-point dtype, got {self}")
        return complex128 if self is float64 else complex64

    def __repr__(self) -> str:
        return f"runtime.{self.name}"

    def __reduce__(self):
        return (_dtype_by_name, (self.name,))


BOOL, INT, FLOAT, COMPLEX = 0, 1, 2, 3

bool_ = dtype("bool", np.bool_, BOOL)
uint8 = dtype("uint8", np.uint8, INT)
int8 = dtype("int8", np.int8, INT)
int16 = dtype("int16", np.int16, INT)
int32 = dtype("int32", np.int32, INT)
int64 = dtype("int64", np.int64, INT)
float16 = dtype("float16", np.float16, FLOAT)
# NOTE: ml_dtypes gives numpy a bfloat16 whose ufuncs compute in float32 and round once, as torch's elementwise ops
# do; reductions and matmul would accumulate in bfloat16, so eager ops widen bfloat16 operands to float32 (as torch's
# kernels do) and round the result once (runtime.tensor._widen_bfloat16)
bfloat16 = dtype("bfloat16", ml_dtypes.bfloat16, FLOAT)
float32 = dtype("float32", np.float32, FLOAT)
float64 = dtype("float64", np.float64, FLOAT)
complex64 = dtype("complex64", np.complex64, COMPLEX)
complex128 = dtype("complex128", np.complex128, COMPLEX)
_REAL_OF = {complex64: float32, complex128: float64}


def astype(array: np.ndarray, np_dtype, **kwargs) -> np.ndarray:
    """numpy's `array.astype(np_dtype, **kwargs)`, except that a conversion to bfloat16 from anything but float32
    rounds through float32 first, as torch's conversions do (c10's BFloat16 is built from a float)."""
    # NOTE: ml_dtypes from 0.7 rounds float64 to bfloat16 once; 1 + 2**-8 + 2**-30 then gives 1.0078125 where
    # torch's double rounding (to float32, then a tie to even) gives 1.0
    if np.dtype(np_dtype) == bfloat16.np and array.dtype not in (np.float32, bfloat16.np):
        array = array.astype(np.float32)
    return array.astype(np_dtype, **kwargs)


ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, complex64, complex128)
NP_TO_DTYPE = {d.np: d for d in ALL_DTYPES}
_BY_NAME = {d.name: d for d in ALL_DTYPES}

_default_float = float32


def _dtype_by_name(name: str) -> dtype:
    return _BY_NAME[name]


def from_numpy_dtype(np_dtype) -> dtype:
    """The runtime dtype for a numpy dtype; a clear TypeError for unsupported ones."""
    found = NP_TO_DTYPE.get(np_dtype) or NP_TO_DTYPE.get(np.dtype(np_dtype))
    if found is None:
        supported = ", ".join(d.name for d in ALL_DTYPES)
        raise TypeError(f"unsupported numpy dtype {np.dtype(np_dtype)}; runtime supports {supported}")
    return found


def as_dtype(value) -> dtype:
    """Accept a runtime dtype, a numpy dtype/type, or a Python type (float, int, bool)."""
    if isinstance(value, dtype):
        return value
    if value is float:  # as in torch, the Python float type means float64
        return float64
    if value is int:
        return int64
    if value is bool:
        return bool_
    if value is complex:
        return complex128
    try:
        return from_numpy_dtype(value)
    except TypeError:
        raise TypeError(f"expected a dtype such as runtime.float32, got {value!r}") from None


def get_default_dtype() -> dtype:
    return _default_float


def set_default_dtype(d) -> None:
    global _default_float
    d = as_dtype(d)
    if not d.is_floating_point:
        raise TypeError(f"only floating-point types are supported as the default type, got {d}")
    _default_float = d


def promote_types(a: dtype, b: dtype) -> dtype:
    """The smallest dtype both a and b convert to without losing their category (torch's table)."""
    if a is b:
        return a
    if a.category == COMPLEX or b.category == COMPLEX:  # complex64 with float64 is complex128, as in torch
        return promote_types(a.to_real(), b.to_real()).to_complex()
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.is_signed != b.is_signed:  # uint8 with a signed integer: a signed type that holds 0..255
        signed = a if a.is_signed else b
        return signed if signed.itemsize > 1 else int16
    if a.itemsize == b.itemsize:  # float16 with bfloat16: neither holds the other
        return float32
    return a if a.itemsize >= b.itemsize else b


def scalar_category(value) -> int:
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT
    if isinstance(value, complex):
        return COMPLEX
    return FLOAT


def default_for_category(category: int) -> dtype:
    return (bool_, int64, _default_float, _default_float.to_complex())[category]
