"""runtime.nn.functional: forwards and gradients vs torch (float64), finite-difference gradchecks, dropout
statistics and argument errors. Tests that need torch skip cleanly without it."""
from __future__ import annotations

import inspect
import math
import warnings

import numpy as np
import pytest

import runtime
import runtime.nn.functional as F
from runtime.autograd import gradcheck

from helpers import needs_torch, torch

TF = None if torch is None else torch.nn.functional


# ---------------------------------------------------------------------------------------------
# Inputs are numpy arrays; G(...) marks one that requires grad, anything else is a constant.
# ---------------------------------------------------------------------------------------------

class G:
    """A float64 input that requires grad."""

    def __init__(self, array):
        self.array = np.asarray(array, dtype=np.float64)


def rnd(*shape, seed=None, scale=1.0, offset=0.0):
    rng = np.random.default_rng(seed if seed is not None else hash(shape) % 2 ** 32)
    return rng.standard_normal(shape) * scale + offset


def R(*shape, **kw):
    return G(rnd(*shape, **kw))


def U(*shape, low=0.05, high=0.95, seed=0):
    return np.random.default_rng(seed).uniform(low, high, shape)


def to_lib(lib, x):
    if isinstance(x, G):
        return lib.tensor(x.array.copy(), requires_grad=True)
    if isinstance(x, np.ndarray):
        return lib.tensor(x.copy())
    return x


def run(lib, fn, inputs):
    """(outputs as numpy arrays, gradients of every G input for a fixed random cotangent)."""
    functional = F if lib is runtime else TF
    tensors = [to_lib(lib, x) for x in inputs]
    out = fn(lib, functional, *tensors)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    values = [o.detach().numpy().copy() for o in outs]
    grads = []
    leaves = [t for t, x in zip(tensors, inputs) if isinstance(x, G)]
    floats = [o for o in outs if o.requires_grad]
    if leaves and floats:
        rng = np.random.default_rng(123)
        total = None
        for o in floats:
            term = (o * lib.tensor(rng.standard_normal(tuple(o.shape)))).sum()
            total = term if total is None else total + term
        total.backward()
        grads = [np.zeros(t.shape) if t.grad is None else t.grad.numpy().copy() for t in leaves]
    return values, grads


