"""scatter_reduce with amax/amin: values and gradients equal torch's, ties included (the gradient of a result is
spread evenly over the entries equal to it), and a graph-attention layer whose scatter softmax takes the max of
each node's scores without detaching it compiles whole and trains as eagerly."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import nnc
import runtime
import runtime.nn as nn
import runtime.nn.functional as F

from helpers import needs_torch


def _scatter(lib, x, src, index, dim, reduce, include_self):
    a, b = lib.tensor(x, requires_grad=True), lib.tensor(src, requires_grad=True)
    out = a.scatter_reduce(dim, lib.tensor(index), b, reduce=reduce, include_self=include_self)
    (out * lib.tensor(np.arange(out.numel(), dtype=np.float64).reshape(out.shape))).sum().backward()
    return out.detach().numpy(), a.grad.numpy(), b.grad.numpy()


@needs_torch
@pytest.mark.parametrize("reduce,include_self,dim", list(itertools.product(["amax", "amin"], [True, False], [0, 1])))
def test_values_and_gradients_with_ties_match_torch(torch, reduce, include_self, dim):
    rng = np.random.default_rng(dim + 2 * include_self)
    x = rng.integers(-2, 3, (4, 5)).astype(np.float64)  # few distinct values: many ties
    src = rng.integers(-2, 3, (3, 5)).astype(np.float64)
    index = rng.integers(0, x.shape[dim], (3, 5))
    ours = _scatter(runtime, x, src, index, dim, reduce, include_self)
    theirs = _scatter(torch, x, src, index, dim, reduce, include_self)
    for got, want, what in zip(ours, theirs, ("values", "input gradient", "source gradient")):
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=what)


@needs_torch
@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
def test_integer_and_bool_values_match_torch(torch, dtype):
    rng = np.random.default_rng(3)
    x, src = rng.integers(-3, 4, (3, 4)).astype(dtype), rng.integers(-3, 4, (2, 4)).astype(dtype)
    index = np.array([[0, 2, 2, 1], [1, 2, 0, 0]])
    for reduce, include_self in itertools.product(["amax", "amin"], [True, False]):
        got = runtime.tensor(x).scatter_reduce(0, runtime.tensor(index), runtime.tensor(src), reduce,
                                               include_self=include_self)
        want = torch.tensor(x).scatter_reduce(0, torch.tensor(index), torch.tensor(src), reduce,
                                              include_self=include_self)
        np.testing.assert_array_equal(got.numpy(), want.numpy())


class GraphAttention(nn.Module):
    """One GAT layer over an edge list: scores per edge, a softmax over each node's incoming edges (max by
    scatter_reduce amax, sums by index_add), and the weighted sum of the neighbours' features."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6, bias=False)
        self.attend = nn.Parameter(runtime.randn(12))

    def forward(self, x, src, dst):
        h = self.proj(x)
        scores = F.leaky_relu(runtime.cat([h[src], h[dst]], -1) @ self.attend, 0.2)
        top = runtime.full((x.shape[0],), -1e9).scatter_reduce(0, dst, scores, reduce="amax")
        weights = runtime.exp(scores - top[dst])
        alpha = weights / runtime.zeros(x.shape[0]).index_add(0, dst, weights)[dst]
        return runtime.zeros_like(h).index_add(0, dst, alpha.unsqueeze(-1) * h[src])


def test_a_graph_attention_layer_compiles_whole_and_matches_eager():
    runtime.manual_seed(0)
    model = GraphAttention()
    rng = np.random.default_rng(1)
    x = runtime.randn(8, 6)
    src, dst = runtime.tensor(rng.integers(0, 8, 20)), runtime.tensor(rng.integers(0, 8, 20))
    compiled = nnc.compile(model)
    results = []
    for fn in (model, compiled):
        model.zero_grad()
        out = fn(x, src, dst)
        out.square().sum().backward()
        results.append([out.detach().numpy()] + [p.grad.numpy().copy() for p in model.parameters()])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (artifact,) = compiled._cache.values()
    assert type(artifact).__name__ == "Compilation" and not artifact.opaque and artifact.split is None
