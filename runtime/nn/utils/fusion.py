"""torch.nn.utils.fusion: fold an eval-mode BatchNorm into the convolution or linear layer before it."""
from __future__ import annotations

import copy

from ...autograd import grad_mode
from ..parameter import Parameter

__all__ = ["fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval", "fuse_linear_bn_weights"]


def fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b, transpose=False):
    """(weight, bias) of one convolution computing conv followed by the batch norm's eval-mode affine map."""
    dtype = conv_w.dtype
    conv_b = bn_rm.new_zeros(tuple(bn_rm.shape)) if conv_b is None else conv_b
    bn_w = bn_rm.new_ones(tuple(bn_rm.shape)) if bn_w is None else bn_w
    bn_b = bn_rm.new_zeros(tuple(bn_rm.shape)) if bn_b is None else bn_b
    rsqrt = (bn_rv + bn_eps).rsqrt()
    shape = ((1, -1) if transpose else (-1, 1)) + (1,) * (conv_w.ndim - 2)
    weight = (conv_w * (bn_w * rsqrt).reshape(shape)).to(dtype)
    bias = ((conv_b - bn_rm) * rsqrt * bn_w + bn_b).to(dtype)
    return Parameter(weight, conv_w.requires_grad), Parameter(bias, conv_b.requires_grad)


def fuse_conv_bn_eval(conv, bn, transpose=False):
    if conv.training or bn.training:
        raise AssertionError("Fusion only for eval!")
    fused = copy.deepcopy(conv)
    if bn.running_mean is None or bn.running_var is None:
        raise AssertionError("fuse_conv_bn_eval needs the batch norm's running statistics")
    with grad_mode.no_grad():
        fused.weight, fused.bias = fuse_conv_bn_weights(fused.weight, fused.bias, bn.running_mean, bn.running_var,
                                                        bn.eps, bn.weight, bn.bias, transpose)
    return fused


def fuse_linear_bn_weights(linear_w, linear_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b):
    """(weight, bias) of one linear layer computing linear followed by the batch norm's eval-mode affine map."""
    linear_b = bn_rm.new_zeros(tuple(bn_rm.shape)) if linear_b is None else linear_b
    scale = bn_w * (bn_rv + bn_eps).rsqrt()
    weight = linear_w * scale.unsqueeze(-1)
    bias = (linear_b - bn_rm) * scale + bn_b
    return Parameter(weight, linear_w.requires_grad), Parameter(bias, linear_b.requires_grad)


def fuse_linear_bn_eval(linear, bn):
    if linear.training or bn.training:
        raise AssertionError("Fusion only for eval!")
    if not (linear.out_features == bn.num_features or bn.num_features == 1):
        raise AssertionError("To fuse, linear.out_features == bn.num_features or bn.num_features == 1")
    fused = copy.deepcopy(linear)
    with grad_mode.no_grad():
        fused.weight, fused.bias = fuse_linear_bn_weights(fused.weight, fused.bias, bn.running_mean,
                                                          bn.running_var, bn.eps, bn.weight, bn.bias)
    return fused