def check(fn, *inputs, rtol=1e-10, atol=1e-12):
    got_values, got_grads = run(runtime, fn, inputs)
    want_values, want_grads = run(torch, fn, inputs)
    assert len(got_values) == len(want_values)
    for got, want in zip(got_values, want_values):
        assert got.shape == want.shape, (got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    assert len(got_grads) == len(want_grads)
    for i, (got, want) in enumerate(zip(got_grads, want_grads)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"gradient of input {i}")


# name -> (fn(lib, F, *tensors), inputs)
CASES = {
    # linear layers
    "linear": (lambda lib, f, x, w, b: f.linear(x, w, b), [R(3, 4), R(5, 4), R(5)]),
    "linear_3d_nobias": (lambda lib, f, x, w: f.linear(x, w), [R(2, 3, 4), R(5, 4)]),
    "bilinear": (lambda lib, f, a, b, w, c: f.bilinear(a, b, w, c), [R(3, 4), R(3, 2), R(5, 4, 2), R(5)]),
    # activations
    "relu": (lambda lib, f, x: f.relu(x), [R(4, 5)]),
    "leaky_relu": (lambda lib, f, x: f.leaky_relu(x, 0.2), [R(4, 5)]),
    "gelu": (lambda lib, f, x: f.gelu(x), [R(4, 5, scale=2)]),
    "gelu_tanh": (lambda lib, f, x: f.gelu(x, approximate="tanh"), [R(4, 5, scale=2)]),
    "silu": (lambda lib, f, x: f.silu(x), [R(4, 5, scale=3)]),
    "sigmoid": (lambda lib, f, x: f.sigmoid(x), [R(4, 5, scale=3)]),
    "tanh": (lambda lib, f, x: f.tanh(x), [R(4, 5)]),
    "elu": (lambda lib, f, x: f.elu(x, alpha=0.7), [R(4, 5, scale=3)]),
    "selu": (lambda lib, f, x: f.selu(x), [R(4, 5, scale=3)]),
    "relu6": (lambda lib, f, x: f.relu6(x), [R(4, 5, scale=5)]),
    "hardtanh": (lambda lib, f, x: f.hardtanh(x, -0.5, 0.7), [R(4, 5)]),
    # torch's hardsigmoid backward multiplies by a float32 1/6, even for float64
    "hardsigmoid": (lambda lib, f, x: f.hardsigmoid(x), [R(4, 5, scale=4)], 1e-7),
    "hardswish": (lambda lib, f, x: f.hardswish(x), [R(4, 5, scale=4)]),
    "softplus": (lambda lib, f, x: f.softplus(x, beta=2, threshold=3), [R(4, 5, scale=3)]),
    "softplus_large": (lambda lib, f, x: f.softplus(x * 400), [R(4, 5)]),
    "logsigmoid": (lambda lib, f, x: f.logsigmoid(x * 60), [R(4, 5)]),
    "mish": (lambda lib, f, x: f.mish(x), [R(4, 5, scale=3)]),
    "softsign": (lambda lib, f, x: f.softsign(x), [R(4, 5)]),
    "glu": (lambda lib, f, x: f.glu(x, 1), [R(3, 6)]),
    "softmax": (lambda lib, f, x: f.softmax(x, dim=1), [R(3, 4, 2, scale=5)]),
    "log_softmax": (lambda lib, f, x: f.log_softmax(x, -1), [R(3, 4, scale=5)]),
    "softmin": (lambda lib, f, x: f.softmin(x, 0), [R(3, 4)]),
    "normalize": (lambda lib, f, x: f.normalize(x, dim=-1), [R(3, 4)]),
    "normalize_p1": (lambda lib, f, x: f.normalize(x, p=1.0, dim=0), [R(3, 4)]),
    "normalize_p3": (lambda lib, f, x: f.normalize(x, p=3.0), [R(3, 4)]),
    "cosine_similarity": (lambda lib, f, a, b: f.cosine_similarity(a, b, dim=1), [R(3, 5), R(1, 5)]),
    # embedding
    "embedding": (lambda lib, f, i, w: f.embedding(i, w), [np.array([[1, 3, 1], [0, 2, 4]]), R(5, 3)]),
    "embedding_padding_idx": (lambda lib, f, i, w: f.embedding(i, w, padding_idx=1),
                              [np.array([[1, 3, 1], [0, 2, 4]]), R(5, 3)]),
    "embedding_negative_padding_idx": (lambda lib, f, i, w: f.embedding(i, w, padding_idx=-1),
                                       [np.array([4, 3, 4, 0]), R(5, 3)]),
    # normalisation
    "layer_norm": (lambda lib, f, x, w, b: f.layer_norm(x, (3, 4), w, b), [R(2, 3, 4), R(3, 4), R(3, 4)]),
    "layer_norm_plain": (lambda lib, f, x: f.layer_norm(x, [5], eps=1e-3), [R(3, 5, offset=2)]),
    "batch_norm_train": (lambda lib, f, x, w, b: f.batch_norm(x, None, None, w, b, training=True),
                         [R(4, 3, 2, 2), R(3), R(3)]),
    "batch_norm_train_2d": (lambda lib, f, x: f.batch_norm(x, None, None, training=True, eps=1e-3), [R(5, 3)]),
    "batch_norm_eval": (lambda lib, f, x, m, v, w, b: f.batch_norm(x, m, v, w, b, training=False),
                        [R(4, 3, 5), rnd(3), np.abs(rnd(3)) + 0.5, R(3), R(3)]),
    "group_norm": (lambda lib, f, x, w, b: f.group_norm(x, 2, w, b), [R(2, 6, 3), R(6), R(6)]),
    # convolution
    "conv1d": (lambda lib, f, x, w, b: f.conv1d(x, w, b, stride=2, padding=1, dilation=2),
               [R(2, 3, 9), R(4, 3, 3), R(4)]),
    "conv1d_same_even_kernel": (lambda lib, f, x, w: f.conv1d(x, w, padding="same", dilation=1),
                                [R(2, 2, 7), R(3, 2, 4)]),
    "conv1d_unbatched": (lambda lib, f, x, w: f.conv1d(x, w), [R(2, 6), R(3, 2, 2)]),
    "conv2d": (lambda lib, f, x, w, b: f.conv2d(x, w, b), [R(2, 3, 5, 6), R(4, 3, 3, 2), R(4)]),
    "conv2d_groups_stride_dilation": (
        lambda lib, f, x, w, b: f.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
        [R(2, 4, 7, 6), R(6, 2, 3, 2), R(6)]),
    "conv2d_depthwise": (lambda lib, f, x, w: f.conv2d(x, w, stride=2, padding=1, groups=3),
                         [R(1, 3, 6, 6), R(3, 1, 3, 3)]),
    "conv2d_same": (lambda lib, f, x, w: f.conv2d(x, w, padding="same", dilation=2), [R(1, 2, 7, 6), R(3, 2, 3, 2)]),
    "conv2d_valid": (lambda lib, f, x, w: f.conv2d(x, w, padding="valid"), [R(1, 2, 5, 5), R(3, 2, 3, 3)]),
    "conv2d_1x1": (lambda lib, f, x, w, b: f.conv2d(x, w, b), [R(2, 3, 4, 4), R(5, 3, 1, 1), R(5)]),
    "conv2d_unbatched": (lambda lib, f, x, w: f.conv2d(x, w, padding=1), [R(2, 4, 4), R(3, 2, 3, 3)]),
    "conv3d": (lambda lib, f, x, w: f.conv3d(x, w, padding=1, stride=2), [R(1, 2, 4, 4, 3), R(2, 2, 2, 2, 2)]),
    # pooling
    "max_pool2d": (lambda lib, f, x: f.max_pool2d(x, 3, stride=2, padding=1), [R(2, 3, 7, 6)]),
    "max_pool2d_ceil_dilation": (lambda lib, f, x: f.max_pool2d(x, (2, 3), stride=2, dilation=(2, 1),
                                                               ceil_mode=True), [R(1, 2, 8, 7)]),
    "max_pool2d_indices": (lambda lib, f, x: f.max_pool2d(x, 2, padding=1, return_indices=True), [R(2, 2, 5, 5)]),
    "max_pool2d_indices_ceil_dilation": (
        lambda lib, f, x: f.max_pool2d(x, 3, stride=2, padding=1, dilation=2, ceil_mode=True, return_indices=True),
        [R(1, 2, 8, 7)]),
    "max_pool1d_indices": (lambda lib, f, x: f.max_pool1d(x, 2, return_indices=True), [R(2, 3, 7)]),
    "max_pool2d_unbatched": (lambda lib, f, x: f.max_pool2d(x, 2), [R(3, 4, 6)]),
    "max_pool1d": (lambda lib, f, x: f.max_pool1d(x, 3, stride=2, padding=1, ceil_mode=True), [R(2, 3, 8)]),
    "avg_pool2d": (lambda lib, f, x: f.avg_pool2d(x, 3, stride=2, padding=1), [R(2, 3, 7, 6)]),
    "avg_pool2d_exclude_pad": (lambda lib, f, x: f.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
                               [R(2, 3, 7, 6)]),
    "avg_pool2d_ceil": (lambda lib, f, x: f.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True), [R(1, 2, 6, 8)]),
    "avg_pool2d_ceil_exclude": (lambda lib, f, x: f.avg_pool2d(x, 2, stride=3, ceil_mode=True,
                                                              count_include_pad=False), [R(1, 2, 7, 8)]),
    "avg_pool2d_divisor": (lambda lib, f, x: f.avg_pool2d(x, 2, divisor_override=3), [R(1, 2, 4, 6)]),
    "avg_pool1d": (lambda lib, f, x: f.avg_pool1d(x, 2, stride=1, padding=1), [R(2, 3, 5)]),
    "adaptive_avg_pool2d": (lambda lib, f, x: f.adaptive_avg_pool2d(x, (3, 4)), [R(2, 3, 5, 7)]),
    "adaptive_avg_pool2d_even": (lambda lib, f, x: f.adaptive_avg_pool2d(x, 2), [R(2, 3, 4, 6)]),
    "adaptive_avg_pool2d_none": (lambda lib, f, x: f.adaptive_avg_pool2d(x, (None, 1)), [R(2, 3, 4, 5)]),
    "adaptive_avg_pool1d": (lambda lib, f, x: f.adaptive_avg_pool1d(x, 3), [R(2, 7)]),
    # padding
    "pad_constant": (lambda lib, f, x: f.pad(x, (1, 2, 0, 1), value=0.5), [R(2, 3, 4)]),
    "pad_negative": (lambda lib, f, x: f.pad(x, (-1, 2, 1, -2)), [R(2, 3, 4)]),
    "pad_reflect": (lambda lib, f, x: f.pad(x, (2, 1, 1, 2), mode="reflect"), [R(1, 2, 4, 5)]),
    "pad_replicate": (lambda lib, f, x: f.pad(x, (2, 1), mode="replicate"), [R(1, 2, 4)]),
    "pad_circular": (lambda lib, f, x: f.pad(x, (2, 1, 1, 0), mode="circular"), [R(1, 2, 3, 4)]),
    # attention
    "sdpa": (lambda lib, f, q, k, v: f.scaled_dot_product_attention(q, k, v), [R(2, 3, 4), R(2, 5, 4), R(2, 5, 3)]),
    "sdpa_heads_scale": (lambda lib, f, q, k, v: f.scaled_dot_product_attention(q, k, v, scale=0.3),
                         [R(2, 2, 3, 4), R(2, 2, 5, 4), R(2, 2, 5, 3)]),
    "sdpa_causal": (lambda lib, f, q, k, v: f.scaled_dot_product_attention(q, k, v, is_causal=True),
                    [R(2, 4, 4), R(2, 4, 4), R(2, 4, 3)]),
    "sdpa_causal_rect": (lambda lib, f, q, k, v: f.scaled_dot_product_attention(q, k, v, is_causal=True),
                         [R(2, 3, 4), R(2, 5, 4), R(2, 5, 3)]),
    "sdpa_bool_mask": (lambda lib, f, q, k, v, m: f.scaled_dot_product_attention(q, k, v, attn_mask=m),
                       [R(2, 3, 4), R(2, 5, 4), R(2, 5, 3), np.random.default_rng(1).random((3, 5)) > 0.3]),
    "sdpa_fully_masked_row": (lambda lib, f, q, k, v, m: f.scaled_dot_product_attention(q, k, v, attn_mask=m),
                              [R(2, 3, 4), R(2, 5, 4), R(2, 5, 3),
                               np.array([[False] * 5, [True, False, True, True, False], [True] * 5])]),
    "sdpa_float_mask": (lambda lib, f, q, k, v, m: f.scaled_dot_product_attention(q, k, v, attn_mask=m),
                        [R(2, 3, 4), R(2, 5, 4), R(2, 5, 3), R(3, 5)]),
    "sdpa_gqa": (lambda lib, f, q, k, v: f.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                 [R(1, 4, 3, 4), R(1, 2, 5, 4), R(1, 2, 5, 3)]),
    # losses
    "mse_loss": (lambda lib, f, x, t: f.mse_loss(x, t), [R(3, 4), R(3, 4)]),
    "mse_loss_sum": (lambda lib, f, x, t: f.mse_loss(x, t, reduction="sum"), [R(3, 4), R(3, 4)]),
    "mse_loss_none": (lambda lib, f, x, t: f.mse_loss(x, t, reduction="none"), [R(3, 4), R(3, 4)]),
    "l1_loss": (lambda lib, f, x, t: f.l1_loss(x, t), [R(3, 4), R(3, 4)]),
    "l1_loss_none": (lambda lib, f, x, t: f.l1_loss(x, t, reduction="none"), [R(3, 4), rnd(3, 4)]),
    "smooth_l1_loss": (lambda lib, f, x, t: f.smooth_l1_loss(x, t, beta=0.5), [R(3, 4), R(3, 4)]),
    "huber_loss": (lambda lib, f, x, t: f.huber_loss(x, t, reduction="sum", delta=0.7), [R(3, 4), R(3, 4)]),
    "nll_loss": (lambda lib, f, x, t: f.nll_loss(f.log_softmax(x, 1), t), [R(4, 5), np.array([0, 4, 2, 2])]),
    "nll_loss_weight_ignore": (lambda lib, f, x, t, w: f.nll_loss(x, t, weight=w, ignore_index=2),
                               [R(5, 4), np.array([0, 3, 2, 1, 3]), U(4)]),
    "nll_loss_weight_sum": (lambda lib, f, x, t, w: f.nll_loss(x, t, weight=w, reduction="sum"),
                            [R(4, 3), np.array([0, 1, 2, 1]), U(3)]),
    "nll_loss_none_kdim": (lambda lib, f, x, t: f.nll_loss(x, t, reduction="none", ignore_index=0),
                           [R(2, 3, 4), np.array([[0, 1, 2, 1], [2, 2, 0, 1]])]),
    "cross_entropy": (lambda lib, f, x, t: f.cross_entropy(x, t), [R(4, 5), np.array([0, 4, 2, 2])]),
    "cross_entropy_weight_ignore": (lambda lib, f, x, t, w: f.cross_entropy(x, t, weight=w, ignore_index=-1),
                                    [R(5, 4), np.array([0, -1, 2, 1, 3]), U(4)]),
    "cross_entropy_smoothing": (lambda lib, f, x, t: f.cross_entropy(x, t, label_smoothing=0.2),
                                [R(4, 5), np.array([0, 4, 2, 2])]),
    "cross_entropy_smoothing_ignore": (lambda lib, f, x, t: f.cross_entropy(x, t, label_smoothing=0.2, ignore_index=0),
                                       [R(4, 5), np.array([0, 4, 2, 0])]),
    "cross_entropy_smoothing_weight_ignore": (
        lambda lib, f, x, t, w: f.cross_entropy(x, t, weight=w, ignore_index=3, label_smoothing=0.3),
        [R(5, 4), np.array([0, 3, 2, 1, 3]), U(4)]),
    "cross_entropy_smoothing_none_kdim": (
        lambda lib, f, x, t: f.cross_entropy(x, t, reduction="none", label_smoothing=0.1, ignore_index=1),
        [R(2, 3, 2, 2), np.array([[[0, 1], [2, 2]], [[1, 0], [0, 2]]])]),
    "cross_entropy_smoothing_sum_weight": (
        lambda lib, f, x, t, w: f.cross_entropy(x, t, weight=w, reduction="sum", label_smoothing=0.4),
        [R(4, 3), np.array([0, 1, 2, 1]), U(3)]),
    "cross_entropy_1d_input": (lambda lib, f, x, t: f.cross_entropy(x, t), [R(5), np.array(3)]),
    "cross_entropy_probs": (lambda lib, f, x, t: f.cross_entropy(x, t), [R(4, 5), U(4, 5)]),
    "cross_entropy_probs_weight_smoothing": (
        lambda lib, f, x, t, w: f.cross_entropy(x, t, weight=w, label_smoothing=0.25),
        [R(4, 5), G(U(4, 5)), U(5)]),
    "cross_entropy_probs_none_kdim": (lambda lib, f, x, t: f.cross_entropy(x, t, reduction="none"),
                                      [R(2, 3, 4), U(2, 3, 4)]),
    "kl_div": (lambda lib, f, x, t: f.kl_div(f.log_softmax(x, 1), t, reduction="batchmean"),
               [R(3, 4), np.array([[0.5, 0.5, 0, 0], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])]),
    "kl_div_log_target": (lambda lib, f, x, t: f.kl_div(x, t, reduction="sum", log_target=True),
                          [R(3, 4), R(3, 4)]),
    "binary_cross_entropy": (lambda lib, f, x, t: f.binary_cross_entropy(x, t), [G(U(3, 4)), U(3, 4, seed=1)]),
    "binary_cross_entropy_weight_none": (
        lambda lib, f, x, t, w: f.binary_cross_entropy(x, t, weight=w, reduction="none"),
        [G(U(3, 4)), G(U(3, 4, seed=1)), U(4, seed=2)]),
    # forward only: at inputs 0 and 1 the target's gradient differs (see test_binary_cross_entropy_edges)
    "binary_cross_entropy_edges": (lambda lib, f, x, t: f.binary_cross_entropy(x, t, reduction="none"),
                                   [np.array([0.0, 1.0, 0.0, 1.0, 1e-50]), np.array([0.0, 1.0, 0.3, 0.6, 0.5])]),
    "bce_with_logits": (lambda lib, f, x, t: f.binary_cross_entropy_with_logits(x, t), [R(3, 4), U(3, 4)]),
    "bce_with_logits_large": (lambda lib, f, x, t: f.binary_cross_entropy_with_logits(x * 300, t, reduction="none"),
                              [R(3, 4), U(3, 4)]),
    "bce_with_logits_weights": (
        lambda lib, f, x, t, w, pw: f.binary_cross_entropy_with_logits(x, t, weight=w, pos_weight=pw,
                                                                       reduction="sum"),
        [R(3, 4), G(U(3, 4)), U(4, seed=3), U(4, seed=4) * 3]),
}

