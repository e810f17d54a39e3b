"""runtime.sparse: COO tensors give torch's dense forms, coalesced indices and values, products with dense matrices
and their gradients (to the dense operand and the sparse values), mixed sums, and a GCN with a sparse adjacency
(pygcn's shape) trains as torch's does."""
from __future__ import annotations

import numpy as np
import pytest

import runtime

from helpers import needs_torch

INDICES = [[0, 2, 2, 1, 0], [1, 0, 0, 2, 1]]  # repeated positions: (2, 0) and (0, 1) twice
VALUES = [1.0, 2.0, 3.0, -1.5, 0.5]


def _sparse(lib, requires_grad=False):
    return lib.sparse_coo_tensor(INDICES, lib.tensor(VALUES, dtype=lib.float64), (3, 3), requires_grad=requires_grad)


@needs_torch
def test_dense_form_and_coalescing_match_torch(torch):
    ours, theirs = _sparse(runtime), _sparse(torch)
    np.testing.assert_array_equal(ours.to_dense().numpy(), theirs.to_dense().numpy())
    a, b = ours.coalesce(), theirs.coalesce()
    assert a.is_coalesced() and not ours.is_coalesced() and a._nnz() == b._nnz() == 3
    np.testing.assert_array_equal(a.indices().numpy(), b.indices().numpy())
    np.testing.assert_array_equal(a.values().numpy(), b.values().numpy())
    with pytest.raises(RuntimeError, match="uncoalesced"):
        ours.indices()
    assert ours.layout is runtime.sparse_coo and runtime.ones(1).layout is runtime.strided
    assert ours.is_sparse and not runtime.ones(1).is_sparse and tuple(ours.shape) == (3, 3)


@needs_torch
@pytest.mark.parametrize("spelling", ["mm", "spmm", "matmul", "operator", "sparse.mm", "dense_first"])
def test_products_with_dense_matrices_and_their_gradients_match_torch(torch, spelling):
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((3, 4))
    results = []
    for lib in (runtime, torch):
        s, d = _sparse(lib, requires_grad=True), lib.tensor(dense, requires_grad=True)
        if spelling == "dense_first":
            out = lib.tensor(dense.T.copy()).requires_grad_(True)
            d = out
            out = d @ s
        elif spelling == "operator":
            out = s @ d
        elif spelling == "sparse.mm":
            out = lib.sparse.mm(s, d)
        else:
            out = getattr(lib, spelling)(s, d)
        (out * lib.tensor(np.arange(out.numel(), dtype=np.float64).reshape(out.shape))).sum().backward()
        # torch gives the sparse operand a dense gradient; runtime's is one per stored value, the same numbers
        values_grad = s._values().grad if lib is runtime else s.grad.to_dense()[tuple(lib.tensor(INDICES))]
        results.append((out.detach().numpy(), d.grad.numpy(), values_grad.numpy()))
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_torch
def test_sums_with_dense_and_sparse_tensors_match_torch(torch):
    rng = np.random.default_rng(1)
    dense = rng.standard_normal((3, 3))
    outs = []
    for lib in (runtime, torch):
        s, d = _sparse(lib), lib.tensor(dense)
        outs.append([d + s, (s + s).to_dense(), (s * 2.0).to_dense(), lib.eye(3, dtype=lib.float64) - s,
                     lib.sparse.sum(s), (s * d).to_dense(), (d * s).to_dense()])
        with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
            s + d
        assert (d * s).layout == lib.sparse_coo
    for got, want in zip(*outs):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)


