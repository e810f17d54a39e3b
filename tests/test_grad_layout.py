"""Input gradients of convolution, pooling, padding and unfold, and convolutions' outputs, come back C-contiguous as
torch's, eager and compiled."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import runtime
import runtime.nn as nn

from helpers import needs_torch, torch

RNG = np.random.default_rng(0)
WEIGHTS = {shape: RNG.standard_normal(shape) for shape in [(4, 3, 4, 4), (4, 3, 3), (2, 3, 3, 3, 3), (3, 4, 3, 2)]}


def _conv(nd, shape, **kw):
    return lambda lib, x: getattr(lib.nn.functional, f"conv{nd}d")(x, lib.tensor(WEIGHTS[shape]), **kw)


def _f(name, *args, **kw):
    return lambda lib, x: getattr(lib.nn.functional, name)(x, *args, **kw)


# name: (function of (library, input), input shape); every gradient torch returns here is C-contiguous
EAGER_CASES = {
    "conv2d padded, strided": (_conv(2, (4, 3, 4, 4), stride=2, padding=1), (2, 3, 8, 8)),
    "conv1d padded, dilated": (_conv(1, (4, 3, 3), padding=2, dilation=2), (2, 3, 7)),
    "conv3d padded": (_conv(3, (2, 3, 3, 3, 3), padding=1), (1, 3, 4, 5, 3)),
    "max_pool2d padded": (_f("max_pool2d", 3, 2, 1), (2, 3, 7, 8)),
    "max_pool2d ceil_mode": (_f("max_pool2d", 2, 2, ceil_mode=True), (2, 3, 7, 7)),
    "max_pool2d with indices": (lambda lib, x: lib.nn.functional.max_pool2d(x, 3, 2, 1, return_indices=True)[0],
                                (2, 3, 7, 8)),
    "max_pool1d padded, dilated": (_f("max_pool1d", 3, 1, 1, dilation=2), (2, 3, 9)),
    "avg_pool2d padded": (_f("avg_pool2d", 3, 2, 1), (2, 3, 7, 8)),
    "avg_pool2d ceil_mode": (_f("avg_pool2d", 3, 2, ceil_mode=True), (2, 3, 8, 8)),
    "unfold padded": (_f("unfold", 3, padding=1, stride=2), (2, 3, 6, 7)),
    "pad": (_f("pad", (1, 2, 3, 4)), (2, 3, 5, 6)),
    "pad with a value": (_f("pad", (1, 2), value=1.5), (2, 3, 5)),
    "pad that crops": (_f("pad", (-1, 2, 1, -2)), (2, 3, 5, 6)),
    "conv_transpose2d": (lambda lib, x: lib.nn.functional.conv_transpose2d(x, lib.tensor(WEIGHTS[(3, 4, 3, 2)]),
                                                                             stride=2, padding=1, output_padding=1),
                         (2, 3, 5, 4)),
}


def _input_grad(lib, fn, x: np.ndarray):
    """The gradient of sum(fn(x) * seed) for x, from `lib`'s autograd.grad."""
    xt = lib.tensor(x, requires_grad=True)
    out = fn(lib, xt)
    seed = lib.tensor(np.linspace(-1, 1, out.numel()).reshape(tuple(out.shape)))
    return lib.autograd.grad((out * seed).sum(), xt)[0]


@needs_torch
@pytest.mark.parametrize("name", EAGER_CASES)
def test_input_gradient_has_torch_layout(name):
    fn, shape = EAGER_CASES[name]
    x = RNG.standard_normal(shape)
    ours, theirs = _input_grad(runtime, fn, x), _input_grad(torch, fn, x)
    assert ours.is_contiguous() and ours.stride() == theirs.stride()
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-10, atol=1e-12)
    assert tuple(ours.view(shape[0], -1).shape) == (shape[0], int(np.prod(shape[1:])))


