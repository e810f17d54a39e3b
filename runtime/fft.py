"""torch.fft: discrete Fourier transforms and their helpers, on runtime.ops' fft_c2c, fft_r2c and fft_c2r primitives
(numpy's pocketfft underneath), with torch's argument rules, dtypes and gradients."""
from __future__ import annotations

import numpy as np

from . import dtypes as dt
from .api import conj, roll, wrap_dim
from .factories import tensor
from .ops import _DUAL_NORM, apply

__all__ = ["fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2", "rfftn", "irfftn",
           "hfft", "ihfft", "hfft2", "ihfft2", "hfftn", "ihfftn", "fftfreq", "rfftfreq", "fftshift", "ifftshift"]


# -- argument handling -----------------------------------------------------------------------------------------------

def _norm(norm) -> str:
    norm = "backward" if norm is None else norm
    if norm not in _DUAL_NORM:
        raise ValueError(f"Invalid normalization mode: {norm!r} (expected 'forward', 'backward' or 'ortho')")
    return norm


def _plan(x, s, dim, default_dims) -> tuple:
    """(dims, sizes) as torch reads s and dim: s alone names the last len(s) dims; a size of -1 keeps the input's."""
    if dim is None:
        dims = tuple(range(x.ndim - len(s), x.ndim)) if s is not None else default_dims(x.ndim)
    else:
        dims = tuple(wrap_dim(d, x.ndim) for d in ((dim,) if isinstance(dim, int) else dim))
    if len(set(dims)) != len(dims):
        raise RuntimeError(f"FFT dims must be unique, got {list(dims)}")
    if s is None:
        return dims, tuple(x.shape[d] for d in dims)
    if len(s) != len(dims):
        raise RuntimeError(f"When given, dim and shape arguments must have the same length; got s={list(s)} and "
                           f"dim={list(dims)}")
    sizes = tuple(x.shape[d] if n == -1 else n for d, n in zip(dims, s))
    if any(n < 1 for n in sizes):
        raise RuntimeError(f"Invalid number of data points ({min(sizes)}) specified")
    return dims, sizes


def _all_dims(ndim: int) -> tuple:
    return tuple(range(ndim))


def _last_two(ndim: int) -> tuple:
    return (ndim - 2, ndim - 1)


def _resized(x, dims, sizes):
    """x cropped or zero-padded at the end of each of dims to its size there."""
    if all(x.shape[d] == n for d, n in zip(dims, sizes)):
        return x
    wanted = dict(zip(dims, sizes))
    pads = tuple((0, wanted[d] - x.shape[d], 0) if d in wanted else (0, 0, 0) for d in range(x.ndim))
    return apply("constant_pad", x, pads=pads, value=0)


def _as_complex(x):
    if x.dtype.is_complex:
        return x
    return x.to(_float_of(x).to_complex())


def _as_real(x, name: str):
    if x.dtype.is_complex:
        raise RuntimeError(f"{name} expects a real input tensor, but got {x.dtype}")
    return x.to(_float_of(x))


def _float_of(x) -> dt.dtype:
    d = x.dtype
    if d in (dt.float16, dt.bfloat16):
        raise RuntimeError(f"Unsupported dtype {d.name}: the CPU FFT computes in float32 or float64")
    return d if d in (dt.float32, dt.float64) else dt.get_default_dtype()


def _one(n, dim):
    return (None if n is None else (n,)), (dim,)


# -- complex to complex ----------------------------------------------------------------------------------------------

def fftn(input, s=None, dim=None, norm=None):
    dims, sizes = _plan(input, s, dim, _all_dims)
    x = _resized(_as_complex(input), dims, sizes)
    return apply("fft_c2c", x, dims=dims, norm=_norm(norm), forward=True)


def ifftn(input, s=None, dim=None, norm=None):
    dims, sizes = _plan(input, s, dim, _all_dims)
    x = _resized(_as_complex(input), dims, sizes)
    return apply("fft_c2c", x, dims=dims, norm=_norm(norm), forward=False)


def fft(input, n=None, dim=-1, norm=None):
    return fftn(input, *_one(n, dim), norm)


def ifft(input, n=None, dim=-1, norm=None):
    return ifftn(input, *_one(n, dim), norm)


