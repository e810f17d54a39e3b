"""Built-in layers (torch.nn names, defaults, initialisation and reprs), each a thin Module over nn.functional."""
from __future__ import annotations

import math

from ... import api
from ... import dtypes as dt
from ... import factories
from ...autograd import grad_mode
from ...device import check_device
from .. import functional as F
from .. import init
from ..parameter import Parameter, UninitializedParameter
from .module import Module


def _factory(device=None, dtype=None) -> dict:
    """The device/dtype kwargs every built-in layer accepts (device must be the CPU)."""
    check_device(device)
    return {"dtype": dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype()}


def _empty(*shape, device=None, dtype=None) -> Parameter:
    return Parameter(factories.empty(*shape, **_factory(device, dtype)))


def _ntuple(value, n: int) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * n


def _uniform_bias(bias, fan_in: int) -> None:
    if bias is not None:
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        init.uniform_(bias, -bound, bound)


class Identity(Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """y = x W^T + b, with torch's default (Kaiming-uniform) initialisation."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _empty(out_features, in_features, device=device, dtype=dtype)
        self.register_parameter("bias", _empty(out_features, device=device, dtype=dtype) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        _uniform_bias(self.bias, self.in_features)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class LazyLinear(Linear):
    """A Linear whose in_features is inferred from the first input."""

    def __init__(self, out_features: int, bias: bool = True, device=None, dtype=None):
        Module.__init__(self)
        self._factory_kwargs = _factory(device, dtype)
        self.in_features, self.out_features = 0, out_features
        self.weight = UninitializedParameter()
        self.register_parameter("bias", UninitializedParameter() if bias else None)

    def reset_parameters(self) -> None:
        if not isinstance(self.weight, UninitializedParameter):
            super().reset_parameters()

    def forward(self, input):
        if isinstance(self.weight, UninitializedParameter):
            self._materialize(input.shape[-1])
        self.in_features = self.weight.shape[-1]  # (a weight load_state_dict materialized has it)
        self.__class__ = Linear  # NOTE: the module becomes a plain Linear, as in torch
        return Linear.forward(self, input)

    def _materialize(self, in_features: int) -> None:
        self.in_features = in_features
        with grad_mode.no_grad():
            self.weight.materialize((self.out_features, in_features), self._factory_kwargs["dtype"])
            if self.bias is not None:
                self.bias.materialize((self.out_features,), self._factory_kwargs["dtype"])
            self.reset_parameters()


class Bilinear(Module):
    def __init__(self, in1_features, in2_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        self.weight = _empty(out_features, in1_features, in2_features, device=device, dtype=dtype)
        self.register_parameter("bias", _empty(out_features, device=device, dtype=dtype) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.weight.size(1))
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input):
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, unflattened_size

    def forward(self, input):
        return input.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


# --- activations ---------------------------------------------------------------------------------

def _inplace_repr(inplace: bool) -> str:
    return "inplace=True" if inplace else ""


class ReLU(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


class Sigmoid(Module):
    def forward(self, input):
        return input.sigmoid()


class Tanh(Module):
    def forward(self, input):
        return input.tanh()


class Softmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.softmax(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    def forward(self, input):
        return F.log_softmax(input, self.dim)


# --- regularisation, embeddings, normalisation -----------------------------------------------------

class Dropout(Module):
    """Zeroes each element with probability p in training and scales the rest by 1 / (1 - p).

    Compiled (nnc.compile), the mask is drawn inside the fused kernels by a counter-based generator (Philox) seeded
    from runtime's generator: manual_seed makes compiled runs repeatable, but they drop other elements than an eager
    run of the same seed (as torch.compile's do)."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input):
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None):
        super().__init__()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx = padding_idx + num_embeddings if padding_idx < 0 else padding_idx
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            self.weight = _empty(num_embeddings, embedding_dim, device=device, dtype=dtype)
            self.reset_parameters()
        else:
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with grad_mode.no_grad():
                self.weight[self.padding_idx].fill_(0)

    def forward(self, input):
        return F.embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        return s

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False):
        """An Embedding whose weight is `embeddings` (frozen unless freeze=False)."""
        if embeddings.ndim != 2:
            raise AssertionError("Embeddings parameter is expected to be 2-dimensional")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse, _weight=embeddings,
                   _freeze=freeze)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _ntuple(normalized_shape, 1)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        shape = self.normalized_shape
        self.register_parameter("weight", _empty(*shape, device=device, dtype=dtype) if elementwise_affine else None)
        has_bias = elementwise_affine and bias
        self.register_parameter("bias", _empty(*shape, device=device, dtype=dtype) if has_bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class _BatchNorm(Module):
    _expected_dims: tuple = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 device=None, dtype=None, *, bias=True):
        super().__init__()
        kw = _factory(device, dtype)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.register_parameter("weight", _empty(num_features, device=device, dtype=dtype) if affine else None)
        self.register_parameter("bias", _empty(num_features, device=device, dtype=dtype) if affine and bias else None)
        if track_running_stats:
            self.register_buffer("running_mean", factories.zeros(num_features, **kw))
            self.register_buffer("running_var", factories.ones(num_features, **kw))
            self.register_buffer("num_batches_tracked", factories.tensor(0, dtype=dt.int64))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input):
        if input.ndim not in self._expected_dims:
            raise ValueError(f"expected {' or '.join(f'{d}D' for d in self._expected_dims)} input "
                             f"(got {input.ndim}D input)")
        momentum = 0.0 if self.momentum is None else self.momentum
        counted = None
        if self.training and self.track_running_stats:
            with grad_mode.no_grad():
                self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average: F.batch_norm divides by the count
                momentum, counted = None, self.num_batches_tracked
        use_batch_stats = self.training or self.running_mean is None
        return F.batch_norm(input, self.running_mean if not self.training or self.track_running_stats else None,
                            self.running_var if not self.training or self.track_running_stats else None,
                            self.weight, self.bias, use_batch_stats, momentum, self.eps, num_batches_tracked=counted)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    _expected_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _expected_dims = (4,)