# issue 15's additions (modules using them are checked in tests/test_nn_layers_more.py)
SIGN = np.array([1.0, -1.0, -1.0, 1.0, 1.0])
CASES.update({
    # alpha exact in float32: torch computes celu through a float32 1 / alpha
    "celu": (lambda lib, f, x: f.celu(x, 0.5), [R(4, 5, scale=3)]),
    "threshold": (lambda lib, f, x: f.threshold(x, 0.3, -2.0), [R(4, 5)]),
    "hardshrink": (lambda lib, f, x: f.hardshrink(x, 0.4), [R(4, 5)]),
    "softshrink": (lambda lib, f, x: f.softshrink(x, 0.4), [R(4, 5)]),
    "tanhshrink": (lambda lib, f, x: f.tanhshrink(x), [R(4, 5)]),
    "prelu": (lambda lib, f, x, w: f.prelu(x, w), [R(2, 3, 4), R(3)]),
    "rrelu_eval": (lambda lib, f, x: f.rrelu(x, 0.1, 0.3), [R(4, 5)]),
    "instance_norm": (lambda lib, f, x, w, b: f.instance_norm(x, weight=w, bias=b), [R(2, 3, 5), R(3), R(3)]),
    "rms_norm": (lambda lib, f, x, w: f.rms_norm(x, (5,), w), [R(3, 5), R(5)]),
    "local_response_norm": (lambda lib, f, x: f.local_response_norm(x, 3, 0.2), [R(2, 5, 3)]),
    "conv_transpose1d": (lambda lib, f, x, w, b: f.conv_transpose1d(x, w, b, 2, 1, 1), [R(2, 2, 5), R(2, 3, 3),
                                                                                         R(3)]),
    "conv_transpose2d": (lambda lib, f, x, w: f.conv_transpose2d(x, w, groups=2), [R(1, 4, 3, 3), R(4, 1, 2, 2)]),
    "conv_transpose3d": (lambda lib, f, x, w: f.conv_transpose3d(x, w, stride=2), [R(1, 2, 2, 2, 2), R(2, 1, 2, 2, 2)]),
    "unfold": (lambda lib, f, x: f.unfold(x, 2, padding=1), [R(1, 2, 3, 4)]),
    "fold": (lambda lib, f, x: f.fold(x, (3, 4), 2), [R(1, 8, 6)]),
    "max_pool3d": (lambda lib, f, x: f.max_pool3d(x, 2), [R(1, 2, 4, 4, 2)]),
    "avg_pool3d": (lambda lib, f, x: f.avg_pool3d(x, 2, 1), [R(1, 2, 3, 3, 3)]),
    "adaptive_max_pool1d": (lambda lib, f, x: f.adaptive_max_pool1d(x, 3), [R(2, 3, 7)]),
    "adaptive_max_pool2d": (lambda lib, f, x: f.adaptive_max_pool2d(x, (2, 3)), [R(2, 3, 5, 7)]),
    "adaptive_avg_pool3d": (lambda lib, f, x: f.adaptive_avg_pool3d(x, 2), [R(1, 2, 4, 5, 3)]),
    "lp_pool1d": (lambda lib, f, x: f.lp_pool1d(x, 2.0, 2), [G(U(2, 2, 6))]),
    "lp_pool2d": (lambda lib, f, x: f.lp_pool2d(x, 3.0, 2), [G(U(1, 2, 4, 4))]),
    "interpolate": (lambda lib, f, x: f.interpolate(x, scale_factor=1.5, mode="bilinear"), [R(1, 2, 4, 4)]),
    "upsample": (lambda lib, f, x: f.upsample(x, size=7, mode="linear", align_corners=True), [R(1, 2, 4)]),
    "pixel_shuffle": (lambda lib, f, x: f.pixel_shuffle(x, 2), [R(2, 8, 2, 3)]),
    "pixel_unshuffle": (lambda lib, f, x: f.pixel_unshuffle(x, 2), [R(2, 2, 4, 2)]),
    "channel_shuffle": (lambda lib, f, x: f.channel_shuffle(x, 3), [R(2, 6, 2)]),
    "pairwise_distance": (lambda lib, f, a, b: f.pairwise_distance(a, b), [R(3, 4), R(3, 4)]),
    "embedding_bag": (lambda lib, f, i, w, o: f.embedding_bag(i, w, o, mode="sum"),
                      [np.array([1, 2, 4, 3, 3]), R(5, 3), np.array([0, 2])]),
    "margin_ranking_loss": (lambda lib, f, a, b, y: f.margin_ranking_loss(a, b, y, 0.1), [R(5), R(5), SIGN]),
    "hinge_embedding_loss": (lambda lib, f, x, y: f.hinge_embedding_loss(x, y), [R(5), SIGN]),
    "soft_margin_loss": (lambda lib, f, x, y: f.soft_margin_loss(x, y), [R(5), SIGN]),
    "cosine_embedding_loss": (lambda lib, f, a, b, y: f.cosine_embedding_loss(a, b, y), [R(5, 3), R(5, 3), SIGN]),
    "triplet_margin_loss": (lambda lib, f, a, p, n: f.triplet_margin_loss(a, p, n), [R(4, 3), R(4, 3), R(4, 3)]),
    "triplet_margin_with_distance_loss": (lambda lib, f, a, p, n: f.triplet_margin_with_distance_loss(a, p, n),
                                          [R(4, 3), R(4, 3), R(4, 3)]),
    "poisson_nll_loss": (lambda lib, f, x, y: f.poisson_nll_loss(x, y, full=True), [R(4, 3), U(4, 3, high=4)]),
    "gaussian_nll_loss": (lambda lib, f, x, y, v: f.gaussian_nll_loss(x, y, v), [R(4, 3), R(4, 3), G(U(4, 3))]),
    "multilabel_soft_margin_loss": (lambda lib, f, x, y: f.multilabel_soft_margin_loss(x, y),
                                    [R(4, 3), np.array([[1.0, 0, 1], [0, 0, 1], [1, 1, 1], [0, 0, 0]])]),
    "multi_margin_loss": (lambda lib, f, x, y: f.multi_margin_loss(x, y), [R(4, 5), np.array([0, 4, 2, 2])]),
})