def fft2(input, s=None, dim=(-2, -1), norm=None):
    return fftn(input, s, dim, norm)


def ifft2(input, s=None, dim=(-2, -1), norm=None):
    return ifftn(input, s, dim, norm)


# -- real to half spectrum and back ----------------------------------------------------------------------------------

def rfftn(input, s=None, dim=None, norm=None):
    dims, sizes = _plan(input, s, dim, _all_dims)
    x = _resized(_as_real(input, "rfftn"), dims, sizes)
    return apply("fft_r2c", x, dims=dims, norm=_norm(norm))


def irfftn(input, s=None, dim=None, norm=None):
    """Real values from a half spectrum; the last transformed dim has s[-1] values, by default 2 * (bins - 1)."""
    dims, sizes = _plan(input, s, dim, _all_dims)
    last = dims[-1]
    length = sizes[-1] if s is not None and s[-1] != -1 else 2 * (input.shape[last] - 1)
    if length < 1:
        raise RuntimeError(f"Invalid number of data points ({length}) specified")
    x = _resized(_as_complex(input), dims, sizes[:-1] + (length // 2 + 1,))
    return apply("fft_c2r", x, dims=dims, norm=_norm(norm), last_size=length)


def rfft(input, n=None, dim=-1, norm=None):
    return rfftn(input, *_one(n, dim), norm)


def irfft(input, n=None, dim=-1, norm=None):
    return irfftn(input, *_one(n, dim), norm)


def rfft2(input, s=None, dim=(-2, -1), norm=None):
    return rfftn(input, s, dim, norm)


def irfft2(input, s=None, dim=(-2, -1), norm=None):
    return irfftn(input, s, dim, norm)


# -- Hermitian input: real output, and back (numpy's identities) -----------------------------------------------------

def hfftn(input, s=None, dim=None, norm=None):
    """The FFT of a Hermitian-symmetric signal given by its half: irfftn of the conjugate under the dual norm."""
    return irfftn(conj(_as_complex(input)), s, dim, _DUAL_NORM[_norm(norm)])


def ihfftn(input, s=None, dim=None, norm=None):
    """The half of the inverse FFT of a real signal: the conjugate of rfftn under the dual norm."""
    return conj(rfftn(input, s, dim, _DUAL_NORM[_norm(norm)]))


def hfft(input, n=None, dim=-1, norm=None):
    return hfftn(input, *_one(n, dim), norm)


def ihfft(input, n=None, dim=-1, norm=None):
    return ihfftn(input, *_one(n, dim), norm)


def hfft2(input, s=None, dim=(-2, -1), norm=None):
    return hfftn(input, s, dim, norm)


def ihfft2(input, s=None, dim=(-2, -1), norm=None):
    return ihfftn(input, s, dim, norm)


# -- helpers ---------------------------------------------------------------------------------------------------------

def fftfreq(n, d=1.0, *, dtype=None, device=None, requires_grad=False, **_):
    """The sample frequencies of an n-point FFT with sample spacing d: [0, 1, ..., -1] / (d * n)."""
    return tensor(np.fft.fftfreq(n, d), dtype=dtype or dt.get_default_dtype(), device=device,
                  requires_grad=requires_grad)


def rfftfreq(n, d=1.0, *, dtype=None, device=None, requires_grad=False, **_):
    """The sample frequencies of an n-point rfft: [0, 1, ..., n // 2] / (d * n)."""
    return tensor(np.fft.rfftfreq(n, d), dtype=dtype or dt.get_default_dtype(), device=device,
                  requires_grad=requires_grad)


def fftshift(input, dim=None):
    """The zero frequency moved to the middle of each dim (all by default)."""
    dims = _all_dims(input.ndim) if dim is None else ((dim,) if isinstance(dim, int) else tuple(dim))
    return roll(input, tuple(input.shape[d] // 2 for d in dims), dims)


def ifftshift(input, dim=None):
    """fftshift undone."""
    dims = _all_dims(input.ndim) if dim is None else ((dim,) if isinstance(dim, int) else tuple(dim))
    return roll(input, tuple(-(input.shape[d] // 2) for d in dims), dims)
