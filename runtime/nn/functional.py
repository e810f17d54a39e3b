"""runtime.nn.functional: torch.nn.functional as compositions of tensor methods (no primitives of its own).

Every function here is built from public tensor methods, `runtime.api` functions and factories, so
autograd comes for free and a graph tracer sees only op-table primitives. Where a numerically stable
form was chosen it is marked `# NOTE:`. Checks that read tensor *values* (target ranges, probabilities
in [0, 1]) run only on eager tensors, never on a tracer's proxies.
"""
from __future__ import annotations

import itertools
import math
import warnings

from .. import amp
from .. import api
from .. import dtypes as dt
from .. import factories
from ..autograd.grad_mode import is_grad_enabled, no_grad
from ..ops import apply, broadcast_shapes
from .attention import check_usable as _check_sdpa_backends
from ..tensor import Tensor

__all__ = [
    "linear", "bilinear", "relu", "relu_", "relu6", "leaky_relu", "leaky_relu_", "hardtanh", "elu", "selu",
    "gelu", "silu", "mish", "sigmoid", "tanh", "softplus", "softsign", "logsigmoid", "hardsigmoid", "hardswish",
    "glu", "softmax", "log_softmax", "softmin", "normalize", "one_hot",
    "dropout", "dropout1d", "dropout2d", "dropout3d", "embedding",
    "layer_norm", "batch_norm", "group_norm",
    "conv1d", "conv2d", "conv3d", "max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "pad", "scaled_dot_product_attention", "cosine_similarity",
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "nll_loss", "cross_entropy", "kl_div",
    "binary_cross_entropy", "binary_cross_entropy_with_logits",
]

_INF = math.inf


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _is_eager(x) -> bool:
    """Values can be read (eager tensor), as opposed to a tracer's proxy."""
    return isinstance(x, Tensor)


def _ntuple(value, n: int, what: str) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) == 1:
            return tuple(value) * n
        if len(value) != n:
            raise RuntimeError(f"expected {what} to be a single integer value or a list of {n} values, "
                               f"but got {list(value)}")
        return tuple(int(v) for v in value)
    return (int(value),) * n


def _inplace(input, fn):
    """fn(input) written into input's memory (the `inplace=True` variants).

    While recording gradients the function reads a clone, so nothing saved for backward is overwritten.
    """
    source = input.clone() if is_grad_enabled() and input.requires_grad else input
    return input.copy_(fn(source))


def _reduction_from_legacy(size_average, reduce) -> str:
    warnings.warn("size_average and reduce args will be deprecated, please use reduction='mean' (or 'sum', "
                  "'none') instead.", stacklevel=3)
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


def _reduction(size_average, reduce, reduction) -> str:
    if size_average is not None or reduce is not None:
        return _reduction_from_legacy(size_average, reduce)
    return reduction


def _reduce(loss, reduction: str):
    if reduction == "none":
        return loss
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _check_reduction(reduction: str, allowed=("none", "mean", "sum")) -> None:
    if reduction not in allowed:
        raise ValueError(f"{reduction} is not a valid value for reduction")


def _broadcast_pair(name: str, input, target):
    """input and target broadcast to one shape; torch's warning when they differ, a clear error if they can't."""
    if tuple(input.shape) == tuple(target.shape):
        return input, target
    try:
        shape = broadcast_shapes(tuple(input.shape), tuple(target.shape))
    except RuntimeError:
        raise RuntimeError(f"{name}: the input of shape {list(input.shape)} and the target of shape "
                           f"{list(target.shape)} can't be broadcast together") from None
    warnings.warn(f"Using a target size ({target.shape}) that is different to the input size ({input.shape}). "
                  f"This will likely lead to incorrect results due to broadcasting. Please ensure they have the "
                  f"same size.", stacklevel=3)
    return input.expand(shape), target.expand(shape)


def _same_shape(name: str, input, target, exc=ValueError) -> None:
    if tuple(input.shape) != tuple(target.shape):
        raise exc(f"{name}: target size ({list(target.shape)}) must be the same as input size "
                  f"({list(input.shape)})")


# ---------------------------------------------------------------------------------------------
# Linear layers
# ---------------------------------------------------------------------------------------------

@api.rounds_bfloat16_once
def linear(input, weight, bias=None):
    """y = x W^T + b."""
    out = apply("linear", input, weight)
    return out if bias is None else out + amp.autocast_bias(bias)


def bilinear(input1, input2, weight, bias=None):
    """y_k = x1^T W_k x2 + b_k for weight (out, in1, in2)."""
    if weight.ndim != 3:
        raise RuntimeError(f"bilinear(): weight must be 3-D (out_features, in1_features, in2_features), "
                           f"got shape {list(weight.shape)}")
    out_f, in1, in2 = weight.shape
    if input1.shape[-1] != in1 or input2.shape[-1] != in2 or tuple(input1.shape[:-1]) != tuple(input2.shape[:-1]):
        raise RuntimeError(f"bilinear(): input1 {list(input1.shape)} and input2 {list(input2.shape)} do not match "
                           f"weight {list(weight.shape)} (expected [*, {in1}] and [*, {in2}] with equal batch dims)")
    # x1 @ W, with W viewed as (in1, out * in2), then contracted with x2 over in2.
    t = api.matmul(input1, weight.permute(1, 0, 2).reshape(in1, out_f * in2))
    t = t.reshape(tuple(input1.shape[:-1]) + (out_f, in2))
    out = (t * input2.unsqueeze(-2)).sum(-1)
    return out if bias is None else out + bias


# ---------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------

def relu(input, inplace=False):
    return input.relu_() if inplace else input.relu()


def relu_(input):
    return input.relu_()


def _leaky_relu(x, negative_slope):
    return api.where(x > 0, x, x * negative_slope)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    if inplace:
        return _inplace(input, lambda x: _leaky_relu(x, negative_slope))
    return _leaky_relu(input, negative_slope)


def leaky_relu_(input, negative_slope=0.01):
    return leaky_relu(input, negative_slope, inplace=True)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    if inplace:
        return input.clamp_(min_val, max_val)
    return input.clamp(min_val, max_val)


def relu6(input, inplace=False):
    return hardtanh(input, 0.0, 6.0, inplace)


def _elu(x, alpha, scale=1.0):
    # NOTE: exp is taken of min(x, 0), so the unselected branch never overflows to inf (an inf there
    # would turn its zero gradient into nan).
    negative = (x.clamp(max=0.0).exp() - 1) * alpha
    out = api.where(x > 0, x, negative)
    return out if scale == 1.0 else out * scale


def elu(input, alpha=1.0, inplace=False):
    if inplace:
        return _inplace(input, lambda x: _elu(x, alpha))
    return _elu(input, alpha)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input, inplace=False):
    if inplace:
        return _inplace(input, lambda x: _elu(x, _SELU_ALPHA, _SELU_SCALE))
    return _elu(input, _SELU_ALPHA, _SELU_SCALE)


_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@api.rounds_bfloat16_once
def gelu(input, approximate="none"):
    if approximate == "none":
        return input * 0.5 * (1 + (input * _SQRT_HALF).erf())
    if approximate == "tanh":
        inner = (input + input * input * input * 0.044715) * _SQRT_2_OVER_PI
        return input * 0.5 * (1 + inner.tanh())
    raise ValueError(f"approximate argument must be either none or tanh, got {approximate!r}")


@api.rounds_bfloat16_once
def silu(input, inplace=False):
    if inplace:
        return _inplace(input, lambda x: x * x.sigmoid())
    return input * input.sigmoid()


def sigmoid(input):
    return input.sigmoid()


def tanh(input):
    return input.tanh()


def softplus(input, beta=1.0, threshold=20.0):
    # NOTE: above the threshold softplus is the identity (as in torch); below it log1p(exp(beta*x))/beta
    # is evaluated on inputs where the large ones are replaced by 0, so exp never overflows into the
    # unselected branch's gradient.
    scaled = input * beta
    linear_region = scaled > threshold
    safe = scaled.masked_fill(linear_region, 0.0)
    soft = safe.exp().log1p() / beta
    return api.where(linear_region, input, soft)


def logsigmoid(input):
    # NOTE: log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): exp never overflows, and no log(0).
    return api.minimum(input, 0.0) - (-input.abs()).exp().log1p()


def softsign(input):
    return input / (input.abs() + 1)


def hardsigmoid(input, inplace=False):
    if inplace:
        return _inplace(input, lambda x: (x + 3).clamp(0.0, 6.0) / 6)
    return (input + 3).clamp(0.0, 6.0) / 6


def hardswish(input, inplace=False):
    if inplace:
        return _inplace(input, lambda x: x * (x + 3).clamp(0.0, 6.0) / 6)
    return input * (input + 3).clamp(0.0, 6.0) / 6


def mish(input, inplace=False):
    if inplace:
        return _inplace(input, lambda x: x * softplus(x).tanh())
    return input * softplus(input).tanh()


def glu(input, dim=-1):
    d = api.wrap_dim(dim, input.ndim)
    if input.shape[d] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {input.shape[d]}")
    a, b = input.chunk(2, d)
    return a * b.sigmoid()


def _softmax_dim(name: str, ndim: int) -> int:
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                  f"as an argument.", stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _softmax_dim("softmax", input.ndim)
    return api.softmax(input, dim, dtype=dtype)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _softmax_dim("softmin", input.ndim)
    return api.softmax(-input if dtype is None else -input.to(dtype), dim)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _softmax_dim("log_softmax", input.ndim)
    return api.log_softmax(input, dim, dtype=dtype)


def _norm(x, p, dim, eps):
    """max(||x||_p, eps) along dim (keepdim)."""
    # NOTE: the floor is applied to sum(|x|^p) (as eps^p) before the root: the same value as clamping
    # the norm, but a zero vector then has a zero gradient instead of 0 * inf = nan from the root.
    if p == 2:
        return (x * x).sum(dim, keepdim=True).clamp(min=eps * eps).sqrt()
    if p == 1:
        return x.abs().sum(dim, keepdim=True).clamp(min=eps)
    if p == _INF:
        return x.abs().amax(dim, keepdim=True).clamp(min=eps)
    return (x.abs() ** p).sum(dim, keepdim=True).clamp(min=eps ** p) ** (1.0 / p)