@needs_torch
@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name):
    fn, inputs, *tolerance = CASES[name]
    check(fn, *inputs, rtol=tolerance[0] if tolerance else 1e-10)


def test_every_function_is_exercised():
    """Each public function (except the trivial in-place aliases) is called somewhere in this file."""
    source = inspect.getsource(__import__(__name__))
    untested = [n for n in F.__all__ if n not in ("relu_", "leaky_relu_") and f"f.{n}(" not in source
                and f"F.{n}(" not in source]
    assert not untested, untested


def test_functional_is_a_composition():
    """No numpy in the functional module: everything is built from tensor methods and primitives."""
    source = inspect.getsource(F)
    assert "import numpy" not in source and "np." not in source


# ---------------------------------------------------------------------------------------------
# Running statistics, in-place variants, special cases vs torch
# ---------------------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("momentum", [0.1, 0.7])
def test_batch_norm_running_stats_match_torch(momentum):
    x = rnd(6, 3, 4, seed=5)
    ours = [runtime.zeros(3, dtype=runtime.float64), runtime.ones(3, dtype=runtime.float64)]
    theirs = [torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)]
    for step in range(3):
        F.batch_norm(runtime.tensor(x + step), *ours, training=True, momentum=momentum)
        TF.batch_norm(torch.tensor(x + step), *theirs, training=True, momentum=momentum)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)