class BatchNorm3d(_BatchNorm):
    _expected_dims = (5,)


# --- convolution and pooling ------------------------------------------------------------------------

class _ConvNd(Module):
    _n = 0
    _transposed = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None, output_padding=0):
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise ValueError(f"padding_mode must be one of ['zeros', 'reflect', 'replicate', 'circular'], but got "
                             f"padding_mode='{padding_mode}'")
        n = self._n
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = _ntuple(kernel_size, n), _ntuple(stride, n), _ntuple(dilation, n)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of ['valid', 'same']")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
        self.padding = padding if isinstance(padding, str) else _ntuple(padding, n)
        self.output_padding, self.transposed, self.padding_mode = _ntuple(output_padding, n), self._transposed, \
            padding_mode
        self._reversed_padding_repeated_twice = self._padding_pairs()
        if self._transposed:
            shape = (in_channels, out_channels // groups, *self.kernel_size)
        else:
            shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = _empty(*shape, device=device, dtype=dtype)
        self.register_parameter("bias", _empty(out_channels, device=device, dtype=dtype) if bias else None)
        self.reset_parameters()

    def _padding_pairs(self) -> list:
        """F.pad's amounts (last dim first, left then right) for a padding_mode other than zeros."""
        n = self._n
        if self.padding == "valid":
            pairs = [(0, 0)] * n
        elif self.padding == "same":
            totals = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)]
            pairs = [(t // 2, t - t // 2) for t in totals]
        else:
            pairs = [(p, p) for p in self.padding]
        return [amount for pair in reversed(pairs) for amount in pair]

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        _uniform_bias(self.bias, self.weight.size(1) * math.prod(self.kernel_size))

    def _conv_forward(self, fn, input, weight, bias):
        if self.padding_mode != "zeros":
            return fn(F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode), weight, bias,
                      self.stride, 0, self.dilation, self.groups)
        return fn(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        n = self._n
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * n:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * n:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * n:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class Conv1d(_ConvNd):
    _n = 1

    def forward(self, input):
        return self._conv_forward(F.conv1d, input, self.weight, self.bias)


class Conv2d(_ConvNd):
    _n = 2

    def forward(self, input):
        return self._conv_forward(F.conv2d, input, self.weight, self.bias)


class Conv3d(_ConvNd):
    _n = 3

    def forward(self, input):
        return self._conv_forward(F.conv3d, input, self.weight, self.bias)


class _ConvTransposeNd(_ConvNd):
    _transposed = True
    _fn = None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=None):
        if padding_mode != "zeros":
            raise ValueError(f"Only \"zeros\" padding mode is supported for {type(self).__name__}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype, output_padding)

    def _output_padding(self, input, output_size):
        if output_size is None:
            return self.output_padding
        n = self._n
        output_size = list(output_size)[-n:]
        if len(output_size) != n:
            raise ValueError(f"ConvTranspose{n}D: for {input.ndim}D input, output_size must have {n} or {n + 2} "
                             f"elements (got {len(output_size)})")
        extra = []
        for i in range(n):
            size = input.shape[input.ndim - n + i]
            smallest = ((size - 1) * self.stride[i] - 2 * self.padding[i]
                        + self.dilation[i] * (self.kernel_size[i] - 1) + 1)
            if not smallest <= output_size[i] < smallest + self.stride[i]:
                raise ValueError(f"requested an output size of {output_size}, but valid sizes range from {smallest} "
                                 f"to {smallest + self.stride[i] - 1} (for an input of {list(input.shape[2:])})")
            extra.append(output_size[i] - smallest)
        return tuple(extra)

    def forward(self, input, output_size=None):
        output_padding = self._output_padding(input, output_size)
        return type(self)._fn(input, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups,
                              self.dilation)


class ConvTranspose1d(_ConvTransposeNd):
    _n = 1
    _fn = staticmethod(F.conv_transpose1d)


class ConvTranspose2d(_ConvTransposeNd):
    _n = 2
    _fn = staticmethod(F.conv_transpose2d)


class ConvTranspose3d(_ConvTransposeNd):
    _n = 3
    _fn = staticmethod(F.conv_transpose3d)


class _MaxPoolNd(Module):
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input):
        return type(self)._fn(input, self.kernel_size, self.stride, self.padding, self.dilation,
                              ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool2d(_MaxPoolNd):
    _fn = staticmethod(F.max_pool2d)


class _AvgPoolNd(Module):
    """2-d and 3-d average pooling (they take divisor_override; AvgPool1d does not)."""

    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.ceil_mode, self.count_include_pad = padding, ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input):
        return type(self)._fn(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                              self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(_AvgPoolNd):
    _fn = staticmethod(F.avg_pool2d)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return F.adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


# --- attention --------------------------------------------------------------------------------------

class NonDynamicallyQuantizableLinear(Linear):
    """The out-projection of MultiheadAttention (the name torch prints)."""


class MultiheadAttention(Module):
    """Multi-head attention as torch.nn.MultiheadAttention: a packed in-projection when key and value have
    embed_dim features, separate q/k/v projection weights for other kdim/vdim; add_bias_kv and add_zero_attn
    append a learned or a zero key/value position."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and "
                             f"num_heads={num_heads} instead")
        if embed_dim % num_heads:
            raise AssertionError("embed_dim must be divisible by num_heads")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.head_dim = embed_dim // num_heads
        kw = {"device": device, "dtype": dtype}
        if self._qkv_same_embed_dim:
            self.in_proj_weight = _empty(3 * embed_dim, embed_dim, **kw)
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = _empty(embed_dim, embed_dim, **kw)
            self.k_proj_weight = _empty(embed_dim, self.kdim, **kw)
            self.v_proj_weight = _empty(embed_dim, self.vdim, **kw)
            self.register_parameter("in_proj_weight", None)
        self.register_parameter("in_proj_bias", _empty(3 * embed_dim, **kw) if bias else None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **kw)
        if add_bias_kv:
            self.bias_k = _empty(1, 1, embed_dim, **kw)
            self.bias_v = _empty(1, 1, embed_dim, **kw)
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        packed = query is key and key is value and self._qkv_same_embed_dim  # self-attention: one projection
        batched = query.ndim == 3
        if not batched:
            if query.ndim != 2:
                raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but received "
                                     f"{query.ndim}-D query tensor")
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        length, batch, _ = query.shape
        q, k, v = self._project(query, key, value, packed)  # (L, N, E), (S, N, E), (S, N, E)
        if self.bias_k is not None:
            k = api.cat([k, self.bias_k.expand(1, batch, self.embed_dim)], 0)
            v = api.cat([v, self.bias_v.expand(1, batch, self.embed_dim)], 0)
            attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
        q, k, v = (t.reshape(t.shape[0], batch, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
                   for t in (q, k, v))
        if self.add_zero_attn:
            zeros = k.new_zeros((batch, self.num_heads, 1, self.head_dim))
            k, v = api.cat([k, zeros], 2), api.cat([v, zeros], 2)
            attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
        mask = _merge_masks(attn_mask, key_padding_mask, batch, self.num_heads, length, k.shape[2], is_causal)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        # NOTE: without weights torch attends through scaled_dot_product_attention, whose rows with every key masked
        # are 0 (a fully padded sequence); with them, through a plain softmax: nan there. Without a mask no row is
        # masked, and the plain softmax spares a compiled graph the check.
        safe = mask is not None and not need_weights
        weights = F._safe_softmax(scores) if safe else F.softmax(scores, -1)
        if self.dropout > 0 and self.training:
            weights = F.dropout(weights, self.dropout)
        out = (weights @ v).permute(2, 0, 1, 3).reshape(length, batch, self.embed_dim)
        out = self.out_proj(out)
        if not batched:
            out = out.squeeze(1)
            weights = weights.squeeze(0)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        return out, (weights.mean(-3) if average_attn_weights else weights)

    def _project(self, query, key, value, packed=False):
        """The (length, batch, embed_dim) projections of query, key and value: for self-attention (`packed`), one
        linear with the whole in-projection, split in three (as torch does: one matmul, not three)."""
        if packed:
            return F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
        return [F.linear(x, w, b) for x, w, b in ((query, w_q, b_q), (key, w_k, b_k), (value, w_v, b_v))]


def _pad_last(mask):
    """A mask with one more (unmasked) key position at the end."""
    return None if mask is None else F.pad(mask, (0, 1))


def _merge_masks(attn_mask, key_padding_mask, batch, heads, q_len, k_len, is_causal):
    """One additive float mask of shape broadcastable to (batch, heads, q_len, k_len), or None."""
    mask = None
    if is_causal and attn_mask is None:
        attn_mask = _causal(q_len, k_len)
    for m, shape in ((attn_mask, None), (key_padding_mask, (batch, 1, 1, k_len))):
        if m is None:
            continue
        additive = _additive(m)
        if shape is not None:
            additive = additive.reshape(shape)
        elif additive.ndim == 3:
            additive = additive.reshape(batch, heads, q_len, k_len)
        mask = additive if mask is None else mask + additive
    return mask


def _causal(q_len, k_len):
    """True above the diagonal: the positions a query may not attend to."""
    rows = factories.arange(q_len).reshape(q_len, 1)
    cols = factories.arange(k_len).reshape(1, k_len)
    return cols > rows


def _additive(mask):
    """A bool mask (True: not attended) as the additive float mask: -inf there, 0 elsewhere."""
    if mask.dtype is dt.bool_:
        # NOTE: where() takes its shape from the mask; zeros(tuple(mask.shape)) would read a compiled graph's symbolic
        # batch size as a plain int and pin it (a DataLoader's short last batch then ran eagerly)
        return api.where(mask, float("-inf"), 0.0)
    return mask


# --- losses -----------------------------------------------------------------------------------------

class _Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
        super().__init__()
        if size_average is not None or reduce is not None:
            raise NotImplementedError("size_average and reduce are deprecated; use reduction=")
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"{reduction} is not a valid value for reduction")
        self.reduction = reduction


class MSELoss(_Loss):
    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    def forward(self, input, target):
        return F.l1_loss(input, target, reduction=self.reduction)


class _WeightedLoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)


class CrossEntropyLoss(_WeightedLoss):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class NLLLoss(_WeightedLoss):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input, target):
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class BCELoss(_WeightedLoss):
    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, weight=self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, self.weight, reduction=self.reduction,
                                                  pos_weight=self.pos_weight)