@api.with_out
def normalize(input, p=2.0, dim=1, eps=1e-12):
    return input / _norm(input, p, api.wrap_dim(dim, input.ndim), eps)


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    if tuple(x1.shape) != tuple(x2.shape):
        shape = broadcast_shapes(tuple(x1.shape), tuple(x2.shape))
        x1, x2 = x1.expand(shape), x2.expand(shape)
    d = api.wrap_dim(dim, x1.ndim)
    # NOTE: each input is divided by its own (clamped) norm before the dot product, as torch does,
    # which avoids overflow in |x1|^2 |x2|^2.
    return ((x1 / _norm(x1, 2, d, eps)) * (x2 / _norm(x2, 2, d, eps))).sum(d)


def one_hot(tensor, num_classes=-1):
    if tensor.dtype is not dt.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        if not _is_eager(tensor):
            raise RuntimeError("one_hot: num_classes must be given when tracing")
        num_classes = int(tensor.max().item()) + 1 if tensor.numel() else 0
    if _is_eager(tensor) and tensor.numel():
        if bool((tensor < 0).any()):
            raise RuntimeError("Class values must be non-negative.")
        if bool((tensor >= num_classes).any()):
            raise RuntimeError("Class values must be smaller than num_classes.")
    classes = factories.arange(num_classes)
    return (tensor.unsqueeze(-1) == classes).to(dt.int64)


# ---------------------------------------------------------------------------------------------
# Dropout and embedding
# ---------------------------------------------------------------------------------------------

def _check_p(p) -> None:
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _dropout_mask(input, p, mask_shape):
    """keep-mask scaled by 1/(1-p): Bernoulli(1-p) from runtime.rand on the default generator."""
    if p == 1.0:
        return input.new_zeros(mask_shape)
    draw_dtype = input.dtype if input.dtype in (dt.float32, dt.float64) else dt.float32
    keep = factories.rand(mask_shape, dtype=draw_dtype, device=factories._device_of(input)) >= p
    return keep.to(input.dtype) * (1.0 / (1.0 - p))


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero each element with probability p and scale the rest by 1 / (1 - p) (the identity unless training).
    nnc.compile draws the mask in its kernels from Philox instead of this stream: see nn.Dropout."""
    _check_p(p)
    if not training or p == 0.0:
        return input
    mask = _dropout_mask(input, p, tuple(input.shape))
    return input.mul_(mask) if inplace else input * mask


def _check_feature_rank(name, input, spatial) -> None:
    if input.ndim not in (spatial + 1, spatial + 2):
        raise RuntimeError(f"{name}: Expected {spatial + 1}D or {spatial + 2}D input, but received a "
                           f"{input.ndim}D input of shape {list(input.shape)}")


def _feature_dropout(input, p, training, inplace, spatial):
    _check_p(p)
    if not training or p == 0.0:
        return input
    # One draw per (sample, channel), broadcast over the spatial dims.
    lead = tuple(input.shape[:input.ndim - spatial])
    mask = _dropout_mask(input, p, lead + (1,) * spatial)
    return input.mul_(mask) if inplace else input * mask


def dropout1d(input, p=0.5, training=True, inplace=False):
    _check_feature_rank("dropout1d", input, 1)
    return _feature_dropout(input, p, training, inplace, 1)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Channel-wise dropout of (N, C, H, W) or (C, H, W). As torch does, any other rank is read as (N, C, *rest)
    with a warning (a 3-D input as (N, C, L), channel-wise 1-D dropout), and fewer than 2 dims are an error."""
    if input.ndim < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    if input.ndim not in (3, 4):
        warnings.warn(f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is deprecated and will "
                      f"result in an error in a future release. To retain the behavior and silence this warning, "
                      f"please use dropout instead. Note that dropout2d exists to provide channel-wise dropout on "
                      f"inputs with 2 spatial dimensions, a channel dimension, and an optional batch dimension "
                      f"(i.e. 3D or 4D inputs).", UserWarning, stacklevel=2)
    if input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout "
                      "behavior is desired - input is interpreted as shape (N, C, L), where C is the channel dim. "
                      "This behavior will change in a future release to interpret the input as one without a batch "
                      "dimension, i.e. shape (C, H, W). To maintain the 1D channel-wise dropout behavior, please "
                      "switch to using dropout1d instead.", UserWarning, stacklevel=2)
    return _feature_dropout(input, p, training, inplace, input.ndim - 2)


def dropout3d(input, p=0.5, training=True, inplace=False):
    _check_feature_rank("dropout3d", input, 3)
    return _feature_dropout(input, p, training, inplace, 3)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    if input.dtype not in (dt.int64, dt.int32):
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                           f"Long, Int; but got {input.dtype} instead (while checking arguments for embedding)")
    if weight.ndim != 2:
        raise RuntimeError(f"embedding: 'weight' must be 2-D, got shape {list(weight.shape)}")
    num = weight.shape[0]
    if padding_idx is not None:
        if not -num <= padding_idx < num:
            raise AssertionError("Padding_idx must be within num_embeddings")
        padding_idx = padding_idx + num if padding_idx < 0 else padding_idx
    if scale_grad_by_freq:
        raise NotImplementedError("embedding(scale_grad_by_freq=True) is not supported")
    if sparse:
        raise NotImplementedError("embedding(sparse=True): sparse gradients are not supported")
    flat = input.reshape(-1)
    if _is_eager(flat) and flat.numel() and bool(((flat < 0) | (flat >= num)).any()):
        bad = next(v for v in flat.tolist() if not 0 <= v < num)
        raise IndexError(f"index out of range in self: embedding index {bad} with num_embeddings={num}")
    if max_norm is not None:
        _embedding_renorm_(weight, flat, max_norm, norm_type)
    out = api._own(weight.index_select(0, flat).reshape(tuple(input.shape) + (weight.shape[1],)))
    if padding_idx is not None:
        # The padding row is looked up like any other, but its rows pass no gradient to the weight.
        out = api.where((input == padding_idx).unsqueeze(-1), out.detach(), out)
    return out


def _embedding_renorm_(weight, indices, max_norm, norm_type) -> None:
    """Rescale, in place and without recording, the looked-up rows whose norm exceeds max_norm."""
    with no_grad():
        rows = weight.index_select(0, indices)
        if norm_type == _INF:
            norms = rows.abs().amax(1, keepdim=True)
        else:
            norms = (rows.abs() ** norm_type).sum(1, keepdim=True) ** (1.0 / norm_type)
        scale = api.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0).to(weight.dtype)
        weight[indices] = rows * scale


# ---------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------

@api.rounds_bfloat16_once
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or input.ndim < k or tuple(input.shape[input.ndim - k:]) != shape:
        raise RuntimeError(f"Given normalized_shape={list(shape)}, expected input with shape "
                           f"[*, {', '.join(map(str, shape))}], but got input of size{list(input.shape)}")
    dims = tuple(range(input.ndim - k, input.ndim))
    mean = input.mean(dims, keepdim=True)
    centered = input - mean
    var = (centered * centered).mean(dims, keepdim=True)  # biased, as torch
    out = centered * (var + eps).rsqrt()
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
               eps=1e-5, *, num_batches_tracked=None):
    """torch's batch_norm; momentum=None is a cumulative average, which needs `num_batches_tracked`
    (the count of batches seen, this one included, as nn.BatchNorm keeps it).
    """
    if input.ndim < 2:
        raise ValueError(f"batch_norm: expected 2D or more input (got {input.ndim}D input)")
    c = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if t is not None and t.numel() != c:
            raise RuntimeError(f"{name} should contain {c} elements not {t.numel()}")
    dims = (0,) + tuple(range(2, input.ndim))
    shape = (1, c) + (1,) * (input.ndim - 2)
    if training and input.numel() == 0:
        out = input.clone()  # NOTE: as torch's: an empty batch normalizes to nothing and leaves the running stats
    elif training:
        count = input.numel() // c
        if count == 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.shape}")
        mean = input.mean(dims, keepdim=True)
        centered = input - mean
        squares = (centered * centered).sum(dims, keepdim=True)
        var = squares / count  # biased, as torch normalizes
        if running_mean is not None or running_var is not None:
            if momentum is None:
                if num_batches_tracked is None:
                    raise TypeError("batch_norm: momentum=None (a cumulative moving average) needs "
                                    "num_batches_tracked, the number of batches seen including this one")
                running = running_mean if running_mean is not None else running_var
                factor = _cumulative_factor(num_batches_tracked, running)
            else:
                factor = float(momentum)
            with no_grad():
                if running_mean is not None:
                    new_mean = running_mean * (1 - factor) + mean.detach().reshape(c) * factor
                    running_mean.copy_(new_mean)
                if running_var is not None:
                    unbiased = squares.detach().reshape(c) / (count - 1)  # torch's; a symbolic count stays one
                    running_var.copy_(running_var * (1 - factor) + unbiased * factor)
        out = centered * (var + eps).rsqrt()
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("running_mean must be defined in evaluation mode")
        out = (input - running_mean.reshape(shape)) * (running_var.reshape(shape) + eps).rsqrt()
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def _cumulative_factor(num_batches_tracked, running):
    """1 / the count of batches seen: a number for a number; for nn.BatchNorm's count buffer a tensor in the running
    stats' dtype, not float(), so a compiled forward keeps it in the graph (no value read while tracing)."""
    if isinstance(num_batches_tracked, (int, float)):
        return 1.0 / num_batches_tracked
    return 1.0 / num_batches_tracked.to(running.dtype)