@needs_torch
def test_batch_norm_cumulative_average_matches_torch_module():
    """momentum=None with num_batches_tracked: torch's BatchNorm cumulative moving average."""
    bn = torch.nn.BatchNorm1d(3, momentum=None, dtype=torch.float64)
    mean, var = runtime.zeros(3, dtype=runtime.float64), runtime.ones(3, dtype=runtime.float64)
    for step in range(1, 4):
        x = rnd(5, 3, seed=step) * step
        bn(torch.tensor(x))
        F.batch_norm(runtime.tensor(x), mean, var, training=True, momentum=None, num_batches_tracked=step)
    np.testing.assert_allclose(mean.numpy(), bn.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(var.numpy(), bn.running_var.numpy(), rtol=1e-12)


def test_batch_norm_running_update_records_no_history():
    mean, var = runtime.zeros(3, dtype=runtime.float64), runtime.ones(3, dtype=runtime.float64)
    x = runtime.tensor(rnd(4, 3), requires_grad=True)
    out = F.batch_norm(x, mean, var, training=True)
    assert mean.grad_fn is None and not mean.requires_grad and var.grad_fn is None
    assert out.requires_grad
    np.testing.assert_allclose(mean.numpy(), 0.1 * x.detach().numpy().mean(0))
    with pytest.raises(TypeError, match="num_batches_tracked"):
        F.batch_norm(x, mean, var, training=True, momentum=None)


@needs_torch
def test_inplace_activations_match_torch():
    for name, kwargs in [("relu", {}), ("leaky_relu", {"negative_slope": 0.3}), ("elu", {}), ("silu", {}),
                         ("hardtanh", {}), ("hardswish", {})]:
        x = rnd(3, 4, seed=2)
        ours, theirs = runtime.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        a, b = ours * 2, theirs * 2  # non-leaf, so in-place is allowed while recording
        ra = getattr(F, name)(a, inplace=True, **kwargs)
        rb = getattr(TF, name)(b, inplace=True, **kwargs)
        assert ra is a
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-12, err_msg=name)
        (ra * ra).sum().backward()
        (rb * rb).sum().backward()
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-12, err_msg=name)


@needs_torch
def test_embedding_max_norm_matches_torch():
    w = rnd(5, 3, seed=8) * 2
    idx = np.array([[0, 2], [2, 4]])
    ours, theirs = runtime.tensor(w), torch.tensor(w)
    a = F.embedding(runtime.tensor(idx), ours, max_norm=1.5)
    b = TF.embedding(torch.tensor(idx), theirs, max_norm=1.5)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12)