@needs_torch
def test_to_sparse_and_the_gat_examples_data_path_match_torch(torch):
    """pytorch/examples' GAT loading: a diagonal scaling made sparse times the features, and self-loops added to
    an int64 COO adjacency."""
    rng = np.random.default_rng(2)
    features = (rng.random((5, 4)) > 0.6).astype(np.float32)
    edges = np.array([[0, 1], [1, 2], [3, 4], [4, 0]])
    outs = []
    for lib in (runtime, torch):
        x = lib.tensor(features)
        scale = 1 / x.sum(1)
        scale[scale == float("inf")] = 0
        scaled = lib.diag(scale).to_sparse() @ x
        adj = lib.sparse_coo_tensor(edges.T, lib.ones(len(edges)), (5, 5), dtype=lib.int64)
        outs.append([scaled, lib.eye(5) + adj])
    for got, want in zip(*outs):
        assert got.dtype.is_floating_point and str(got.dtype).split(".")[-1] == str(want.dtype).split(".")[-1]
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def test_bad_construction_names_what_is_wrong():
    with pytest.raises(RuntimeError, match="same nnz"):
        runtime.sparse_coo_tensor([[0, 1]], [1.0, 2.0, 3.0], (2,))
    with pytest.raises(RuntimeError, match="size is inconsistent with indices: for dim 0, size is 2"):
        runtime.sparse_coo_tensor([[0, 5]], [1.0, 2.0], (2,))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        runtime.spmm(_sparse(runtime), runtime.ones(2, 2, dtype=runtime.float64))


def _gcn_step_losses(lib, adjacency, features, labels, weights):
    """Three Adam steps of pygcn's two-layer GCN: relu(A X W1) then log_softmax(A H W2)."""
    w1, w2 = (lib.tensor(w, requires_grad=True) for w in weights)
    optimizer = lib.optim.Adam([w1, w2], lr=0.05)
    adj = lib.sparse.FloatTensor(lib.tensor(adjacency[0]), lib.tensor(adjacency[1]), lib.Size(adjacency[2]))
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        hidden = lib.relu(lib.spmm(adj, lib.tensor(features) @ w1))
        out = lib.nn.functional.log_softmax(lib.spmm(adj, hidden @ w2), dim=1)
        loss = lib.nn.functional.nll_loss(out, lib.tensor(labels))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, w1.detach().numpy()


@needs_torch
def test_a_gcn_with_a_sparse_adjacency_trains_as_torchs(torch):
    rng = np.random.default_rng(3)
    n = 6
    rows = np.array([0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5])
    cols = np.array([0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 0])
    adjacency = (np.stack([rows, cols]), np.full(len(rows), 0.5, np.float32), (n, n))
    features = rng.standard_normal((n, 4)).astype(np.float32)
    labels = rng.integers(0, 3, n)
    weights = [rng.standard_normal((4, 8)).astype(np.float32) * 0.5, rng.standard_normal((8, 3)).astype(np.float32)]
    ours = _gcn_step_losses(runtime, adjacency, features, labels, weights)
    theirs = _gcn_step_losses(torch, adjacency, features, labels, weights)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sparse_dim", [3, 2])
@pytest.mark.parametrize("dim", [1, (0, 2), (0, 1), -1, (1, 2)])
def test_sparse_sum_over_some_dims_is_sparse_as_torchs(torch, sparse_dim, dim):
    """Summing some sparse dims keeps a sparse tensor of the others (duplicates added up); summing them all gives
    the dense tensor of the dense dims left. Values, layout and the gradient of the dense source match torch."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4, 2))
    a[a < 0.3] = 0
    results = []
    for lib in (runtime, torch):
        source = lib.tensor(a, requires_grad=True)
        out = lib.sparse.sum(source.to_sparse(sparse_dim), dim=dim)
        dense = out.to_dense()
        (dense * lib.arange(1, dense.numel() + 1, dtype=lib.float64).reshape(dense.shape)).sum().backward()
        results.append((out.is_sparse, dense.detach().numpy(), source.grad.numpy()))
    assert results[0][0] == results[1][0]
    np.testing.assert_allclose(results[0][1], results[1][1])
    np.testing.assert_allclose(results[0][2], results[1][2])


def test_a_dense_tensor_is_its_own_dense_form():
    x = runtime.randn(2, 3)
    assert x.to_dense() is x and x.to_dense(runtime.float64).dtype is runtime.float64