@api.rounds_bfloat16_once
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    if input.ndim < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {input.ndim}")
    n, c = input.shape[0], input.shape[1]
    if num_groups <= 0 or c % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by num_groups, but got input "
                           f"of shape {list(input.shape)} and num_groups={num_groups}")
    group_size = c // num_groups
    for d in input.shape[2:]:
        group_size = group_size * d
    x = input.reshape(n, num_groups, group_size)  # not -1: an empty batch leaves -1 undetermined
    mean = x.mean(2, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(2, keepdim=True)
    out = (centered * (var + eps).rsqrt()).reshape(tuple(input.shape))
    shape = (1, c) + (1,) * (input.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


# ---------------------------------------------------------------------------------------------
# Padding
# ---------------------------------------------------------------------------------------------

def _constant_pad(x, pads: dict, value):
    """A new tensor of x padded with a constant: pads maps a dim to (before, after, between) (runtime.ops'
    constant_pad); a negative amount crops that edge."""
    return apply("constant_pad", x, pads=tuple(pads.get(d, (0, 0, 0)) for d in range(x.ndim)), value=value)


def _pad_dims(x, pads: dict, value):
    """_constant_pad, or x itself where nothing is padded."""
    return _constant_pad(x, pads, value) if any(any(p) for p in pads.values()) else x


def _pad_index(mode, left, right, size, d, input_shape):
    """Source positions along a dim for reflect / replicate / circular padding."""
    if mode == "reflect":
        if left >= size or right >= size:
            raise RuntimeError(f"Argument #4: Padding size should be less than the corresponding input dimension, "
                               f"but got: padding ({left}, {right}) at dimension {d} of input {list(input_shape)}")
        return list(range(left, 0, -1)) + list(range(size)) + list(range(size - 2, size - 2 - right, -1))
    if mode == "replicate":
        if size == 0:
            raise RuntimeError(f"pad: can't replicate-pad the empty dimension {d} of input {list(input_shape)}")
        return [0] * left + list(range(size)) + [size - 1] * right
    if left > size or right > size:
        raise RuntimeError("Padding value causes wrapping around more than once.")
    return [i % size for i in range(-left, size + right)]


def pad(input, pad, mode="constant", value=None):
    pad = list(pad)
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(pad) // 2 > input.ndim:
        raise RuntimeError(f"Padding length should be less than or equal to two times the input dimension but got "
                           f"padding length {len(pad)} and input of dimension {input.ndim}")
    if mode == "constant":
        pads = {input.ndim - 1 - i: (pad[2 * i], pad[2 * i + 1], 0) for i in range(len(pad) // 2)}
        for d, (left, right, _) in pads.items():
            if (left < 0 or right < 0) and max(-left, 0) + max(-right, 0) > input.shape[d]:
                raise RuntimeError(f"pad: the padding ({left}, {right}) crops dimension {d} of size "
                                   f"{input.shape[d]} to a negative size")
        return _constant_pad(input, pads, 0 if value is None else value)  # a new tensor even for no padding, as torch's
    if mode not in ("reflect", "replicate", "circular"):
        raise NotImplementedError(f"pad: unsupported mode {mode!r} (use 'constant', 'reflect', 'replicate' "
                                  f"or 'circular')")
    if value not in (None, 0, 0.0):
        raise ValueError(f"Padding mode \"{mode}\" doesn't take in value argument.")
    if any(p < 0 for p in pad) and mode != "circular":
        raise RuntimeError("pad: negative padding is only supported in 'constant' and 'circular' modes")
    x = input
    for i in range(len(pad) // 2):
        d = input.ndim - 1 - i
        left, right = pad[2 * i], pad[2 * i + 1]
        if left == 0 and right == 0:
            continue
        if left < 0 or right < 0:  # circular with cropping: crop first, then wrap what is left
            x = _pad_dims(x, {d: (min(left, 0), min(right, 0), 0)}, 0)
            left, right = max(left, 0), max(right, 0)
        index = _pad_index(mode, left, right, x.shape[d], d, input.shape)
        x = x.index_select(d, factories.tensor(index, dtype=dt.int64))
    return x


# ---------------------------------------------------------------------------------------------
# Convolution (im2col: every window of the padded input as a column -> one batched matmul)
# ---------------------------------------------------------------------------------------------

def _windows(x, kernel, stride, dilation, out_sizes):
    """(N, C, K, *out) from x (N, C, *spatial): one strided slice of x per kernel offset, K = prod(kernel)."""
    nd = len(kernel)
    slices = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        key = (slice(None), slice(None)) + tuple(
            slice(o * d, o * d + s * (n - 1) + 1, s) for o, d, s, n in zip(offsets, dilation, stride, out_sizes))
        slices.append(x[key])
    if len(slices) == 1:
        return slices[0].unsqueeze(2)
    assert nd == x.ndim - 2
    return api.stack(slices, 2)


def _fmt_sizes(sizes) -> str:
    return " x ".join(str(s) for s in sizes)


def _conv(name, nd, input, weight, bias, stride, padding, dilation, groups):
    unbatched = input.ndim == nd + 1
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {name}, but got input "
                           f"of size: {list(input.shape)}")
    if weight.ndim != nd + 2:
        raise RuntimeError(f"{name}: expected weight of {nd + 2} dims (out_channels, in_channels/groups, kernel...), "
                           f"but got weight of size {list(weight.shape)}")
    x = input.unsqueeze(0) if unbatched else input
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    out_ch, in_per_group = weight.shape[0], weight.shape[1]
    kernel = tuple(weight.shape[2:])
    if out_ch % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                           f"but got weight of size {list(weight.shape)} instead")
    if x.shape[1] != in_per_group * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {list(weight.shape)}, expected input"
                           f"{list(x.shape)} to have {in_per_group * groups} channels, but got {x.shape[1]} "
                           f"channels instead")
    if bias is not None and tuple(bias.shape) != (out_ch,):
        raise RuntimeError(f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with "
                           f"{out_ch} elements, but got bias of size {list(bias.shape)} instead")
    stride = _ntuple(stride, nd, "stride")
    dilation = _ntuple(dilation, nd, "dilation")
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError("dilation should be greater than zero")
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nd
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise RuntimeError("padding='same' is not supported for strided convolutions")
            # torch puts the odd element of an even total padding on the right.
            pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dilation, kernel)]
        else:
            raise RuntimeError(f"Invalid padding string: '{padding}'")
    else:
        padding = _ntuple(padding, nd, "padding")
        if any(p < 0 for p in padding):
            raise RuntimeError("negative padding is not supported")
        pads = [(p, p) for p in padding]
    spatial = tuple(x.shape[2:])
    padded = tuple(s + left + right for s, (left, right) in zip(spatial, pads))
    effective = tuple(d * (k - 1) + 1 for d, k in zip(dilation, kernel))
    if any(p < e for p, e in zip(padded, effective)):
        raise RuntimeError(f"Calculated padded input size per channel: ({_fmt_sizes(padded)}). Kernel size: "
                           f"({_fmt_sizes(effective)}). Kernel size can't be greater than actual input size")
    out_sizes = tuple((p - e) // s + 1 for p, e, s in zip(padded, effective, stride))
    n = x.shape[0]
    k = math.prod(kernel)
    cols = apply("im2col", x, kernel=kernel, stride=stride, padding=tuple(pads), dilation=dilation)  # (C*K, N*L)
    if groups > 1:  # (g, O/g, Cg*K) @ (g, Cg*K, N*L)
        cols = cols.reshape(groups, in_per_group * k, n * math.prod(out_sizes))
        w = weight.reshape(groups, out_ch // groups, in_per_group * k)
    else:
        w = weight.reshape(out_ch, in_per_group * k)
    out = api.matmul(w, cols)  # (O, N*L), or (g, O/g, N*L)
    if bias is not None:
        # NOTE: added in the product's layout, not to the (N, O, *out) result: nnc computes the add in the matmul's
        # pass, and the bias gradient is a sum along contiguous rows instead of over dims (0, 2, ...) of NCHW
        out = out + amp.autocast_bias(bias).reshape(out.shape[:-1] + (1,))
    out = out.reshape((out_ch, n) + out_sizes).transpose(0, 1).contiguous()
    return out.squeeze(0) if unbatched else out


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


# ---------------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------------

def _pool_output_size(size, k, s, p, d, ceil_mode):
    numerator = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = numerator // s + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside the input or left pad
        out -= 1
    return out


def _pool_setup(name, nd, input, kernel_size, stride, padding, dilation, ceil_mode):
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"{name}: Expected {nd + 1}D or {nd + 2}D (batch mode) tensor for input, but got input "
                           f"of size: {list(input.shape)}")
    unbatched = input.ndim == nd + 1
    x = input.unsqueeze(0) if unbatched else input
    kernel = _ntuple(kernel_size, nd, "kernel_size")
    stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and not stride) \
        else _ntuple(stride, nd, "stride")
    padding = _ntuple(padding, nd, "padding")
    dilation = _ntuple(dilation, nd, "dilation")
    if any(k <= 0 for k in kernel):
        raise RuntimeError(f"{name}: kernel_size must be greater than zero, but got {list(kernel)}")
    if any(s <= 0 for s in stride):
        raise RuntimeError(f"{name}: stride must be greater than zero, but got {list(stride)}")
    if any(d <= 0 for d in dilation):
        raise RuntimeError(f"{name}: dilation must be greater than zero, but got {list(dilation)}")
    for k, p, d in zip(kernel, padding, dilation):
        if p < 0 or p > k // 2:
            raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={p}, "
                               f"kernel_size={k} and dilation={d}")
    spatial = tuple(x.shape[2:])
    out_sizes = tuple(_pool_output_size(n, k, s, p, d, ceil_mode)
                      for n, k, s, p, d in zip(spatial, kernel, stride, padding, dilation))
    if any(o < 1 for o in out_sizes):
        in_desc = "x".join(str(v) for v in (x.shape[1],) + spatial)
        out_desc = "x".join(str(v) for v in (x.shape[1],) + out_sizes)
        raise RuntimeError(f"Given input size: ({in_desc}). Calculated output size: ({out_desc}). "
                           f"Output size is too small")
    # right padding: the symmetric padding plus whatever ceil_mode's last window reaches past it
    pads = []
    for n, k, s, p, d, o in zip(spatial, kernel, stride, padding, dilation, out_sizes):
        reach = (o - 1) * s + d * (k - 1) + 1
        pads.append((p, max(reach - n - p, p)))
    return x, unbatched, kernel, stride, padding, dilation, out_sizes, pads