@needs_torch
def test_one_hot_matches_torch():
    idx = np.array([[0, 3], [2, 1]])
    np.testing.assert_array_equal(F.one_hot(runtime.tensor(idx)).numpy(), TF.one_hot(torch.tensor(idx)).numpy())
    np.testing.assert_array_equal(F.one_hot(runtime.tensor(idx), 6).numpy(),
                                  TF.one_hot(torch.tensor(idx), 6).numpy())
    assert F.one_hot(runtime.tensor(idx)).dtype is runtime.int64


@needs_torch
def test_softmax_implicit_dim_warns_like_torch():
    x = rnd(2, 3, 4)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        ours = F.softmax(runtime.tensor(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = TF.softmax(torch.tensor(x))
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12)


@needs_torch
def test_mse_loss_broadcast_warns_and_matches():
    x, t = rnd(4, 3), rnd(3)
    with pytest.warns(UserWarning, match="different to the input size"):
        ours = F.mse_loss(runtime.tensor(x), runtime.tensor(t))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = TF.mse_loss(torch.tensor(x), torch.tensor(t))
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12)


@needs_torch
def test_legacy_size_average_reduce():
    x, t = rnd(4, 3), rnd(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kw in ({"size_average": False}, {"reduce": False}):
            np.testing.assert_allclose(F.l1_loss(runtime.tensor(x), runtime.tensor(t), **kw).numpy(),
                                       TF.l1_loss(torch.tensor(x), torch.tensor(t), **kw).numpy(), rtol=1e-12)


@needs_torch
def test_all_ignored_targets_give_nan_like_torch():
    x = rnd(3, 5)
    t = np.array([-100, -100, -100])
    for kw in ({}, {"label_smoothing": 0.1}):
        ours = F.cross_entropy(runtime.tensor(x), runtime.tensor(t), **kw).item()
        theirs = TF.cross_entropy(torch.tensor(x), torch.tensor(t), **kw).item()
        assert math.isnan(ours) and math.isnan(theirs)


@needs_torch
def test_float32_forward_matches_torch():
    x = rnd(2, 3, 6, 6).astype(np.float32)
    w = rnd(4, 3, 3, 3).astype(np.float32)
    ours = F.conv2d(runtime.tensor(x), runtime.tensor(w), padding=1)
    theirs = TF.conv2d(torch.tensor(x), torch.tensor(w), padding=1)
    assert ours.dtype is runtime.float32
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-5)
    logits, t = rnd(8, 5).astype(np.float32), np.arange(8) % 5
    np.testing.assert_allclose(F.cross_entropy(runtime.tensor(logits), runtime.tensor(t)).numpy(),
                               TF.cross_entropy(torch.tensor(logits), torch.tensor(t)).numpy(), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Finite-difference gradient checks (no torch needed)
# ---------------------------------------------------------------------------------------------

def leaf(*shape, seed=0, scale=1.0, offset=0.0):
    return runtime.tensor(rnd(*shape, seed=seed, scale=scale, offset=offset), requires_grad=True)


def test_gradcheck_conv2d_groups_dilation_stride():
    x, w, b = leaf(1, 4, 6, 5, seed=1), leaf(4, 2, 2, 3, seed=2), leaf(4, seed=3)
    assert gradcheck(lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(2, 1), groups=2),
                     (x, w, b))


def test_gradcheck_conv1d_same():
    assert gradcheck(lambda x, w: F.conv1d(x, w, padding="same"), (leaf(1, 2, 6, seed=1), leaf(2, 2, 4, seed=2)))


def test_gradcheck_layer_norm():
    x, w, b = leaf(3, 2, 4, seed=4), leaf(2, 4, seed=5), leaf(2, 4, seed=6)
    assert gradcheck(lambda x, w, b: F.layer_norm(x, (2, 4), w, b), (x, w, b))


def test_gradcheck_cross_entropy_label_smoothing():
    x, w = leaf(5, 4, seed=7), runtime.tensor(U(4))
    t = runtime.tensor([0, 3, 2, -100, 1])
    assert gradcheck(lambda x: F.cross_entropy(x, t, weight=w, label_smoothing=0.2), (x,))
    assert gradcheck(lambda x: F.cross_entropy(x, t, reduction="none", label_smoothing=0.2), (x,))


def test_gradcheck_cross_entropy_probabilities():
    x, p = leaf(3, 4, seed=8), runtime.tensor(U(3, 4), requires_grad=True)
    assert gradcheck(lambda x, p: F.cross_entropy(x, p, label_smoothing=0.1), (x, p))


def test_gradcheck_batch_norm_training():
    x, w, b = leaf(4, 3, 2, seed=9), leaf(3, seed=10), leaf(3, seed=11)
    assert gradcheck(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (x, w, b))


def test_gradcheck_scaled_dot_product_attention():
    q, k, v = leaf(2, 3, 4, seed=12), leaf(2, 5, 4, seed=13), leaf(2, 5, 3, seed=14)
    mask = runtime.tensor(np.random.default_rng(0).random((3, 5)) > 0.3)
    assert gradcheck(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v))
    assert gradcheck(lambda q, k, v: F.scaled_dot_product_attention(q, k[:, :3], v[:, :3], is_causal=True),
                     (q, k, v))


def test_gradcheck_pooling():
    x = leaf(1, 2, 5, 6, seed=15)
    assert gradcheck(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True), (x,))
    assert gradcheck(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False), (x,))
    assert gradcheck(lambda x: F.adaptive_avg_pool2d(x, (2, 4)), (x,))


def test_gradcheck_losses():
    x, t = leaf(3, 4, seed=16), runtime.tensor(U(3, 4), requires_grad=True)
    assert gradcheck(lambda x, t: F.binary_cross_entropy_with_logits(x, t, pos_weight=runtime.tensor(U(4))), (x, t))
    p = runtime.tensor(U(3, 4, seed=5), requires_grad=True)
    assert gradcheck(lambda p, t: F.binary_cross_entropy(p, t), (p, t))
    assert gradcheck(lambda x: F.nll_loss(x, runtime.tensor([1, 0, 3]), weight=runtime.tensor(U(4))), (x,))


