"""Helpers that several test modules share: the optional torch oracle and its skip marker, dtype names, a call of a
primitive in a hand-built graph, compiled-vs-eager checks, and work run from several threads."""
from __future__ import annotations

import pytest

try:
    import torch
except ImportError:  # the oracle is optional: tests that compare with it skip, the rest still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle) is not installed")


def require_torch():
    """The real torch; where it is not installed, skips the calling test from here on (checks made before stand).
    A test that needs torch from its start takes the `torch` fixture (conftest.py) instead."""
    if torch is None:
        pytest.skip("torch (the oracle) is not installed")
    return torch


def dname(dtype) -> str:
    """'float32' for runtime.float32 and torch.float32 alike."""
    return str(dtype).split(".")[-1]


def call(g, name, *args, **attrs):
    """A call_function node of the primitive `name` in graph g (attrs become its kwargs)."""
    from nnc.prims import prims

    return g.call_function(prims[name], args, attrs)


def compiled_matches_eager(model, *inputs, tol=1e-12):
    """nnc.compile(model) against model itself: outputs and parameter gradients (under a fixed linspace seed) agree
    to `tol`, and the compiled call neither falls back to eager nor interprets a kernel that failed to compile (a
    warning fails it). Returns the compiled module."""
    import warnings

    import numpy as np

    import nnc
    import runtime

    compiled = nnc.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = compiled(*inputs)
    seed = runtime.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * seed).sum().backward()
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    want = model(*inputs)
    (want * seed).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=tol, atol=tol)
    for got, p in zip(grads, model.parameters()):
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=tol, atol=tol)
    return compiled


def kernels_of(compiled) -> list:
    """Every kernel of every plan a compiled module made."""
    return [k for c in compiled.compilations for p in c.plans for k in p.kernels]


def run_in_threads(work, count: int) -> None:
    """work(k) on `count` threads at once, k = 0 .. count-1; re-raises the first exception any of them raised (an
    exception in a thread is otherwise only printed, and the test would pass)."""
    import threading

    errors = []

    def guarded(k):
        try:
            work(k)
        except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def whole_graph_forward(model, x):
    """(compiled module, its no_grad output, eager's) for x, the compiled call with warnings as errors; asserts that
    the forward ran as one numba function wherever whole-graph mode is available."""
    import warnings

    import nnc
    import runtime
    from nnc.codegen import whole_graph

    compiled = nnc.compile(model)
    with runtime.no_grad():
        want = model(x).numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = compiled(x).numpy()
    (artifact,) = compiled._cache.values()
    assert artifact.forward_plan.whole_graph or not whole_graph._HAVE_SCIPY, artifact.forward_plan.whole_graph_reason
    return compiled, got, want