def _padded(x, pads, value):
    return _pad_dims(x, {2 + i: (left, right, 0) for i, (left, right) in enumerate(pads)}, value)


def _max_pool(name, nd, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    x, unbatched, kernel, stride, padding, dilation, out_sizes, pads = _pool_setup(
        name, nd, input, kernel_size, stride, padding, dilation, ceil_mode)
    if not return_indices and x.dtype.is_floating_point:  # one primitive, forward and backward
        values = apply("max_pool", x, kernel=kernel, stride=stride, padding=tuple(pads), dilation=dilation)
        return values.squeeze(0) if unbatched else values
    fill = -_INF if x.dtype.is_floating_point else _int_min(x.dtype)
    windows = _windows(_padded(x, pads, fill), kernel, stride, dilation, out_sizes)
    # NOTE: max over the window dim by argmax + gather: the gradient goes to the first maximal element
    # only (as torch's max pooling does), not split between ties as amax's rule would.
    values, arg = windows.max(2)
    if not return_indices:
        return values.squeeze(0) if unbatched else values
    indices = _pool_indices(arg, kernel, stride, padding, dilation, out_sizes, tuple(x.shape[2:]))
    if unbatched:
        values, indices = values.squeeze(0), indices.squeeze(0)
    return values, indices


def _int_min(dtype):
    return False if dtype is dt.bool_ else -(2 ** (8 * dtype.itemsize - 1))


def _pool_indices(arg, kernel, stride, padding, dilation, out_sizes, in_sizes):
    """Flat indices into each input plane (torch's return_indices) from the window argmax."""
    nd = len(kernel)
    flat = None
    rest = arg
    for i in reversed(range(nd)):
        offset = rest % kernel[i]
        rest = rest // kernel[i]
        shape = [1] * nd
        shape[i] = out_sizes[i]
        start = (factories.arange(out_sizes[i]) * stride[i] - padding[i]).reshape(tuple(shape))
        pos = start + offset * dilation[i]
        stride_in = math.prod(in_sizes[i + 1:])
        flat = pos * stride_in if flat is None else flat + pos * stride_in
    return flat


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool("max_pool1d", 1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool("max_pool2d", 2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def _avg_pool(name, nd, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    x, unbatched, kernel, stride, padding, dilation, out_sizes, pads = _pool_setup(
        name, nd, input, kernel_size, stride, padding, 1, ceil_mode)
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{name}: expected a floating point input, got {x.dtype}")
    n, c = x.shape[:2]
    planes = x.reshape((n * c, 1) + tuple(x.shape[2:]))  # each plane pooled alone: columns (K, N*C*L)
    cols = apply("im2col", planes, kernel=kernel, stride=stride, padding=tuple(pads), dilation=dilation)
    total = cols.sum(0).reshape((n, c) + out_sizes)
    if divisor_override is not None:
        if divisor_override == 0:
            raise RuntimeError("divisor must be not zero")
        out = total / divisor_override
    elif _whole_windows(tuple(x.shape[2:]), kernel, stride, padding, out_sizes, count_include_pad):
        out = total / float(math.prod(kernel))
    else:
        out = total / x.new_tensor(_avg_divisor(tuple(x.shape[2:]), kernel, stride, padding, pads, out_sizes,
                                                count_include_pad))
    return out.squeeze(0) if unbatched else out


def _whole_windows(spatial, kernel, stride, padding, out_sizes, count_include_pad) -> bool:
    """Whether every window counts kernel-size elements (`_avg_divisor` would be a table of one value): the
    windows start and end within the counted span, as they do without ceil_mode when padding counts or is 0.
    NOTE: decided from the sizes, not by building that table, so that a compiler tracing with symbolic sizes
    gets a divisor that does not depend on them."""
    for n, k, s, p, o in zip(spatial, kernel, stride, padding, out_sizes):
        lo, hi = (-p, n + p) if count_include_pad else (0, n)
        if -p < lo or (o - 1) * s - p + k > hi:
            return False
    return True


def _avg_divisor(spatial, kernel, stride, padding, pads, out_sizes, count_include_pad):
    """The divisor per output position (nested lists): the window's count of input elements, with count_include_pad
    also of the symmetric padding (but not of the extra reach of ceil_mode), as in torch. A constant of the shapes."""
    counts = []
    for n, k, s, p, o in zip(spatial, kernel, stride, padding, out_sizes):
        lo, hi = (-p, n + p) if count_include_pad else (0, n)
        counts.append([float(min(j * s - p + k, hi) - max(j * s - p, lo)) for j in range(o)])

    table = counts[-1]
    for row in reversed(counts[:-1]):
        table = [_scaled(table, c) for c in row]
    return table


def _scaled(table, c):
    return [_scaled(t, c) for t in table] if isinstance(table[0], list) else [c * v for v in table]


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool("avg_pool1d", 1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool("avg_pool2d", 2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def _adaptive_avg(name, nd, input, output_size):
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"{name}: Expected {nd + 1}D or {nd + 2}D tensor, but got input of size "
                           f"{list(input.shape)}")
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * nd
    if len(sizes) != nd:
        raise ValueError(f"{name}: output_size must have {nd} elements, got {list(sizes)}")
    x = input
    first = input.ndim - nd
    for i, out in enumerate(sizes):
        d = first + i
        size = x.shape[d]
        out = size if out is None else int(out)
        if out < 0 or (out == 0 and size):
            raise RuntimeError(f"{name}: output size must be positive, got {list(sizes)}")
        if out == size:
            continue
        if size % out == 0:  # equal bins: a reshape and a mean
            step = size // out
            shape = tuple(x.shape)
            x = x.reshape(shape[:d] + (out, step) + shape[d + 1:]).mean(d + 1)
            continue
        # bin i covers [floor(i*size/out), ceil((i+1)*size/out)); rectangles factor, so pool one dim at a time
        bins = []
        for j in range(out):
            start, stop = (j * size) // out, -((-(j + 1) * size) // out)
            bins.append(x.narrow(d, start, stop - start).mean(d, keepdim=True))
        x = api.cat(bins, d)
    return x


def adaptive_avg_pool1d(input, output_size):
    return _adaptive_avg("adaptive_avg_pool1d", 1, input, output_size)


def adaptive_avg_pool2d(input, output_size):
    return _adaptive_avg("adaptive_avg_pool2d", 2, input, output_size)


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    _check_sdpa_backends()
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise RuntimeError(f"scaled_dot_product_attention: query, key and value must be at least 2-D, got "
                           f"{list(query.shape)}, {list(key.shape)} and {list(value.shape)}")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"scaled_dot_product_attention: shapes do not match: query {list(query.shape)}, key "
                           f"{list(key.shape)}, value {list(value.shape)} (need query[-1] == key[-1] and "
                           f"key[-2] == value[-2])")
    length, source = query.shape[-2], key.shape[-2]
    if enable_gqa and key.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        key, value = _repeat_heads(key, query.shape[-3]), _repeat_heads(value, query.shape[-3])
    scale_factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = api.matmul(query, key.transpose(-2, -1)) * scale_factor
    if is_causal:
        if attn_mask is not None:
            raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when "
                               "is_causal=True")
        allowed = factories.arange(source).reshape(1, source) <= factories.arange(length).reshape(length, 1)
        scores = scores.masked_fill(~allowed, -_INF)
    if attn_mask is not None:
        if attn_mask.dtype is dt.bool_:
            scores = scores.masked_fill(~attn_mask, -_INF)
        else:
            scores = scores + attn_mask
    probs = _safe_softmax(scores)
    if dropout_p > 0.0:
        probs = dropout(probs, dropout_p, training=True)
    return api.matmul(probs, value)


def _safe_softmax(scores):
    """softmax over the last dim, with 0 for rows where every score is -inf (all keys masked), as torch's attention
    gives. NOTE: their scores are replaced by 0 before the softmax, so no nan reaches the forward or the gradient."""
    dead = (scores == -_INF).all(-1, keepdim=True)
    return api.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)


def _repeat_heads(x, heads):
    """(…, Hk, S, E) -> (…, heads, S, E), each key/value head repeated for its group of query heads."""
    hk = x.shape[-3]
    if heads % hk:
        raise RuntimeError(f"scaled_dot_product_attention: number of query heads ({heads}) must be a multiple "
                           f"of the number of key/value heads ({hk})")
    shape = tuple(x.shape)
    lead, (s, e) = shape[:-3], shape[-2:]
    return x.unsqueeze(-3).expand(lead + (hk, heads // hk, s, e)).reshape(lead + (heads, s, e))


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------

@amp.runs_in_float32
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    input, target = _broadcast_pair("mse_loss", input, target)
    diff = input - target
    loss = diff * diff
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@amp.runs_in_float32
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    input, target = _broadcast_pair("l1_loss", input, target)
    loss = (input - target).abs()
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@amp.runs_in_float32
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    input, target = _broadcast_pair("smooth_l1_loss", input, target)
    d = (input - target).abs()
    if beta == 0.0:
        return _reduce(d, reduction)
    loss = api.where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta)
    return _reduce(loss, reduction)


@amp.runs_in_float32
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    _check_reduction(reduction)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    input, target = _broadcast_pair("huber_loss", input, target)
    d = (input - target).abs()
    loss = api.where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def _class_target_checks(name, input, target):
    """torch's shape rules for class-index targets: input (N, C, d1..) with target (N, d1..), or (C,) with ()."""
    if target.dtype.is_floating_point or target.dtype is dt.bool_:
        raise RuntimeError(f"{name}: expected a class-index target of an integer dtype, got {target.dtype} "
                           f"(input shape {list(input.shape)}, target shape {list(target.shape)})")
    if input.ndim == 1:
        if target.ndim != 0:
            raise RuntimeError(f"{name}: a 1-D input of shape {list(input.shape)} needs a 0-D target, but the "
                               f"target has shape {list(target.shape)}")
        return
    if input.ndim == 0:
        raise RuntimeError(f"{name}: input must have at least 1 dimension (classes), got a 0-D input")
    if target.ndim == 0 or input.shape[0] != target.shape[0]:
        got = target.shape[0] if target.ndim else "none (0-D target)"
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target batch_size ({got}); "
                         f"input shape {list(input.shape)}, target shape {list(target.shape)}.")
    expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise RuntimeError(f"Expected target size {list(expected)}, got {list(target.shape)} "
                           f"(input shape {list(input.shape)})")


def _check_target_range(target, n_classes, ignore_index):
    if not _is_eager(target) or target.numel() == 0:
        return
    values = target.numpy()  # NOTE: a value check on an eager int tensor: numpy directly, no graph ops
    bad = ((values < 0) | (values >= n_classes)) & (values != ignore_index)
    if bad.any():
        first = next(v for v in target.reshape(-1).tolist() if v != ignore_index and not 0 <= v < n_classes)
        raise IndexError(f"Target {first} is out of bounds (the input has {n_classes} classes).")


def _class_weight_check(weight, n_classes):
    if weight is not None and (weight.ndim != 1 or weight.shape[0] != n_classes):
        raise RuntimeError(f"weight tensor should be defined either for all {n_classes} classes or no classes but "
                           f"got weight tensor of shape: {list(weight.shape)}")


def _nll(name, logp, target, weight, ignore_index, reduction):
    """nll_loss on log-probabilities logp with class dim 1 (or 0 for a 1-D input): the nll_loss op, or with class
    weights a composite of gathers."""
    _class_target_checks(name, logp, target)
    class_dim = 0 if logp.ndim == 1 else 1
    n_classes = logp.shape[class_dim]
    _class_weight_check(weight, n_classes)
    if weight is None:  # one op, which checks the targets' range itself
        return apply("nll_loss", logp, target, dim=class_dim, reduction=reduction, ignore_index=ignore_index)
    _check_target_range(target, n_classes, ignore_index)
    valid = target != ignore_index
    safe = target.masked_fill(~valid, 0).to(dt.int64)
    picked = logp.gather(class_dim, safe.unsqueeze(class_dim)).squeeze(class_dim)
    w = weight.index_select(0, safe.reshape(-1)).reshape(tuple(safe.shape)).masked_fill(~valid, 0.0)
    # ignored positions give exactly 0 (where, not a product: -inf * 0 would be nan)
    loss = api.where(valid, -picked * w, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum()


@amp.runs_in_float32
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    return _nll("nll_loss", input, target, weight, ignore_index, reduction)


@amp.runs_in_float32
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if input.ndim == 0:
        raise RuntimeError("cross_entropy: input must have at least 1 dimension (classes), got a 0-D input")
    class_dim = 0 if input.ndim == 1 else 1
    n_classes = input.shape[class_dim]
    logp = api.log_softmax(input, class_dim)
    _class_weight_check(weight, n_classes)
    w_shape = tuple(n_classes if i == class_dim else 1 for i in range(input.ndim))
    if tuple(input.shape) == tuple(target.shape):  # class probabilities (torch decides by shape)
        if not target.dtype.is_floating_point:
            raise RuntimeError(f"Expected floating point type for target with class probabilities, got "
                               f"{target.dtype}")
        if ignore_index >= 0:
            raise RuntimeError("ignore_index is not supported for floating point target")
        if label_smoothing > 0.0:
            target = target * (1 - label_smoothing) + label_smoothing / n_classes
        terms = logp * target
        if weight is not None:
            terms = terms * weight.reshape(w_shape)
        loss = -terms.sum(class_dim)
        if reduction == "mean":
            return loss.sum() / (input.numel() // n_classes) if input.numel() else loss.sum() * math.nan
        return _reduce(loss, reduction)
    nll = _nll("cross_entropy", logp, target, weight, ignore_index, reduction)
    if label_smoothing == 0.0:
        return nll
    # torch: (1 - eps) * nll + eps / C * smooth, smooth = -sum_c w_c logp_c (0 where ignored),
    # normalised for 'mean' by the same weight sum as the nll term.
    valid = target != ignore_index
    terms = logp * weight.reshape(w_shape) if weight is not None else logp
    smooth = api.where(valid, -terms.sum(class_dim), 0.0)
    if reduction == "none":
        reduced = smooth
    elif reduction == "sum":
        reduced = smooth.sum()
    elif weight is not None:
        safe = target.masked_fill(~valid, 0).to(dt.int64)
        w = weight.index_select(0, safe.reshape(-1)).reshape(tuple(safe.shape)).masked_fill(~valid, 0.0)
        reduced = smooth.sum() / w.sum()
    else:
        reduced = smooth.sum() / valid.sum()
    return nll * (1 - label_smoothing) + reduced * (label_smoothing / n_classes)


@amp.runs_in_float32
def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction, ("none", "mean", "sum", "batchmean"))
    if log_target:
        loss = target.exp() * (target - input)
    else:
        # NOTE: xlogy semantics: a zero target contributes exactly 0 (not 0 * log 0 = nan).
        positive = target > 0
        safe = target.masked_fill(~positive, 1.0)
        loss = api.where(positive, target * safe.log(), 0.0) - target * input
    if reduction == "batchmean":
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    if reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support size."
                      "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                      "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                      stacklevel=3)  # (the caller of amp.runs_in_float32's wrapper)
    return _reduce(loss, reduction)


# NOTE: torch's backward of binary_cross_entropy divides by max(x (1 - x), _BCE_EPS)
_BCE_EPS = 1e-12


def _binary_cross_entropy(input, target):
    """-(t log x + (1 - t) log(1 - x)) elementwise, as torch's kernel computes it: each log at least -100, and the
    gradient (x - t) / max(x (1 - x), 1e-12), huge (not 0) where x is 0 or 1 (a saturated sigmoid in float32).

    NOTE: differentiated as written where x (1 - x) >= 1e-12; at the few saturated elements the clamped value
    carries torch's gradient formula as a constant slope (their second derivative is 0)."""
    saturated = input * (1 - input) < _BCE_EPS
    x = input.where(~saturated, 0.5)  # the log's arguments stay away from 0 where it is differentiated
    loss = -(target * x.log() + (1 - target) * (1 - x).log())
    if not _is_eager(input) or bool(saturated.any()):
        fixed = input.detach()
        value = -(target * fixed.log().clamp(min=-100.0) + (1 - target) * (1 - fixed).log().clamp(min=-100.0))
        slope = ((fixed - target) / (fixed * (1 - fixed)).clamp(min=_BCE_EPS)).detach()
        loss = loss.where(~saturated, value + (input - fixed) * slope)
    return loss


@amp.runs_in_float32
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Using a target size ({target.shape}) that is different to the input size "
                         f"({input.shape}) is deprecated. Please ensure they have the same size.")
    if _is_eager(input) and input.numel() and bool(((input < 0) | (input > 1)).any()):
        raise RuntimeError("all elements of input should be between 0 and 1")
    loss = _binary_cross_entropy(input, target)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@amp.runs_in_float32
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Target size ({target.shape}) must be the same as input size ({input.shape})")
    # NOTE: the stable form (1 - t) x - w_t log sigmoid(x), with log sigmoid(x) = min(x, 0) - log1p(exp(-|x|)):
    # never exp of a large positive number, never log(0).
    log_sig = logsigmoid(input)
    if pos_weight is not None:
        log_sig = log_sig * ((pos_weight - 1) * target + 1)
    loss = (1 - target) * input - log_sig
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


# =============================================================================================
# More of torch.nn.functional: activations, norms, transposed convolution, pooling, resampling,
# unfold/fold, distances, embedding_bag and losses. Same rules as above: tensor methods only.
# =============================================================================================

__all__ += [
    "celu", "threshold", "hardshrink", "softshrink", "tanhshrink", "prelu", "rrelu",
    "instance_norm", "rms_norm", "local_response_norm",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "unfold", "fold",
    "max_pool3d", "avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_avg_pool3d",
    "lp_pool1d", "lp_pool2d", "interpolate", "upsample", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle",
    "pairwise_distance", "embedding_bag",
    "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss", "cosine_embedding_loss",
    "triplet_margin_loss", "triplet_margin_with_distance_loss", "poisson_nll_loss", "gaussian_nll_loss",
    "multilabel_soft_margin_loss", "multi_margin_loss",
]


def _index(values):
    return factories.tensor(list(values), dtype=dt.int64)


def _reverse(x, d):
    return x.index_select(d, _index(range(x.shape[d] - 1, -1, -1)))


# --- activations ---------------------------------------------------------------------------------

def celu(input, alpha=1.0, inplace=False):
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError: alpha must not be 0 for celu")

    def fn(x):
        # NOTE: exp of min(x, 0) / alpha, so the unselected branch never overflows (see _elu).
        return api.where(x > 0, x, ((x.clamp(max=0.0) / alpha).exp() - 1) * alpha)

    return _inplace(input, fn) if inplace else fn(input)


def threshold(input, threshold, value, inplace=False):
    def fn(x):
        return api.where(x > threshold, x, value)

    return _inplace(input, fn) if inplace else fn(input)


def hardshrink(input, lambd=0.5):
    return api.where(input.abs() > lambd, input, 0.0)


def softshrink(input, lambd=0.5):
    if lambd < 0:
        raise RuntimeError(f"lambda must be greater or equal to 0, but found to be {lambd}.")
    return api.where(input > lambd, input - lambd, api.where(input < -lambd, input + lambd, 0.0))


def tanhshrink(input):
    return input - input.tanh()


def prelu(input, weight):
    if weight.numel() != 1:
        if input.ndim < 2 or weight.ndim != 1 or weight.shape[0] != input.shape[1]:
            raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found parameter numbers = "
                               f"{weight.numel()} and channel size = {input.shape[1] if input.ndim > 1 else 1}.")
        weight = weight.reshape((input.shape[1],) + (1,) * (input.ndim - 2))
    elif input.ndim:
        weight = weight.reshape(())
    return api.where(input > 0, input, input * weight)


