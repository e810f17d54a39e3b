"""Saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks): what they see, what backward reads, scoping."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.autograd.graph import disable_saved_tensors_hooks, save_on_cpu, saved_tensors_hooks

from helpers import needs_torch, torch


def test_hooks_see_every_saved_tensor_and_backward_reads_what_unpack_returns():
    log = []
    x = runtime.randn(3, dtype=runtime.float64, requires_grad=True)
    with saved_tensors_hooks(lambda t: log.append("pack") or t * 0 + 2, lambda t: log.append("unpack") or t):
        y = (x * x).sum()
    assert log == ["pack", "pack"]
    y.backward()
    assert log == ["pack", "pack", "unpack", "unpack"]
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 4.0))  # d(x*x) read as 2 * 2 from the packed values


@needs_torch
def test_pack_counts_match_torch():
    def program(lib, x):
        h = (x.exp() * x).tanh()
        return (h @ h.T).sigmoid().sum()

    counts = []
    for lib in (runtime, torch):
        log = []
        x = lib.randn(3, 4, dtype=lib.float64, requires_grad=True)
        with lib.autograd.graph.saved_tensors_hooks(lambda t: log.append(tuple(t.shape)) or t, lambda t: t):
            program(lib, x)
        counts.append(sorted(log))
    assert counts[0] == counts[1]


def test_custom_function_saves_through_the_hooks():
    class Cube(runtime.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x * x * g

    log = []
    x = runtime.randn(4, dtype=runtime.float64, requires_grad=True)
    with saved_tensors_hooks(lambda t: log.append("pack") or t.clone(), lambda t: log.append("unpack") or t):
        y = Cube.apply(x).sum()
    y.backward()
    assert log == ["pack", "unpack"]
    np.testing.assert_allclose(x.grad.numpy(), 3 * x.detach().numpy() ** 2, rtol=1e-12)


def test_unpack_must_return_a_tensor_of_the_saved_shape():
    x = runtime.randn(3, dtype=runtime.float64, requires_grad=True)
    with saved_tensors_hooks(lambda t: t, lambda t: "not a tensor"):
        y = x.exp().sum()
    with pytest.raises(TypeError, match="unpack_hook expected to be a Tensor"):
        y.backward()
    with saved_tensors_hooks(lambda t: t, lambda t: t[:2]):
        y = x.exp().sum()
    with pytest.raises(RuntimeError, match="shape"):
        y.backward()


def test_innermost_hooks_apply_and_hooks_are_per_thread():
    import threading

    outer, inner, other = [], [], []
    x = runtime.randn(3, requires_grad=True)
    with saved_tensors_hooks(lambda t: outer.append(1) or t, lambda t: t):
        with saved_tensors_hooks(lambda t: inner.append(1) or t, lambda t: t):
            x.exp()
            thread = threading.Thread(target=lambda: other.append(x.exp().grad_fn.packed))
            thread.start()
            thread.join()
        x.sin()
    assert (len(outer), len(inner), other) == (1, 1, [None])


def test_disable_saved_tensors_hooks_refuses_new_hooks():
    with disable_saved_tensors_hooks("no hooks here"):
        with pytest.raises(RuntimeError, match="no hooks here"):
            with saved_tensors_hooks(lambda t: t, lambda t: t):
                pass
    with saved_tensors_hooks(lambda t: t, lambda t: t):  # allowed again after the block
        pass


def test_save_on_cpu_gives_the_same_gradients():
    x = runtime.randn(5, dtype=runtime.float64, requires_grad=True)
    with save_on_cpu():
        y = (x.sin() * x.exp()).sum()
    y.backward()
    got = x.grad.clone()
    x.grad = None
    (x.sin() * x.exp()).sum().backward()
    np.testing.assert_array_equal(got.numpy(), x.grad.numpy())
