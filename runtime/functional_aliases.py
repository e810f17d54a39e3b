"""torch's top-level forms of nn.functional's ops (torch.conv2d, torch.dropout(input, p, train), torch.layer_norm,
torch.embedding(weight, indices), ...), with their own signatures where those differ from nn.functional's: code
ported from older torch, and some attention and normalization layers, call them so."""
from __future__ import annotations

from . import api
from .nn import functional as F
from .ops import is_tensor_like

# the same signature as nn.functional's
conv1d, conv2d, conv3d = F.conv1d, F.conv2d, F.conv3d
conv_transpose1d, conv_transpose2d, conv_transpose3d = F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d
avg_pool1d, adaptive_avg_pool1d = F.avg_pool1d, F.adaptive_avg_pool1d
pixel_shuffle, pixel_unshuffle, channel_shuffle = F.pixel_shuffle, F.pixel_unshuffle, F.channel_shuffle
prelu, hardshrink, bilinear = F.prelu, F.hardshrink, F.bilinear
cosine_similarity, pairwise_distance, pdist = F.cosine_similarity, F.pairwise_distance, F.pdist
row_stack = api.vstack


def dropout(input, p, train):
    return F.dropout(input, p, train)


def alpha_dropout(input, p, train):
    return F.alpha_dropout(input, p, train)


def feature_alpha_dropout(input, p, train):
    return F.feature_alpha_dropout(input, p, train)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return F.layer_norm(input, normalized_shape, weight, bias, eps)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    return F.group_norm(input, num_groups, weight, bias, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    return F.rms_norm(input, normalized_shape, weight, eps)


def batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled):
    """nn.functional.batch_norm with the arguments in aten's order (weight and bias first)."""
    return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps, cudnn_enabled):
    return F.instance_norm(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)


def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """nn.functional.embedding with the table first; padding_idx -1 means none here (aten's convention)."""
    return F.embedding(indices, weight, None if padding_idx == -1 else padding_idx,
                       scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)


def _pooling_stride(stride):
    return None if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0) else stride


def max_pool1d(input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return F.max_pool1d(input, kernel_size, _pooling_stride(stride), padding, dilation, ceil_mode)


def max_pool2d(input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return F.max_pool2d(input, kernel_size, _pooling_stride(stride), padding, dilation, ceil_mode)


def max_pool3d(input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return F.max_pool3d(input, kernel_size, _pooling_stride(stride), padding, dilation, ceil_mode)


def adaptive_max_pool1d(input, output_size):
    """(values, indices), as aten's returns both."""
    return F.adaptive_max_pool1d(input, output_size, return_indices=True)


def selu(input):
    return F.selu(input)


def celu(input, alpha=1.0):
    return F.celu(input, alpha)


def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, generator=None):
    if generator is not None:
        raise NotImplementedError("rrelu(generator=...) is not supported: runtime draws from its default generator")
    return F.rrelu(input, lower, upper, training)


def threshold(input, threshold, value):
    return F.threshold(input, threshold, value)


def rsub(input, other, alpha=1):
    """other - alpha * input."""
    return api.sub(other, input, alpha=alpha) if is_tensor_like(other) else input * -alpha + other