def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):
    if not training:
        return leaky_relu(input, (lower + upper) / 2, inplace)
    # training: one slope per element, uniform in [lower, upper], drawn from runtime's generator
    slope = factories.rand(tuple(input.shape), dtype=input.dtype) * (upper - lower) + lower

    def fn(x):
        return api.where(x >= 0, x, x * slope)

    return _inplace(input, fn) if inplace else fn(input)


# --- normalisation --------------------------------------------------------------------------------

def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    if input.ndim < 3:
        raise ValueError(f"instance_norm: expected an input with a batch, a channel and spatial dims, got shape "
                         f"{list(input.shape)}")
    c = input.shape[1]
    dims = tuple(range(2, input.ndim))
    shape = (1, c) + (1,) * len(dims)
    if use_input_stats:
        count = math.prod(input.shape[2:])
        if count <= 1:
            raise ValueError(f"Expected more than 1 spatial element when training, got input size {input.shape}")
        mean = input.mean(dims, keepdim=True)
        centered = input - mean
        var = (centered * centered).mean(dims, keepdim=True)
        if running_mean is not None or running_var is not None:
            with no_grad():
                if running_mean is not None:
                    m = mean.detach().reshape(input.shape[0], c).mean(0)
                    running_mean.copy_(running_mean * (1 - momentum) + m * momentum)
                if running_var is not None:
                    v = var.detach().reshape(input.shape[0], c).mean(0) * (count / (count - 1))
                    running_var.copy_(running_var * (1 - momentum) + v * momentum)
        out = centered * (var + eps).rsqrt()
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("Expected running_mean and running_var to be defined when use_input_stats is false")
        out = (input - running_mean.reshape(shape)) * (running_var.reshape(shape) + eps).rsqrt()
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


