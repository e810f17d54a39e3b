"""torch.fft: discrete Fourier transforms and their helpers, on runtime.ops' fft_c2c, fft_r2c and fft_c2r primitives
(numpy's pocketfft underneath), with torch's argument rules, dtypes and gradients."""
from __future__ import annotations

import warnings

import numpy as np

from . import dtypes as dt
from .api import conj, roll, wrap_dim
from .factories import tensor
from .ops import _DUAL_NORM, apply
from .tensor import Tensor

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

def _c2c(input, s, dim, norm, forward: bool):
    dims, sizes = _plan(input, s, dim, _all_dims)
    return apply("fft_c2c", _resized(_as_complex(input), dims, sizes), dims=dims, norm=_norm(norm), forward=forward)


def fftn(input, s=None, dim=None, norm=None):
    return _c2c(input, s, dim, norm, forward=True)


def ifftn(input, s=None, dim=None, norm=None):
    return _c2c(input, s, dim, norm, forward=False)


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


# -- short-time transforms (torch.stft and torch.istft; api.stft and api.istft call these) ---------------------------

def _window_of(window, win_length: int, n_fft: int, like, name: str):
    """The window, centered in n_fft values (zeros around a shorter one); a rectangular one when none is given."""
    if window is None:
        warnings.warn(f"{name}: a window was not provided; a rectangular window is applied, which is known to "
                      f"cause spectral leakage (torch warns alike)", UserWarning, stacklevel=4)
        window = like.new_ones((win_length,), dtype=_real_dtype(like))
    if window.ndim != 1 or window.shape[0] != win_length:
        raise RuntimeError(f"{name}: expected a 1-D window of win_length={win_length} values, got shape "
                           f"{list(window.shape)}")
    if win_length > n_fft or win_length < 1:
        raise RuntimeError(f"{name}: expected 0 < win_length <= n_fft, but got win_length={win_length}")
    left = (n_fft - win_length) // 2
    return _resized(apply("constant_pad", window, pads=((left, 0, 0),), value=0), (0,), (n_fft,))


def _real_dtype(x) -> dt.dtype:
    return x.dtype.to_real() if x.dtype.is_complex else _float_of(x)


def stft(input, n_fft, hop_length=None, win_length=None, window=None, center=True, pad_mode="reflect",
         normalized=False, onesided=None, return_complex=None):
    """Fourier transforms of windowed frames of a signal [L] or [B, L]: [(B,) n_fft // 2 + 1 or n_fft, frames]."""
    if return_complex is None and not input.dtype.is_complex and (window is None or not window.dtype.is_complex):
        raise RuntimeError("stft requires the return_complex parameter be given for real inputs, and will further "
                           "require that return_complex=True in a future PyTorch release.")
    if input.ndim not in (1, 2):
        raise RuntimeError(f"stft: expected a 1D or 2D tensor, got shape {list(input.shape)}")
    hop_length = n_fft // 4 if hop_length is None else hop_length
    win_length = n_fft if win_length is None else win_length
    if hop_length <= 0:
        raise RuntimeError(f"stft: expected hop_length > 0, but got hop_length={hop_length}")
    x = input.unsqueeze(0) if input.ndim == 1 else input
    if center:
        from .nn.functional import pad

        x = pad(x.unsqueeze(1), (n_fft // 2, n_fft // 2), mode=pad_mode).squeeze(1)
    if not 0 < n_fft <= x.shape[-1]:
        raise RuntimeError(f"stft: expected 0 < n_fft <= {x.shape[-1]} (the padded signal's length), but got "
                           f"n_fft={n_fft}")
    frames = x.unfold(-1, n_fft, hop_length) * _window_of(window, win_length, n_fft, x, "stft")
    complex_input = frames.dtype.is_complex
    onesided = not complex_input if onesided is None else onesided
    if onesided and complex_input:
        raise RuntimeError("Cannot have onesided output if window or input is complex")
    norm = "ortho" if normalized else "backward"
    spectrum = (rfft(frames, norm=norm) if onesided else fft(frames, norm=norm)).transpose(-2, -1)
    spectrum = spectrum.squeeze(0) if input.ndim == 1 else spectrum
    if return_complex is False:
        warnings.warn("stft with return_complex=False is deprecated (as in torch): it returns view_as_real",
                      UserWarning, stacklevel=3)
        from .api import view_as_real

        return view_as_real(spectrum)
    return spectrum


def istft(input, n_fft, hop_length=None, win_length=None, window=None, center=True, normalized=False,
          onesided=None, length=None, return_complex=False):
    """The signal whose stft is `input`: inverse transforms of the frames, overlap-added and divided by the sum of
    the squared windows (torch's istft; that sum must not vanish anywhere it divides)."""
    if not input.dtype.is_complex:
        raise RuntimeError("istft requires a complex-valued input tensor")
    if input.ndim not in (2, 3):
        raise RuntimeError(f"istft: expected a 2D or 3D complex tensor, got shape {list(input.shape)}")
    hop_length = n_fft // 4 if hop_length is None else hop_length
    win_length = n_fft if win_length is None else win_length
    onesided = input.shape[-2] != n_fft if onesided is None else onesided
    bins = n_fft // 2 + 1 if onesided else n_fft
    if input.shape[-2] != bins:
        raise RuntimeError(f"istft: expected the frequency dim to have {bins} bins for n_fft={n_fft} "
                           f"({'one' if onesided else 'two'}-sided), got {input.shape[-2]}")
    spectrum = (input.unsqueeze(0) if input.ndim == 2 else input).transpose(-2, -1)
    norm = "ortho" if normalized else "backward"
    if return_complex:
        if onesided:
            raise RuntimeError("cannot have onesided output if the output is complex")
        frames = ifft(spectrum, n=n_fft, norm=norm)
    else:
        frames = irfft(spectrum[..., : n_fft // 2 + 1], n=n_fft, norm=norm)
    win = _window_of(window, win_length, n_fft, frames, "istft")
    count = frames.shape[-2]
    total = n_fft + hop_length * (count - 1)
    signal = _overlap_add(frames * win, hop_length, total)
    envelope = _overlap_add((win * win).expand(1, count, n_fft), hop_length, total)
    start = n_fft // 2 if center else 0
    end = total if length is None and not center else (start + length if length is not None else total - start)
    end = min(end, total)
    signal, envelope = signal[..., start:end], envelope[..., start:end]
    if isinstance(envelope, Tensor) and bool((envelope.abs() < 1e-11).any()):  # (eager: a trace divides as is)
        raise RuntimeError("istft: window overlap add min: the windows' squares sum to zero somewhere (choose a "
                           "window and hop_length whose overlaps cover every sample)")
    signal = signal / envelope
    if length is not None and signal.shape[-1] < length:
        signal = _resized(signal, (signal.ndim - 1,), (length,))
    return signal.squeeze(0) if input.ndim == 2 else signal


def _overlap_add(frames, hop: int, total: int):
    """Frames [B, count, n] summed at offsets 0, hop, 2 hop, ... into signals [B, total]."""
    batch, count, n = frames.shape
    positions = (np.arange(count)[:, None] * hop + np.arange(n)[None, :]).reshape(-1)
    return frames.new_zeros((batch, total)).index_add(1, tensor(positions), frames.reshape(batch, count * n))