def test_gradcheck_embedding_padding_idx():
    w = leaf(5, 3, seed=17)
    idx = runtime.tensor([[1, 2], [2, 0]])
    assert gradcheck(lambda w: F.embedding(idx, w), (w,))
    # padding_idx deliberately cuts the gradient of its row (finite differences would see it)
    out = F.embedding(idx, w, padding_idx=2)
    out.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy()[2], 0.0)
    np.testing.assert_array_equal(w.grad.numpy()[1], 1.0)


def test_extreme_values_stay_finite():
    x = runtime.tensor([-1000.0, -30.0, 0.0, 30.0, 1000.0], dtype=runtime.float64, requires_grad=True)
    for fn in (F.logsigmoid, F.softplus, F.elu, F.mish, F.silu,
               lambda x: F.binary_cross_entropy_with_logits(x, runtime.tensor([0.0, 1.0, 0.5, 0.0, 1.0]))):
        x.grad = None
        out = fn(x)
        out.sum().backward()
        assert np.isfinite(out.detach().numpy()).all() and np.isfinite(x.grad.numpy()).all()
    z = runtime.zeros(2, 3, dtype=runtime.float64, requires_grad=True)
    F.normalize(z).sum().backward()
    assert np.isfinite(z.grad.numpy()).all()
    p = runtime.tensor([0.0, 1.0, 0.5], dtype=runtime.float64, requires_grad=True)
    loss = F.binary_cross_entropy(p, runtime.tensor([0.0, 1.0, 1.0], dtype=runtime.float64), reduction="sum")
    loss.backward()
    assert np.isfinite(loss.item()) and np.isfinite(p.grad.numpy()).all()


def test_log_of_zero_probability_is_clamped_at_100():
    p = runtime.tensor([0.0, 1.0], dtype=runtime.float64)
    t = runtime.tensor([1.0, 0.0], dtype=runtime.float64)
    np.testing.assert_allclose(F.binary_cross_entropy(p, t, reduction="none").numpy(), [100.0, 100.0])


# ---------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_dropout_statistics(p):
    runtime.manual_seed(0)
    x = runtime.ones(200_000, dtype=runtime.float64)
    out = F.dropout(x, p, training=True).numpy()
    assert abs((out == 0).mean() - p) < 0.01
    assert abs(out.mean() - 1.0) < 0.02
    np.testing.assert_allclose(out[out != 0], 1 / (1 - p))


def test_dropout_identity_in_eval_and_p0():
    x = runtime.randn(10, 10)
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    assert F.dropout2d(x.reshape(2, 5, 10), 0.5, training=False) is not None
    np.testing.assert_array_equal(F.dropout(x, 1.0).numpy(), 0.0)


def test_dropout_gradient_is_the_mask_and_seeded_runs_reproduce():
    x = runtime.randn(50, 40, dtype=runtime.float64, requires_grad=True)
    runtime.manual_seed(3)
    out = F.dropout(x, 0.3)
    out.sum().backward()
    mask = out.detach().numpy() / x.detach().numpy()
    np.testing.assert_allclose(x.grad.numpy(), mask)
    runtime.manual_seed(3)
    np.testing.assert_array_equal(F.dropout(x, 0.3).detach().numpy(), out.detach().numpy())


def test_feature_dropout_shapes():
    runtime.manual_seed(2)
    y = F.dropout1d(runtime.ones(16, 8, 5, dtype=runtime.float64), 0.5).numpy()
    assert (y == y[..., :1]).all()
    z = F.dropout3d(runtime.ones(2, 8, 2, 2, 2, dtype=runtime.float64), 0.5).numpy().reshape(2, 8, 8)
    assert (z == z[..., :1]).all() and set(np.unique(z)) <= {0.0, 2.0}
    with pytest.raises(RuntimeError, match="dropout1d"):
        F.dropout1d(runtime.ones(2, 3, 4, 5), 0.5)


def test_binary_cross_entropy_edges():
    """At inputs 0 / 1 the loss is torch's (log clamped at -100) and so is the input's gradient, torch's
    (x - t) / max(x(1-x), 1e-12): huge, as a saturated float32 sigmoid gives it, not 0. The target's gradient is
    the clamped logs' difference (torch's is an infinity there)."""
    x = runtime.tensor([0.0, 1.0, 0.0, 1.0], dtype=runtime.float64, requires_grad=True)
    y = runtime.tensor([0.0, 1.0, 0.3, 0.6], dtype=runtime.float64, requires_grad=True)
    loss = F.binary_cross_entropy(x, y, reduction="sum")
    loss.backward()
    np.testing.assert_allclose(loss.item(), 0.3 * 100 + 0.4 * 100)
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0, -0.3e12, 0.4e12])
    np.testing.assert_allclose(y.grad.numpy(), [100.0, -100.0, 100.0, -100.0])


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_binary_cross_entropy_at_saturated_inputs_matches_torch_eager_and_compiled(dtype):
    """Values (float32's -100 clamp is exactly 100, not log of a subnormal floor) and input gradients."""
    import nnc

    p = np.array([1.0, 0.0, 0.3, 1e-44, 1 - 1e-13, 0.999], dtype)
    t = np.array([0.0, 1.0, 0.0, 1.0, 0.2, 0.7], dtype)

    class Loss(runtime.nn.Module):
        def forward(self, x, y):
            return F.binary_cross_entropy(x, y, reduction="none")

    results = []
    for lib, fn in ((torch, torch.nn.functional.binary_cross_entropy), (runtime, Loss()),
                    (runtime, nnc.compile(Loss()))):
        x = lib.tensor(p, requires_grad=True)
        out = fn(x, lib.tensor(t)) if lib is runtime else fn(x, lib.tensor(t), reduction="none")
        out.sum().backward()
        results.append((out.detach().numpy(), x.grad.numpy()))
    for ours in results[1:]:
        np.testing.assert_allclose(ours[0], results[0][0], rtol=1e-6)
        np.testing.assert_allclose(ours[1], results[0][1], rtol=1e-6)


def test_dropout_inplace_and_feature_dropout():
    runtime.manual_seed(1)
    x = runtime.ones(4, 1000, dtype=runtime.float64)
    assert F.dropout(x, 0.5, inplace=True) is x
    assert abs((x.numpy() == 0).mean() - 0.5) < 0.05
    y = F.dropout2d(runtime.ones(64, 32, 3, 3, dtype=runtime.float64), 0.25).numpy()
    per_channel = y.reshape(64, 32, 9)
    assert (per_channel == per_channel[..., :1]).all()  # whole channels are kept or dropped
    assert abs((per_channel[..., 0] == 0).mean() - 0.25) < 0.05


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_dropout_rejects_bad_p(p):
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(runtime.ones(3), p)


