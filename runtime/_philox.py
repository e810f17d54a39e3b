"""Philox-4x32-10 (Salmon et al., SC'11), the counter-based generator behind compiled random numbers.

One definition serves numpy arrays (the op table's forwards, vectorised over every element) and scalars (nnc's
code generators compile the same functions into kernels: `nnc/codegen/philox.py`), so a compiled kernel and the
interpreter draw bit-identical numbers. Every value is a uint64 holding a 32-bit word; each product of two words
fits 64 bits, and the high and low halves are split off with a shift and a mask.

A stream of numbers is keyed by a 64-bit seed (runtime's generator draws one per compiled call), and element `i`
of a draw with stream number `stream` is counter (i mod 2^32, i div 2^32, stream, 0): any element is computed on
its own, so a backward regenerates a dropout mask from the seed instead of storing it.
"""
from __future__ import annotations

import numpy as np

_MASK = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # the round multipliers
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)  # the key schedule's increments (golden ratio, sqrt(3)-1)
ROUNDS = 10


def philox4x32(c0, c1, c2, c3, k0, k1):
    """The four output words of Philox-4x32-10 for counter (c0, c1, c2, c3) and key (k0, k1): uint64 values (or
    arrays) each below 2^32."""
    for r in range(ROUNDS):
        if r:  # the key is bumped before every round after the first
            k0 = (k0 + _W0) & _MASK
            k1 = (k1 + _W1) & _MASK
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = (p1 >> _SHIFT) ^ c1 ^ k0, p1 & _MASK, (p0 >> _SHIFT) ^ c3 ^ k1, p0 & _MASK
    return c0, c1, c2, c3


def counter_and_key(seed, index, stream):
    """(c0, c1, c2, c3, k0, k1) for element `index` of stream `stream` under a 64-bit `seed` (all uint64)."""
    return index & _MASK, index >> _SHIFT, stream & _MASK, _ZERO, seed & _MASK, seed >> _SHIFT


# NOTE: uniforms are k-bit integers times 2^-k, so they are exact in the target type and lie in [0, 1): a float32
# from the top 24 bits of word 0, a float64 from 27 bits of word 0 and 26 of word 1 (53 bits, numpy's recipe).
_F32_SCALE = np.float32(2.0 ** -24)
_F64_SCALE = np.float64(2.0 ** -53)


def uniform_f32(w0):
    return np.float32(w0 >> np.uint64(8)) * _F32_SCALE


def uniform_f64(w0, w1):
    return np.float64(((w0 >> np.uint64(5)) << np.uint64(26)) | (w1 >> np.uint64(6))) * _F64_SCALE


def box_muller(u1, u2):
    """A standard normal (float64) from two uniforms, u1 in (0, 1] (so its log is finite) and u2 in [0, 1)."""
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(_TWO_PI * u2)


_ZERO = np.uint64(0)
_TWO_PI = np.float64(2.0 * np.pi)


def draw(seed, shape, stream: int, dtype, distribution: str) -> np.ndarray:
    """Every element of a draw at once: `distribution` "uniform" ([0, 1)) or "normal", dtype float32 or float64."""
    dtype = np.dtype(dtype)
    index = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.uint64)
    w0, w1, w2, w3 = philox4x32(*counter_and_key(np.uint64(seed), index, np.uint64(stream)))
    if distribution == "normal":
        values = box_muller(1.0 - uniform_f64(w0, w1), uniform_f64(w2, w3))
    elif dtype == np.float32:
        values = uniform_f32(w0)
    else:
        values = uniform_f64(w0, w1)
    return np.asarray(values).astype(dtype, copy=False).reshape(tuple(shape))