@needs_torch
@pytest.mark.parametrize("name", [n for n in EAGER_CASES if n.startswith("conv")])
def test_convolution_output_has_torch_layout(name):
    # a classifier's `conv(x).view(b, -1)` raised: the output was the product's layout transposed
    fn, shape = EAGER_CASES[name]
    x = RNG.standard_normal(shape)
    ours, theirs = fn(runtime, runtime.tensor(x)), fn(torch, torch.tensor(x))
    sized = [d for d in range(ours.ndim) if ours.shape[d] > 1]  # (a size-1 dim's stride is never used)
    assert ours.is_contiguous() and [ours.stride(d) for d in sized] == [theirs.stride(d) for d in sized]
    assert tuple(ours.view(ours.shape[0], -1).shape) == (ours.shape[0], ours[0].numel())


@needs_torch
def test_gradient_penalty_views_the_input_gradient():
    """WGAN-GP's penalty: the input gradient of a padded convolution, taken with create_graph, viewed per sample."""
    runtime.manual_seed(0)
    conv = nn.Conv2d(3, 8, 4, 2, 1).double()
    reference = torch.nn.Conv2d(3, 8, 4, 2, 1).double()
    with torch.no_grad():
        reference.weight.copy_(torch.from_numpy(conv.weight.detach().numpy()))
        reference.bias.copy_(torch.from_numpy(conv.bias.detach().numpy()))
    x = RNG.standard_normal((4, 3, 16, 16))
    for lib, layer in ((runtime, conv), (torch, reference)):
        xt = lib.tensor(x, requires_grad=True)
        g = lib.autograd.grad(layer(xt).sum(), xt, create_graph=True)[0]
        assert g.is_contiguous() and g.stride() == (768, 256, 16, 1)
        ((g.view(4, -1).norm(2, dim=1) - 1) ** 2).mean().backward()
    np.testing.assert_allclose(conv.weight.grad.numpy(), reference.weight.grad.numpy(), rtol=1e-10, atol=1e-12)


@needs_torch
@pytest.mark.parametrize("pad", [(0, 0), (-1, -1), (1, -1)])
def test_pad_returns_a_new_tensor(pad):
    """As torch's, even when it pads nothing or only crops: a write to the result leaves the input as it was."""
    for lib in (runtime, torch):
        x = lib.zeros(2, 4)
        y = lib.nn.functional.pad(x, pad)
        y[0, 0] = 1.0
        assert float(x.abs().sum()) == 0.0 and y.is_contiguous()


class _Apply(nn.Module):
    """A module of one function of its input (and, for convolutions, a weight parameter)."""

    def __init__(self, fn, weight_shape=None):
        super().__init__()
        self.fn = fn
        self.weight = nn.Parameter(runtime.tensor(WEIGHTS[weight_shape])) if weight_shape else None

    def forward(self, x):
        return self.fn(x) if self.weight is None else self.fn(x, self.weight)


F = runtime.nn.functional
COMPILED_CASES = {
    "conv2d padded": (lambda x, w: F.conv2d(x, w, stride=2, padding=1), (4, 3, 4, 4), (2, 3, 8, 8)),
    "max_pool2d padded": (lambda x: F.max_pool2d(x, 3, 2, 1), None, (2, 3, 7, 8)),
    "pad": (lambda x: F.pad(x, (1, 2, 3, 4)), None, (2, 3, 5, 6)),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1), (3, 4, 3, 2), (2, 3, 5, 4)),
    "fold": (lambda x: F.fold(x, (4, 5), 2, padding=1), None, (2, 12, 30)),
}


@pytest.mark.parametrize("name", COMPILED_CASES)
def test_compiled_input_gradient_is_contiguous(name):
    import nnc

    fn, weight_shape, shape = COMPILED_CASES[name]
    model = _Apply(fn, weight_shape)
    x = RNG.standard_normal(shape)
    want = _input_grad(runtime, lambda lib, t: model(t), x)
    compiled = nnc.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager would not test the compiled backward
        got = _input_grad(runtime, lambda lib, t: compiled(t), x)
    assert got.is_contiguous() and tuple(got.view(shape[0], -1).shape) == (shape[0], int(np.prod(shape[1:])))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