def test_sdpa_dropout_runs():
    q = runtime.randn(2, 3, 4)
    assert F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).shape == (2, 3, 4)


# ---------------------------------------------------------------------------------------------
# Argument errors (no torch needed)
# ---------------------------------------------------------------------------------------------

def t(*shape, dtype=runtime.float64):
    return runtime.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: F.mse_loss(t(4, 5), t(3, 5)), RuntimeError, r"\[4, 5\].*\[3, 5\]"),
    (lambda: F.l1_loss(t(4, 5), t(3, 2)), RuntimeError, r"\[4, 5\].*\[3, 2\]"),
    (lambda: F.binary_cross_entropy(t(4, 5), t(5)), ValueError, r"\[5\].*\[4, 5\]"),
    (lambda: F.binary_cross_entropy_with_logits(t(4, 5), t(5)), ValueError, r"\[5\].*\[4, 5\]"),
    (lambda: F.binary_cross_entropy(t(3) + 2, t(3)), RuntimeError, "between 0 and 1"),
    (lambda: F.cross_entropy(t(4, 5), runtime.tensor([0, 1, 2])), ValueError, r"batch_size \(4\).*\(3\)"),
    (lambda: F.nll_loss(t(4, 5, 3), runtime.tensor([0, 1, 2, 1])), RuntimeError, r"target size \[4, 3\], got \[4\]"),
    (lambda: F.cross_entropy(t(4, 5), runtime.tensor([0, 1, 2, 5])), IndexError, "Target 5 is out of bounds"),
    (lambda: F.cross_entropy(t(4, 5), runtime.tensor([0, 1, 2, -1])), IndexError, "Target -1 is out of bounds"),
    (lambda: F.cross_entropy(t(4, 5), t(4, 5), ignore_index=1), RuntimeError, "ignore_index is not supported"),
    (lambda: F.cross_entropy(t(4, 5), runtime.tensor([0, 1, 2, 3]), weight=t(3)), RuntimeError, "all 5 classes"),
    (lambda: F.cross_entropy(t(4, 5), runtime.tensor([0, 1, 2, 3]), label_smoothing=1.5), RuntimeError,
     "label_smoothing"),
    (lambda: F.cross_entropy(t(4, 5), runtime.tensor([0, 1, 2, 3]), reduction="avg"), ValueError,
     "avg is not a valid value for reduction"),
    (lambda: F.nll_loss(t(4, 5), t(4)), RuntimeError, "integer dtype"),
    (lambda: F.conv2d(t(1, 4, 5, 5), t(8, 3, 3, 3)), RuntimeError, "to have 3 channels, but got 4 channels"),
    (lambda: F.conv2d(t(1, 4, 2, 2), t(4, 4, 3, 3)), RuntimeError, r"padded input size per channel: \(2 x 2\)"),
    (lambda: F.conv2d(t(1, 4, 5, 5), t(3, 2, 3, 3), groups=2), RuntimeError, "divisible by 2"),
    (lambda: F.conv2d(t(4, 5), t(3, 4, 3, 3)), RuntimeError, r"3D \(unbatched\) or 4D \(batched\).*\[4, 5\]"),
    (lambda: F.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3), padding="same", stride=2), RuntimeError, "strided"),
    (lambda: F.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3), padding="full"), RuntimeError, "Invalid padding string"),
    (lambda: F.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3), bias=t(3)), RuntimeError, "bias"),
    (lambda: F.conv1d(t(1, 3, 5), t(4, 3, 3), stride=0), RuntimeError, "non-positive stride"),
    (lambda: F.max_pool2d(t(1, 1, 5, 5), 3, padding=2), RuntimeError, "at most half"),
    (lambda: F.max_pool2d(t(1, 1, 2, 2), 3), RuntimeError, "Output size is too small"),
    (lambda: F.avg_pool2d(t(5, 5), 2), RuntimeError, r"3D or 4D"),
    (lambda: F.layer_norm(t(2, 3), (4,)), RuntimeError, r"normalized_shape=\[4\].*\[2, 3\]"),
    (lambda: F.batch_norm(t(1, 3), None, None, training=True), ValueError, "more than 1 value per channel"),
    (lambda: F.batch_norm(t(2, 3), None, None, training=False), RuntimeError, "evaluation mode"),
    (lambda: F.batch_norm(t(2, 3), t(4), t(4)), RuntimeError, "running_mean should contain 3 elements"),
    (lambda: F.group_norm(t(2, 6, 3), 4), RuntimeError, "divisible by num_groups"),
    (lambda: F.embedding(t(2), t(3, 3)), RuntimeError, "Long, Int"),
    (lambda: F.embedding(runtime.tensor([1]), t(3, 3), padding_idx=5), AssertionError, "Padding_idx"),
    (lambda: F.embedding(runtime.tensor([1, -1]), t(3, 3)), IndexError, "index out of range.*-1"),
    (lambda: F.embedding(runtime.tensor([[3]]), t(3, 3)), IndexError, "index out of range.*3"),
    (lambda: F.pad(t(3), (1, 2, 3)), RuntimeError, "divisible by 2"),
    (lambda: F.pad(t(3), (1, 2, 3, 4)), RuntimeError, "Padding length should be less"),
    (lambda: F.pad(t(1, 3), (3, 0), mode="reflect"), RuntimeError, "Padding size should be less"),
    (lambda: F.gelu(t(3), approximate="fast"), ValueError, "approximate"),
    (lambda: F.glu(t(3, 5)), RuntimeError, "Halving dimension must be even"),
    (lambda: F.scaled_dot_product_attention(t(2, 3, 4), t(2, 3, 4), t(2, 3, 4),
                                            attn_mask=t(3, 3, dtype=runtime.bool), is_causal=True),
     RuntimeError, "is_causal"),
    (lambda: F.scaled_dot_product_attention(t(2, 3, 4), t(2, 5, 3), t(2, 5, 4)), RuntimeError,
     r"query \[2, 3, 4\], key \[2, 5, 3\]"),
    (lambda: F.linear(t(2, 3), t(4, 5)), RuntimeError, "cannot be multiplied"),
])
def test_argument_errors(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()
