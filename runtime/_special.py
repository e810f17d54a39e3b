"""Vectorized pure-numpy special functions (erf) for elementwise ops such as exact GELU."""
from __future__ import annotations

import numpy as np

# NOTE: coefficients of W. J. Cody's rational Chebyshev approximations ("Rational
# Chebyshev approximations for the error function", Math. Comp. 23 (1969) 631-638),
# as published in his SPECFUN routine CALERF (arrays A, B, C, D, P, Q there). They
# are listed here highest degree first, ready for Horner's scheme; every denominator
# is monic. Cody's interval ends 0.46875 and 4.0 belong to these fits: do not move them.
_SMALL_NUM = (1.85777706184603153e-1, 3.16112374387056560e00, 1.13864154151050156e02,
              3.77485237685302021e02, 3.20937758913846947e03)
_SMALL_DEN = (1.0, 2.36012909523441209e01, 2.44024637934444173e02,
              1.28261652607737228e03, 2.84423683343917062e03)
_MID_NUM = (2.15311535474403846e-8, 5.64188496988670089e-1, 8.88314979438837594e00,
            6.61191906371416295e01, 2.98635138197400131e02, 8.81952221241769090e02,
            1.71204761263407058e03, 2.05107837782607147e03, 1.23033935479799725e03)
_MID_DEN = (1.0, 1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
            1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
            3.43936767414372164e03, 1.23033935480374942e03)
_TAIL_NUM = (1.63153871373020978e-2, 3.05326634961232344e-1, 3.60344899949804439e-1,
             1.25781726111229246e-1, 1.60837851487422766e-2, 6.58749161529837803e-4)
_TAIL_DEN = (1.0, 2.56852019228982242e00, 1.87295284992346047e00,
             5.27905102951428412e-1, 6.05183413124413191e-2, 2.33520497626869185e-3)

_INV_SQRT_PI = 5.6418958354775628695e-1
_SMALL_END = 0.46875
_MID_END = 4.0
# NOTE: erfc(5.95) < 2**-54, so above this point 1 - erfc(|x|) rounds to exactly 1.0
# in float64; the tail fit is only needed on (4, 6).
_SATURATE = 6.0


def _horner(z: np.ndarray, coeffs: tuple) -> np.ndarray:
    """Evaluate the polynomial with `coeffs` (highest degree first) at z, into a new array."""
    acc = z + coeffs[1] if coeffs[0] == 1.0 else z * coeffs[0] + coeffs[1]
    for c in coeffs[2:]:
        acc *= z
        acc += c
    return acc


def _erf_small(x: np.ndarray) -> np.ndarray:
    """erf(x) for |x| <= 0.46875: x * R(x^2); keeps the sign of x, including -0.0."""
    z = x * x
    ratio = _horner(z, _SMALL_NUM)
    ratio /= _horner(z, _SMALL_DEN)
    # NOTE: multiply by x last so tiny and subnormal x are rounded only once.
    ratio *= x
    return ratio


def _erf_mid(x: np.ndarray) -> np.ndarray:
    """erf(x) for 0.46875 < |x| <= 4: sign(x) * (1 - exp(-x^2) * R(|x|))."""
    y = np.abs(x)
    ratio = _horner(y, _MID_NUM)
    ratio /= _horner(y, _MID_DEN)
    # NOTE: CALERF splits exp(-y^2) to make erfc itself accurate; for erf = 1 - erfc the
    # rounding of y*y costs at most ~2e-15 relative in erfc <= 0.51, which is invisible.
    erfc = np.exp(-(y * y))
    erfc *= ratio
    return np.copysign(1.0 - erfc, x)


def _erf_tail(x: np.ndarray) -> np.ndarray:
    """erf(x) for 4 < |x| < 6: sign(x) * (1 - exp(-x^2) / |x| * (1/sqrt(pi) - R(1/x^2) / x^2))."""
    y = np.abs(x)
    z = 1.0 / (y * y)
    ratio = _horner(z, _TAIL_NUM)
    ratio /= _horner(z, _TAIL_DEN)
    ratio *= z
    erfc = np.exp(-(y * y)) * (_INV_SQRT_PI - ratio) / y
    return np.copysign(1.0 - erfc, x)


def _apply(piece, where: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out[where] = piece(x[where])."""
    # NOTE: integer indices, not the boolean mask itself: numpy gathers/scatters through
    # a random-looking boolean mask several times slower than through flatnonzero's indices.
    idx = np.flatnonzero(where)
    if idx.size:
        out[idx] = piece(x[idx])


def _erf_block(x: np.ndarray, out: np.ndarray) -> None:
    """Write erf of the 1-d float64 block x into out, each piece only where it applies."""
    # np.sign is already the answer for |x| >= 6 (including +-inf), and nan for nan.
    np.sign(x, out=out)
    ax = np.abs(x)
    _apply(_erf_small, ax <= _SMALL_END, x, out)
    _apply(_erf_mid, (ax > _SMALL_END) & (ax <= _MID_END), x, out)
    _apply(_erf_tail, (ax > _MID_END) & (ax < _SATURATE), x, out)


# NOTE: working through 64K-element blocks keeps every float64 temporary (512 KiB) in
# cache and lets the allocator recycle it; whole-array temporaries were ~1.6x slower.
_BLOCK = 65536


def erf(x) -> np.ndarray:
    """The error function, elementwise; floating inputs keep their dtype (others give float64).

    float16/float32 inputs are computed in float64 and rounded once at the end. Numpy and
    Python scalars are accepted through np.asarray; 0-d input gives a 0-d array.
    """
    arr = np.asarray(x)
    if arr.dtype.kind == "c":
        raise TypeError("erf does not support complex input")
    out_dtype = arr.dtype if arr.dtype.kind == "f" else np.dtype(np.float64)
    flat = arr.reshape(-1)
    out = np.empty(flat.shape, out_dtype)
    with np.errstate(all="ignore"):
        for start in range(0, flat.size, _BLOCK):
            block = slice(start, start + _BLOCK)
            _erf_block(flat[block].astype(np.float64, copy=False), out[block])
    return out.reshape(arr.shape)
