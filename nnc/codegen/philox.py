"""Counter-based random numbers for generated kernels: runtime/_philox.py's Philox-4x32-10 compiled with numba.

The scalar functions are runtime's own (one definition: kernels and the op table's numpy forwards draw the same
bits), jitted here for CPU kernels; a CUDA target wraps the same functions as device functions. A kernel calls
`philox_uniform_f32(seed, index, stream)` and friends (HELPERS): the op's seed operand, its element's flat index
(the scalar layer's index operand, `OpDef.needs_index`) and the op's stream attribute.
"""
from __future__ import annotations

import numba
import numpy as np

from runtime import _philox

__all__ = ["HELPERS", "helper_name", "philox_uniform_f32", "philox_uniform_f64", "philox_normal_f32",
           "philox_normal_f64"]

# as approx.py's: compiled with its own flags and inlined by LLVM into the caller's loop
_FLAGS = dict(error_model="numpy", forceinline=True, nogil=True, no_cfunc_wrapper=True, cache=True)

_rounds = numba.njit(**_FLAGS)(_philox.philox4x32)
_counter_and_key = numba.njit(**_FLAGS)(_philox.counter_and_key)
_uniform_f32 = numba.njit(**_FLAGS)(_philox.uniform_f32)
_uniform_f64 = numba.njit(**_FLAGS)(_philox.uniform_f64)
_box_muller = numba.njit(**_FLAGS)(_philox.box_muller)


@numba.njit(**_FLAGS)
def _words(seed, index, stream):
    return _rounds(*_counter_and_key(np.uint64(seed), np.uint64(index), np.uint64(stream)))


@numba.njit(**_FLAGS)
def philox_uniform_f32(seed, index, stream):
    return _uniform_f32(_words(seed, index, stream)[0])


@numba.njit(**_FLAGS)
def philox_uniform_f64(seed, index, stream):
    w = _words(seed, index, stream)
    return _uniform_f64(w[0], w[1])


@numba.njit(**_FLAGS)
def philox_normal_f64(seed, index, stream):
    w = _words(seed, index, stream)
    return _box_muller(1.0 - _uniform_f64(w[0], w[1]), _uniform_f64(w[2], w[3]))


@numba.njit(**_FLAGS)
def philox_normal_f32(seed, index, stream):
    return np.float32(philox_normal_f64(seed, index, stream))


HELPERS = ("philox_uniform", "philox_normal")
_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def helper_name(name: str, dtype: np.dtype) -> str:
    """The helper a kernel calls for template function `name` drawing values of `dtype`."""
    return f"{name}_{_SUFFIX[np.dtype(dtype)]}"