_EPS = {"float16": 0.0009765625, "bfloat16": 0.0078125, "float32": 1.1920928955078125e-07,
        "float64": 2.220446049250313e-16}


@api.rounds_bfloat16_once
def rms_norm(input, normalized_shape, weight=None, eps=None):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if k == 0 or input.ndim < k or tuple(input.shape[input.ndim - k:]) != shape:
        raise RuntimeError(f"Given normalized_shape={list(shape)}, expected input with shape "
                           f"[*, {', '.join(map(str, shape))}], but got input of size{list(input.shape)}")
    if eps is None:
        eps = _EPS.get(str(input.dtype).split(".")[-1], _EPS["float32"])
    dims = tuple(range(input.ndim - k, input.ndim))
    out = input * ((input * input).mean(dims, keepdim=True) + eps).rsqrt()
    return out if weight is None else out * weight


def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    if input.ndim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {input.ndim} dimensions)")
    if input.numel() == 0:
        return input
    sq = _pad_dims(input * input, {1: (size // 2, (size - 1) // 2, 0)}, 0)
    c = input.shape[1]
    total = sq.narrow(1, 0, c)
    for offset in range(1, size):
        total = total + sq.narrow(1, offset, c)
    div = (total * (alpha / size) + k) ** beta
    return input / div


# --- transposed convolution, unfold and fold ----------------------------------------------------

def _conv_transpose(name, nd, input, weight, bias, stride, padding, output_padding, groups, dilation):
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {name}, but got input "
                           f"of size: {list(input.shape)}")
    unbatched = input.ndim == nd + 1
    x = input.unsqueeze(0) if unbatched else input
    if isinstance(padding, str):
        raise RuntimeError(f"{name}: string padding ('{padding}') is not supported for transposed convolution")
    stride, padding = _ntuple(stride, nd, "stride"), _ntuple(padding, nd, "padding")
    output_padding, dilation = _ntuple(output_padding, nd, "output_padding"), _ntuple(dilation, nd, "dilation")
    in_ch = weight.shape[0]
    if x.shape[1] != in_ch:
        raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected input{list(x.shape)} "
                           f"to have {in_ch} channels, but got {x.shape[1]} channels instead")
    if in_ch % groups:
        raise RuntimeError(f"{name}: in_channels ({in_ch}) must be divisible by groups ({groups})")
    for op, s, d in zip(output_padding, stride, dilation):
        if op >= s and op >= d:
            raise RuntimeError("output padding must be smaller than either stride or dilation")
    kernel = tuple(weight.shape[2:])
    out_per_group = weight.shape[1]
    # weight (C_in, C_out/g, *k) -> a forward convolution's (C_out, C_in/g, *k), flipped in space
    w = weight.reshape((groups, in_ch // groups, out_per_group) + kernel).transpose(1, 2)
    w = w.reshape((groups * out_per_group, in_ch // groups) + kernel)
    for i in range(nd):
        w = _reverse(w, 2 + i)
    # the input spread stride apart, padded so that the windows of a forward convolution reach every output
    edges = [dilation[i] * (kernel[i] - 1) - padding[i] for i in range(nd)]
    x = _pad_dims(x, {2 + i: (edges[i], edges[i] + output_padding[i], stride[i] - 1) for i in range(nd)}, 0)
    out = _conv(name, nd, x, w, bias, 1, 0, dilation, groups)
    return out.squeeze(0) if unbatched else out


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _conv_transpose("conv_transpose1d", 1, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _conv_transpose("conv_transpose2d", 2, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _conv_transpose("conv_transpose3d", 3, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """(N, C, H, W) -> (N, C * kh * kw, L): every sliding block as a column (im2col)."""
    if input.ndim not in (3, 4):
        raise RuntimeError(f"Input Error: Only 3D or 4D input Tensors are supported (got {input.ndim}D)")
    unbatched = input.ndim == 3
    x = input.unsqueeze(0) if unbatched else input
    kernel, dilation = _ntuple(kernel_size, 2, "kernel_size"), _ntuple(dilation, 2, "dilation")
    padding, stride = _ntuple(padding, 2, "padding"), _ntuple(stride, 2, "stride")
    out_sizes = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1
                      for n, k, d, s, p in zip(x.shape[2:], kernel, dilation, stride, padding))
    if any(o < 1 for o in out_sizes):
        raise RuntimeError(f"Given input with spatial size {list(input.shape[-2:])}, kernel_size={list(kernel)}, "
                           f"dilation={list(dilation)}, padding={list(padding)}, calculated shape of the array of "
                           f"sliding blocks as {list(out_sizes)}, but its components must be at least one.")
    cols = apply("im2col", x, kernel=kernel, stride=stride, padding=tuple((p, p) for p in padding), dilation=dilation)
    out = cols.reshape(cols.shape[0], x.shape[0], math.prod(out_sizes)).transpose(0, 1)  # (N, C*K, L)
    return out.squeeze(0) if unbatched else out


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """The adjoint of unfold: (N, C * kh * kw, L) columns summed back into (N, C, H, W)."""
    if input.ndim not in (2, 3):
        raise RuntimeError(f"Input Error: Only unbatched (2D) or batched (3D) input Tensors are supported "
                           f"(got {input.ndim}D)")
    unbatched = input.ndim == 2
    x = input.unsqueeze(0) if unbatched else input
    size = _ntuple(output_size, 2, "output_size")
    kernel, dilation = _ntuple(kernel_size, 2, "kernel_size"), _ntuple(dilation, 2, "dilation")
    padding, stride = _ntuple(padding, 2, "padding"), _ntuple(stride, 2, "stride")
    k = math.prod(kernel)
    if x.shape[1] % k:
        raise RuntimeError(f"Expected size of input's dimension 1 to be divisible by the product of kernel_size, "
                           f"but got input.size(1)={x.shape[1]} and kernel_size={list(kernel)}")
    padded = tuple(s + 2 * p for s, p in zip(size, padding))
    blocks = tuple((n - d * (kk - 1) - 1) // s + 1 for n, kk, d, s in zip(padded, kernel, dilation, stride))
    if math.prod(blocks) != x.shape[2]:
        raise RuntimeError(f"Given output_size={list(size)}, kernel_size={list(kernel)}, dilation={list(dilation)}, "
                           f"padding={list(padding)}, stride={list(stride)}, expected size of input's dimension 2 to "
                           f"match the calculated number of sliding blocks {blocks[0]} * {blocks[1]} = "
                           f"{math.prod(blocks)}, but got input.size(2)={x.shape[2]}.")
    cols = x.transpose(0, 1).reshape(x.shape[1], x.shape[0] * x.shape[2])  # (C*K, N*L)
    out = apply("col2im", cols, size=size, kernel=kernel, stride=stride, padding=tuple((p, p) for p in padding),
                dilation=dilation)
    return out.squeeze(0) if unbatched else out


# --- pooling ----------------------------------------------------------------------------------------

def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool("max_pool3d", 3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool("avg_pool3d", 3, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def adaptive_avg_pool3d(input, output_size):
    return _adaptive_avg("adaptive_avg_pool3d", 3, input, output_size)


def _adaptive_max(name, nd, input, output_size, return_indices):
    if return_indices:
        raise NotImplementedError(f"{name}(return_indices=True) is not supported; the values are")
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(f"{name}: Expected {nd + 1}D or {nd + 2}D tensor, but got input of size "
                           f"{list(input.shape)}")
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * nd
    x = input
    first = input.ndim - nd
    for i, out in enumerate(sizes):
        d = first + i
        size = x.shape[d]
        out = size if out is None else int(out)
        if out <= 0:
            raise RuntimeError(f"{name}: output size must be positive, got {list(sizes)}")
        bins = []
        for j in range(out):
            start, stop = (j * size) // out, -((-(j + 1) * size) // out)
            # NOTE: max(dim) rather than amax: the gradient goes to one maximal element, as torch's
            bins.append(x.narrow(d, start, stop - start).max(d, keepdim=True)[0])
        x = bins[0] if out == 1 else api.cat(bins, d)
    return x


def adaptive_max_pool1d(input, output_size, return_indices=False):
    return _adaptive_max("adaptive_max_pool1d", 1, input, output_size, return_indices)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    return _adaptive_max("adaptive_max_pool2d", 2, input, output_size, return_indices)


def _lp_pool(nd, input, norm_type, kernel_size, stride, ceil_mode):
    kernel = _ntuple(kernel_size, nd, "kernel_size")
    pool = avg_pool1d if nd == 1 else avg_pool2d
    out = pool(input ** norm_type, kernel, stride, 0, ceil_mode) * math.prod(kernel)
    return (out.sign() * out.abs().relu()) ** (1.0 / norm_type)


def lp_pool1d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    return _lp_pool(1, input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool2d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    return _lp_pool(2, input, norm_type, kernel_size, stride, ceil_mode)


# --- resampling -------------------------------------------------------------------------------------

_INTERP_DIMS = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}
_INTERP_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")
_CUBIC_A = -0.75  # the cubic convolution's parameter of torch's bicubic (Keys' kernel)
_CUBIC_A_ANTIALIAS = -0.5  # the antialiased bicubic's parameter (PIL's)


def _source_positions(mode, in_size, out_size, scale, align_corners):
    """(i0, i1, w1) per output position along one dim: out = in[i0] * (1 - w1) + in[i1] * w1."""
    rows = []
    for o in range(out_size):
        if align_corners:
            src = o * (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        else:
            src = max((o + 0.5) * scale - 0.5, 0.0)
        i0 = min(int(math.floor(src)), in_size - 1)
        i1 = min(i0 + 1, in_size - 1)
        rows.append((i0, i1, src - i0))
    return rows


def _cubic_weight(x, a):
    """Keys' cubic convolution kernel at distance |x|."""
    x = abs(x)
    if x <= 1.0:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2.0:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return 0.0


def _cubic_taps(in_size, out_size, scale, align_corners):
    """(indices, weights) per output position along one dim: four taps around the source position, indices
    clamped to the edge (an edge value counts for each tap past it), weights from the cubic kernel. Unlike the
    linear modes, a source position before the first element is not moved onto it."""
    taps = []
    for o in range(out_size):
        if align_corners:
            src = o * (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        else:
            src = (o + 0.5) * scale - 0.5
        base = math.floor(src)
        t = src - base
        indices = [min(max(base - 1 + k, 0), in_size - 1) for k in range(4)]
        weights = [_cubic_weight(t + 1, _CUBIC_A), _cubic_weight(t, _CUBIC_A), _cubic_weight(1 - t, _CUBIC_A),
                   _cubic_weight(2 - t, _CUBIC_A)]
        taps.append((indices, weights))
    return taps


def _antialias_taps(mode, in_size, out_size, scale, align_corners):
    """(indices, weights) per output position of an antialiased resize along one dim: the filter (triangle for
    bilinear, cubic with a = -0.5 for bicubic) is stretched by the downscaling factor so that every input element
    within its support contributes, and the weights are normalised to sum to 1 (as PIL resizes)."""
    if align_corners:
        scale = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    half_width = 1.0 if mode == "bilinear" else 2.0
    support = half_width * scale if scale >= 1.0 else half_width
    stretch = 1.0 / scale if scale >= 1.0 else 1.0
    taps = []
    for o in range(out_size):
        center = scale * (o + 0.5)  # align_corners changes only the scale here, as in torch's antialiased kernels
        first = max(int(center - support + 0.5), 0)
        count = min(int(center + support + 0.5), in_size) - first
        weights = [_antialias_filter(mode, (first + j - center + 0.5) * stretch) for j in range(count)]
        total = sum(weights)
        taps.append(([first + j for j in range(count)], [w / total if total != 0 else 0.0 for w in weights]))
    return taps


def _antialias_filter(mode, x):
    if mode == "bilinear":
        return max(0.0, 1.0 - abs(x))
    return _cubic_weight(x, _CUBIC_A_ANTIALIAS)


def _weighted_taps(x, d, taps):
    """sum_k x[..., indices[o][k], ...] * weights[o][k] along dim d, in the taps' order; a position with fewer taps
    than the others adds exact zeros (not x * 0, which is nan for an infinite x)."""
    width = max(len(indices) for indices, _ in taps)
    shape = [1] * x.ndim
    shape[d] = len(taps)
    out = None
    for k in range(width):
        index = _index(indices[min(k, len(indices) - 1)] for indices, _ in taps)
        weight = factories.tensor([w[k] if k < len(w) else 0.0 for _, w in taps], dtype=x.dtype).reshape(tuple(shape))
        term = x.index_select(d, index) * weight
        short = [len(indices) <= k for indices, _ in taps]
        if any(short):
            term = term.masked_fill(factories.tensor(short).reshape(tuple(shape)), 0.0)
        out = term if out is None else out + term
    return out


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    nd = input.ndim - 2
    if nd < 1:
        raise ValueError(f"interpolate: expected an input with batch and channel dims, got shape {list(input.shape)}")
    if mode not in _INTERP_MODES:
        raise NotImplementedError(f"interpolate: mode {mode!r} is not supported ({', '.join(_INTERP_MODES)} are)")
    if antialias and not (mode in ("bilinear", "bicubic") and nd == 2):
        raise NotImplementedError("Anti-alias option is restricted to bilinear and bicubic modes and requires a "
                                  "4-D tensor as input")
    if mode in _INTERP_DIMS and _INTERP_DIMS[mode] != nd:
        raise ValueError(f"Got {input.ndim}D input, but {mode} mode needs {_INTERP_DIMS[mode] + 2}D input")
    if (mode.startswith("nearest") or mode == "area") and align_corners is not None:
        raise ValueError("align_corners option can only be set with the interpolating modes: linear | bilinear | "
                         "bicubic | trilinear")
    if (size is None) == (scale_factor is None):
        raise ValueError("only one of size or scale_factor should be defined")
    in_sizes = tuple(input.shape[2:])
    if size is not None:
        out_sizes = _ntuple(size, nd, "size")
        _check_interpolation_sizes(in_sizes, out_sizes)
        scales = [i / o for i, o in zip(in_sizes, out_sizes)]
    else:
        factors = scale_factor if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * nd
        if len(factors) != nd:
            raise ValueError(f"scale_factor shape must match input shape. Input is {nd}D, scale_factor size is "
                             f"{len(factors)}")
        out_sizes = tuple(int(math.floor(i * f)) for i, f in zip(in_sizes, factors))
        _check_interpolation_sizes(in_sizes, out_sizes)
        scales = [i / o for i, o in zip(in_sizes, out_sizes)] if recompute_scale_factor else [1.0 / f for f in factors]
    if mode == "area":  # torch's area mode is adaptive average pooling to the output size
        return _adaptive_avg("interpolate", nd, input, out_sizes)
    if mode == "bicubic" or antialias:
        return _interpolate_separable(input, mode, in_sizes, out_sizes, scales, bool(align_corners), antialias)
    x = input
    for i, (n_in, n_out, scale) in enumerate(zip(in_sizes, out_sizes, scales)):
        d = 2 + i
        if mode == "nearest":
            idx = [min(int(math.floor(o * scale)), n_in - 1) for o in range(n_out)]
            x = x.index_select(d, _index(idx))
        elif mode == "nearest-exact":
            idx = [min(int(math.floor((o + 0.5) * scale)), n_in - 1) for o in range(n_out)]
            x = x.index_select(d, _index(idx))
        else:
            rows = _source_positions(mode, n_in, n_out, scale, bool(align_corners))
            shape = [1] * x.ndim
            shape[d] = n_out
            w1 = factories.tensor([r[2] for r in rows], dtype=x.dtype).reshape(tuple(shape))
            lo = x.index_select(d, _index(r[0] for r in rows))
            hi = x.index_select(d, _index(r[1] for r in rows))
            x = lo + (hi - lo) * w1
    return x


def _check_interpolation_sizes(in_sizes, out_sizes) -> None:
    if min(in_sizes + out_sizes) <= 0:
        names = "DHW"[-len(in_sizes):]
        given = lambda sizes: ", ".join(f"{n}: {v}" for n, v in zip(names, sizes))  # noqa: E731
        raise RuntimeError(f"Input and output sizes should be greater than 0, but got input ({given(in_sizes)}) "
                           f"output ({given(out_sizes)})")


def _interpolate_separable(x, mode, in_sizes, out_sizes, scales, align_corners, antialias):
    """Bicubic and antialiased resizes, one dim at a time from the last (as torch's kernels sum: along the width
    first, then along the height)."""
    for i in reversed(range(len(in_sizes))):
        n_in, n_out, scale = in_sizes[i], out_sizes[i], scales[i]
        if antialias:
            taps = _antialias_taps(mode, n_in, n_out, scale, align_corners)
        else:
            taps = _cubic_taps(n_in, n_out, scale, align_corners)
        x = _weighted_taps(x, 2 + i, taps)
    return x


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    return interpolate(input, size, scale_factor, mode, align_corners)


def pixel_shuffle(input, upscale_factor):
    r = upscale_factor
    if input.ndim < 3:
        raise RuntimeError(f"pixel_shuffle expects input to have at least 3 dimensions, but got input with "
                           f"{input.ndim} dimension(s)")
    lead, (c, h, w) = tuple(input.shape[:-3]), tuple(input.shape[-3:])
    if c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of "
                           f"upscale_factor, but input.size(-3)={c} is not divisible by {r * r}")
    k = len(lead)
    x = input.reshape(lead + (c // (r * r), r, r, h, w))
    x = x.permute(tuple(range(k)) + (k, k + 3, k + 1, k + 4, k + 2))
    return x.reshape(lead + (c // (r * r), h * r, w * r))


def pixel_unshuffle(input, downscale_factor):
    r = downscale_factor
    if input.ndim < 3:
        raise RuntimeError(f"pixel_unshuffle expects input to have at least 3 dimensions, but got input with "
                           f"{input.ndim} dimension(s)")
    lead, (c, h, w) = tuple(input.shape[:-3]), tuple(input.shape[-3:])
    if h % r or w % r:
        raise RuntimeError(f"pixel_unshuffle expects height and width to be divisible by downscale_factor, but got "
                           f"{h} and {w} with downscale_factor={r}")
    k = len(lead)
    x = input.reshape(lead + (c, h // r, r, w // r, r))
    x = x.permute(tuple(range(k)) + (k, k + 2, k + 4, k + 1, k + 3))
    return x.reshape(lead + (c * r * r, h // r, w // r))


def channel_shuffle(input, groups):
    if input.ndim < 3:
        raise RuntimeError(f"channel_shuffle expects input to have at least 3 dimensions, but got input with "
                           f"{input.ndim} dimension(s)")
    n, c = input.shape[0], input.shape[1]
    if groups <= 0 or c % groups:
        raise RuntimeError(f"Number of channels must be divisible by groups. Got {c} channels and {groups} groups.")
    rest = tuple(input.shape[2:])
    return input.reshape((n, groups, c // groups) + rest).transpose(1, 2).reshape((n, c) + rest)


# --- distances and embedding bags ------------------------------------------------------------------

def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    diff = x1 - x2 + eps
    d = -1 if diff.ndim else 0
    if p == _INF:
        out = diff.abs().amax(d, keepdim=keepdim)
    elif p == 0:
        out = (diff != 0).to(diff.dtype).sum(d, keepdim=keepdim)
    else:
        out = (diff.abs() ** p).sum(d, keepdim=keepdim) ** (1.0 / p)
    return out


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False, mode="mean",
                  sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """The rows of `weight` at `input`, summed, averaged or maxed per bag: each row of a 2-D input is a bag, or a
    1-D input is cut into bags where `offsets` says. Sum and mean are one index_add over each index's bag, written
    with graph ops, so a traced model compiles them; max picks per bag with the eager indices."""
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"mode has to be one of sum, mean or max, got {mode}")
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(f"embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                  f"supported for mode='sum' (got mode='{mode}'). Please open a feature request on "
                                  f"GitHub.")
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None, as input is treated is a mini-batch of "
                             "fixed length sequences.")
        flat = input.reshape(-1)
        psw = per_sample_weights.reshape(-1) if per_sample_weights is not None else None
    elif input.ndim == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        if _is_eager(offsets) and offsets.numel() and int(offsets[0]) != 0:
            raise RuntimeError(f"offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start "
                               f"from position 0. However, got {int(offsets[0])}")
        flat, psw = input, per_sample_weights
    else:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {input.ndim}")
    num = weight.shape[0]
    if padding_idx is not None:
        padding_idx = padding_idx + num if padding_idx < 0 else padding_idx
    if max_norm is not None:
        _embedding_renorm_(weight, flat, max_norm, norm_type)
    if mode == "max":
        return _embedding_bag_max(input, weight, offsets, flat, include_last_offset, padding_idx)
    rows = weight.index_select(0, flat)
    if psw is not None:
        rows = rows * psw.unsqueeze(-1)
    kept = None if padding_idx is None else (flat != padding_idx).to(rows.dtype)
    if kept is not None:
        rows = rows * kept.unsqueeze(-1)
    if input.ndim == 2:
        bags, length = input.shape
        out = rows.reshape(bags, length, weight.shape[1]).sum(1)
        counts = kept.reshape(bags, length).sum(1) if kept is not None else None
        size = length
    else:
        # NOTE: with include_last_offset the last offset is not a bag's start, and torch's last bag runs to the
        # end of the input whatever that offset says
        starts = offsets[:-1] if include_last_offset else offsets
        bags = starts.shape[0]
        bag = _bag_of_each_index(starts, flat.shape[0])
        out = rows.new_zeros((bags, weight.shape[1])).index_add(0, bag, rows)
        ones = kept if kept is not None else rows.new_ones(flat.shape)
        counts = rows.new_zeros((bags,)).index_add(0, bag, ones)
        size = None
    if mode == "sum":
        return out
    if counts is None:
        return out / size
    return out / counts.clamp(min=1).unsqueeze(-1)  # an empty bag (or one of padding only) gives zeros


def _bag_of_each_index(starts, n: int):
    """For each of the n positions of a 1-D embedding_bag input, its bag: how many of the bags' starts after the
    first are at or before it (a cumulative count)."""
    later = starts[1:].to(dt.int64)
    marks = factories.zeros(n + 1, dtype=dt.int64).index_add(0, later, factories.ones_like(later))
    return marks[:n].cumsum(0)


def _embedding_bag_max(input, weight, offsets, flat, include_last_offset: bool, padding_idx):
    """mode="max": each bag's largest rows, picked with the eager indices (ties and empty bags as torch's)."""
    if input.ndim == 2:
        bags, length = input.shape
        starts = [i * length for i in range(bags)]
    else:
        starts = [int(v) for v in offsets.tolist()]
        if include_last_offset:
            starts = starts[:-1]
    ends = starts[1:] + [flat.shape[0]]  # (the last bag runs to the end, as torch's, whatever a last offset says)
    if not _is_eager(flat):
        raise RuntimeError("embedding_bag with mode='max' reads its indices to form bags: it runs eagerly only")
    ids = flat.tolist()
    rows = weight.index_select(0, flat) if flat.numel() else weight.new_zeros((0, weight.shape[1]))
    out = []
    for s, e in zip(starts, ends):
        keep = [i for i in range(s, e) if padding_idx is None or ids[i] != padding_idx]
        if not keep:
            out.append(weight.new_zeros((weight.shape[1],)))
            continue
        out.append(rows.index_select(0, _index(keep)).max(0)[0])
    return api.stack(out, 0) if out else weight.new_zeros((0, weight.shape[1]))


# --- more losses ------------------------------------------------------------------------------------

@amp.runs_in_float32
def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    return _reduce((-target * (input1 - input2) + margin).clamp(min=0.0), reduction)


@amp.runs_in_float32
def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    margin_part = (margin - input).clamp(min=0.0)
    loss = api.where(target == 1, input, 0.0) + api.where(target == -1, margin_part, 0.0)
    return _reduce(loss, reduction)


@amp.runs_in_float32
def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    # NOTE: log(1 + exp(-y x)) as -logsigmoid(y x): no overflow for large margins
    return _reduce(-logsigmoid(target * input), reduction)


@amp.runs_in_float32
def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    eps = 1e-12
    d = input1.ndim - 1
    dot = (input1 * input2).sum(d)
    mag1 = (input1 * input1).sum(d) + eps
    mag2 = (input2 * input2).sum(d) + eps
    cos = dot / (mag1 * mag2).sqrt()
    loss = api.where(target == 1, 1 - cos, 0.0) + api.where(target == -1, (cos - margin).clamp(min=0.0), 0.0)
    return _reduce(loss, reduction)


@amp.runs_in_float32
def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                        reduce=None, reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = api.minimum(d_neg, pairwise_distance(positive, negative, p, eps))
    return _reduce((d_pos - d_neg + margin).clamp(min=0.0), reduction)


def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None, margin=1.0, swap=False,
                                      reduction="mean"):
    _check_reduction(reduction)
    dist = distance_function if distance_function is not None else pairwise_distance
    d_pos, d_neg = dist(anchor, positive), dist(anchor, negative)
    if swap:
        d_neg = api.minimum(d_neg, dist(positive, negative))
    return _reduce((d_pos - d_neg + margin).clamp(min=0.0), reduction)


@amp.runs_in_float32
def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if log_input:
        loss = input.exp() - target * input
    else:
        loss = input - target * (input + eps).log()
    if full:
        # Stirling's approximation of log(target!), for targets above 1
        safe = target.masked_fill(target <= 1, 1.0)
        stirling = safe * safe.log() - safe + (safe * (2 * math.pi)).log() * 0.5
        loss = loss + api.where(target > 1, stirling, 0.0)
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    _check_reduction(reduction)
    if tuple(var.shape) != tuple(input.shape):
        if tuple(input.shape[:-1]) == tuple(var.shape):
            var = var.unsqueeze(-1)
        elif not (tuple(input.shape[:-1]) == tuple(var.shape[:-1]) and var.shape[-1] == 1):
            raise ValueError("var is of incorrect size")
    if _is_eager(var) and bool((var < 0).any()):
        raise ValueError("var has negative entry/entries")
    with no_grad():
        floor = var.detach().clamp(min=eps) - var.detach()  # NOTE: clamp without touching var's gradient, as torch
    var = var + floor
    diff = input - target
    loss = (var.log() + diff * diff / var) * 0.5
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    loss = -(target * logsigmoid(input) + (1 - target) * logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    loss = loss.mean(input.ndim - 1)
    return _reduce(loss, reduction)


@amp.runs_in_float32
def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None,
                      reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    _check_reduction(reduction)
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    x = input if input.ndim == 2 else input.reshape(1, -1)
    t = target.reshape(-1)
    c = x.shape[1]
    picked = x.gather(1, t.unsqueeze(1))
    terms = (x - picked + margin).clamp(min=0.0)
    if p == 2:
        terms = terms * terms
    if weight is not None:
        terms = terms * weight.index_select(0, t).unsqueeze(1)
    not_target = factories.arange(c).reshape(1, c) != t.unsqueeze(1)
    loss = api.where(not_target, terms, 0.0).sum(1) / c
    if input.ndim != 2:
        loss = loss.reshape(tuple(target.shape))
    return _reduce(loss, reduction)


from ._functional_more import *  # noqa: E402,F401,F403  (in-place activations, CTC, grid_sample, unpooling...)
