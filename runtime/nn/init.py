"""runtime.nn.init: torch.nn.init's initialisers; each fills a tensor in place without recording autograd
history and returns it."""
from __future__ import annotations

import contextlib
import functools
import math
import threading
import warnings

import numpy as np

from .. import dtypes as dt
from .. import factories
from ..autograd.grad_mode import no_grad

__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
]


class _SkipState(threading.local):
    active = False


_skip = _SkipState()


@contextlib.contextmanager
def skipped():
    """Inside this block every initialiser returns its tensor untouched (used by nn.utils.skip_init)."""
    previous, _skip.active = _skip.active, True
    try:
        yield
    finally:
        _skip.active = previous


def _no_grad(fn):
    """Run an initialiser under no_grad, so filling a parameter records nothing (or skip it, see skipped)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _skip.active:
            return args[0] if args else kwargs.get("tensor")
        with no_grad():
            return fn(*args, **kwargs)

    return wrapper


_LINEAR_FNS = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity (torch's values)."""
    if nonlinearity in _LINEAR_FNS or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    if tensor.dim() < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    receptive_field_size = math.prod(tensor.shape[2:])
    fan_in = tensor.size(1) * receptive_field_size
    fan_out = tensor.size(0) * receptive_field_size
    return fan_in, fan_out


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    valid_modes = ["fan_in", "fan_out"]
    if mode not in valid_modes:
        raise ValueError(f"Mode {mode} not supported, please use one of {valid_modes}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


@_no_grad
def uniform_(tensor, a=0.0, b=1.0, generator=None):
    return tensor.uniform_(a, b, generator=generator)


@_no_grad
def normal_(tensor, mean=0.0, std=1.0, generator=None):
    return tensor.normal_(mean, std, generator=generator)


def _erfinv(x):
    """erf^-1 on a float64 tensor: Giles' approximation, refined by Newton steps on runtime's erf."""
    # NOTE: computed on x pulled inside (-1, 1) so nothing is infinite (inf - inf would give nan);
    # the exact endpoints are put back at the end as +-inf.
    x = x.to(dt.float64)
    edge = 1.0 - 2.0 ** -53
    xs = x.clamp(-edge, edge)
    w = -((1 - xs) * (1 + xs)).log()
    central = w - 2.5
    p = w.new_full(tuple(w.shape), 2.81022636e-08)
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503, -0.00417768164,
              0.246640727, 1.50140941):
        p = p * central + c
    tail = w.sqrt() - 3
    q = w.new_full(tuple(w.shape), -0.000200214257)
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047,
              1.00167406, 2.83297682):
        q = q * tail + c
    y = p.where(w < 5, q) * xs
    # NOTE: Newton steps on erf(y) = x, each bounded to +-0.25 so that the far tail (where erf' is ~1e-15
    # and float64 inputs near 1 are spaced 1e-16 apart, so y is ill-conditioned) cannot jump away.
    for _ in range(3):
        step = (y.erf() - xs) / ((-(y * y)).exp() * (2 / math.sqrt(math.pi)))
        y = y - step.clamp(-0.25, 0.25)
    return y.where(x < 1, math.inf).where(x > -1, -math.inf)


@_no_grad
def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Normal(mean, std) truncated to [a, b] (absolute bounds), by the inverse-CDF method as in torch."""

    def norm_cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. The distribution of values "
                      "may be incorrect.", stacklevel=2)
    low, high = norm_cdf((a - mean) / std), norm_cdf((b - mean) / std)
    # drawn and transformed in float64 whatever the tensor's dtype, then copied in
    u = factories.empty(tuple(tensor.shape), dtype=dt.float64).uniform_(2 * low - 1, 2 * high - 1,
                                                                        generator=generator)
    values = (_erfinv(u) * (std * math.sqrt(2.0)) + mean).clamp(min=a, max=b)
    return tensor.copy_(values)


@_no_grad
def constant_(tensor, val):
    return tensor.fill_(val)


@_no_grad
def ones_(tensor):
    return tensor.fill_(1.0)


@_no_grad
def zeros_(tensor):
    return tensor.zero_()


@_no_grad
def eye_(tensor):
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return tensor.copy_(factories.eye(*tensor.shape, dtype=tensor.dtype))


@_no_grad
def dirac_(tensor, groups=1):
    """The identity for convolutions: each output channel passes one input channel's centre through."""
    dimensions = tensor.ndim
    if dimensions not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    sizes = tuple(tensor.shape)
    if sizes[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    out_per_group = sizes[0] // groups
    min_dim = min(out_per_group, sizes[1])
    tensor.zero_()
    centre = tuple(s // 2 for s in sizes[2:])
    for g in range(groups):
        for d in range(min_dim):
            tensor[(g * out_per_group + d, d) + centre] = 1
    return tensor


@_no_grad
def xavier_uniform_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return tensor.uniform_(-a, a, generator=generator)


@_no_grad
def xavier_normal_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return tensor.normal_(0.0, std, generator=generator)


def _kaiming_std(tensor, a, mode, nonlinearity):
    fan = _calculate_correct_fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    return gain / math.sqrt(fan)


@_no_grad
def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    if 0 in tuple(tensor.shape):
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return tensor.uniform_(-bound, bound, generator=generator)


@_no_grad
def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    if 0 in tuple(tensor.shape):
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    return tensor.normal_(0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator=generator)


@_no_grad
def orthogonal_(tensor, gain=1, generator=None):
    """A (semi-)orthogonal matrix: QR of a standard normal matrix, with R's diagonal signs folded into Q so the
    result is uniformly (Haar) distributed; dims after the first are flattened."""
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    flat = factories.empty(rows, cols, dtype=dt.float64).normal_(0.0, 1.0, generator=generator).numpy()
    if rows < cols:
        flat = flat.T
    # NOTE: numpy's QR (there is no QR primitive; an initialiser is not traced or differentiated).
    q, r = np.linalg.qr(flat)
    signs = np.sign(np.diag(r))
    q = q * np.where(signs == 0, 1.0, signs)
    if rows < cols:
        q = q.T
    tensor.copy_(factories.from_numpy(np.ascontiguousarray(q)).reshape(tuple(tensor.shape)))
    return tensor.mul_(gain)


@_no_grad
def sparse_(tensor, sparsity, std=0.01, generator=None):
    """Normal(0, std) with a fraction `sparsity` of each column set to zero."""
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    rows, cols = tensor.shape
    num_zeros = int(math.ceil(sparsity * rows))
    tensor.normal_(0.0, std, generator=generator)
    for col in range(cols):
        zero_rows = factories.randperm(rows, generator=generator)[:num_zeros]
        tensor[zero_rows, col] = 0
    return tensor


def _deprecated(new):
    old_name = new.__name__[:-1]

    def deprecated_init(*args, **kwargs):
        warnings.warn(f"`nn.init.{old_name}` is now deprecated in favor of `nn.init.{new.__name__}`.",
                      FutureWarning, stacklevel=2)
        return new(*args, **kwargs)

    deprecated_init.__name__ = old_name
    deprecated_init.__doc__ = f"Deprecated alias of {new.__name__}."
    return deprecated_init


uniform = _deprecated(uniform_)
normal = _deprecated(normal_)
constant = _deprecated(constant_)
xavier_uniform = _deprecated(xavier_uniform_)
xavier_normal = _deprecated(xavier_normal_)
kaiming_uniform = _deprecated(kaiming_uniform_)
kaiming_normal = _deprecated(kaiming_normal_)
orthogonal = _deprecated(orthogonal_)
sparse = _deprecated(sparse_)
