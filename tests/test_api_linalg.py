"""runtime.linalg against torch.linalg: values, gradients (float64) and errors; gradients also by finite
differences (symmetric matrices are perturbed symmetrically, the inputs those functions are defined on)."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.autograd import gradcheck

rng = np.random.default_rng(3)


def spd(*batch, n=3):
    a = rng.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def G(*shape):
    return rng.standard_normal(shape)


CASES = {
    "inv": (lambda L, a: L.linalg.inv(a), [spd(2)]),
    "det": (lambda L, a: L.linalg.det(a), [G(2, 3, 3)]),
    "slogdet": (lambda L, a: L.linalg.slogdet(a), [G(3, 3)]),
    "logdet": (lambda L, a: L.logdet(a), [spd()]),
    "solve": (lambda L, a, b: L.linalg.solve(a, b), [spd(2), G(2, 3, 2)]),
    "solve_vector": (lambda L, a, b: L.linalg.solve(a, b), [spd(), G(3)]),
    "solve_right": (lambda L, a, b: L.linalg.solve(a, b, left=False), [spd(), G(2, 3)]),
    "cholesky": (lambda L, a: L.linalg.cholesky(a), [spd(2)]),
    "cholesky_upper": (lambda L, a: L.linalg.cholesky(a, upper=True), [spd()]),
    "eigvalsh": (lambda L, a: L.linalg.eigvalsh(a), [spd(2)]),
    "eigh": (lambda L, a: L.linalg.eigh(a), [spd()]),
    "vector_norm": (lambda L, a: L.linalg.vector_norm(a, 3.0, dim=1) + L.linalg.vector_norm(a, float("inf"), 1),
                    [G(3, 4)]),
    "matrix_norm": (lambda L, a: L.linalg.matrix_norm(a) + L.linalg.matrix_norm(a, 1)
                    + L.linalg.matrix_norm(a, -np.inf), [G(2, 3, 4)]),
    "norm": (lambda L, a: L.linalg.norm(a) + L.linalg.norm(a[0]) + L.linalg.norm(a, dim=(0, 1)), [G(3, 4)]),
    "matrix_power": (lambda L, a: L.linalg.matrix_power(a, 3) + L.linalg.matrix_power(a, -2), [spd()]),
    "multi_dot": (lambda L, a, b, c: L.linalg.multi_dot([a, b, c]), [G(2, 3), G(3, 4), G(4, 2)]),
    "vecdot_cross": (lambda L, a, b: L.linalg.vecdot(a, b) + L.linalg.cross(a, b).sum(-1), [G(4, 3), G(4, 3)]),
}
NO_GRAD = {
    "qr": (lambda L, a: L.linalg.qr(a), [G(4, 3)]),
    "svdvals": (lambda L, a: L.linalg.svdvals(a), [G(4, 3)]),
    "svd_rebuilds": (lambda L, a: (lambda u, s, vh: u @ L.diag_embed(s) @ vh)(*L.linalg.svd(a, full_matrices=False)),
                     [G(4, 3)]),
    "pinv": (lambda L, a: L.linalg.pinv(a), [G(4, 3)]),
    "matrix_rank": (lambda L, a: L.linalg.matrix_rank(a), [G(4, 3) @ G(3, 5)]),
    # tolerances: singular values 10, 1, 0.05; atol alone sets rtol to 0, rcond and tol are the older positionals
    "pinv_atol": (lambda L, a: L.linalg.pinv(a, atol=0.1), [np.diag([10.0, 1.0, 0.05])]),
    "pinv_atol_and_rtol": (lambda L, a: L.linalg.pinv(a, atol=0.1, rtol=0.5), [np.diag([10.0, 1.0, 0.05])]),
    "pinv_rcond_hermitian": (lambda L, a: L.linalg.pinv(a, 0.2, True) + L.linalg.pinv(a, 0.01),
                             [np.diag([10.0, 1.0, 0.05])]),
    "pinv_batched_atol": (lambda L, a: L.linalg.pinv(a, atol=L.tensor([0.0, 1.5], dtype=L.float64)), [G(2, 4, 3)]),
    "pinv_hermitian": (lambda L, a: L.linalg.pinv(a, hermitian=True), [spd()]),
    "matrix_rank_tolerances": (lambda L, a: L.stack([L.linalg.matrix_rank(a, 0.5), L.linalg.matrix_rank(a, 0.04),
                                                     L.linalg.matrix_rank(a, atol=0.5),
                                                     L.linalg.matrix_rank(a, rtol=0.5),
                                                     L.linalg.matrix_rank(a, hermitian=True)]),
                               [np.diag([10.0, 1.0, 0.05])]),
    "matrix_exp": (lambda L, a: L.linalg.matrix_exp(a), [G(2, 3, 3)]),
    "nuclear": (lambda L, a: L.linalg.matrix_norm(a, "nuc") + L.linalg.matrix_norm(a, 2), [G(3, 4)]),
}


def _flat(r):
    return [y for x in r for y in _flat(x)] if isinstance(r, (tuple, list)) else [r]


def _run(lib, call, inputs, grad):
    tensors = [lib.tensor(a).requires_grad_(grad) for a in inputs]
    return tensors, _flat(call(lib, *tensors))


@pytest.mark.parametrize("name", sorted(CASES) + sorted(NO_GRAD))
def test_matches_torch(name, torch):
    call, inputs = CASES.get(name) or NO_GRAD[name]
    grad = name in CASES
    ours_in, ours = _run(runtime, call, inputs, grad)
    theirs_in, theirs = _run(torch, call, inputs, grad)
    for a, b in zip(ours, theirs):
        assert tuple(a.shape) == tuple(b.shape) and a.dtype.name == str(b.dtype).removeprefix("torch.")
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-9, atol=1e-10)
    if grad:
        seeds = [rng.standard_normal(tuple(b.shape)) for b in theirs]
        keep = [k for k, b in enumerate(theirs) if b.requires_grad]
        go = runtime.autograd.grad(sum((ours[k] * runtime.tensor(seeds[k])).sum() for k in keep), ours_in)
        gt = torch.autograd.grad(sum((theirs[k] * torch.tensor(seeds[k])).sum() for k in keep), theirs_in)
        for a, b in zip(go, gt):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-8, atol=1e-9)


SYMMETRIC = {"cholesky", "cholesky_upper", "eigvalsh", "eigh", "logdet"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_by_finite_differences(name):
    call, inputs = CASES[name]
    tensors = [runtime.tensor(a, requires_grad=True) for a in inputs]
    if name in SYMMETRIC:  # perturb the symmetric part only: these functions are defined on symmetric matrices
        def fn(*ts):
            return tuple(y for y in _flat(call(runtime, *[(t + t.mT) / 2 for t in ts])) if y.requires_grad)
    else:
        def fn(*ts):
            return tuple(y for y in _flat(call(runtime, *ts)) if y.requires_grad)
    assert gradcheck(fn, tuple(tensors))


def test_errors():
    with pytest.raises(RuntimeError, match="square matrices"):
        runtime.linalg.inv(runtime.ones(2, 3, dtype=runtime.float64))
    with pytest.raises(RuntimeError, match="not invertible|could not be completed"):
        runtime.linalg.inv(runtime.zeros(2, 2, dtype=runtime.float64))
    with pytest.raises(RuntimeError, match="positive-definite"):
        runtime.linalg.cholesky(-runtime.eye(2, dtype=runtime.float64))
    with pytest.raises(RuntimeError, match="floating point"):
        runtime.linalg.det(runtime.ones(2, 2, dtype=runtime.int64))
    with pytest.raises(RuntimeError, match="no derivative rule"):
        runtime.linalg.svd(runtime.ones(2, 2, requires_grad=True))


def test_lu_family_and_tensor_solvers(torch):
    a, b = G(2, 3, 3), G(2, 3, 2)
    for name in ("lu_factor", "lu"):
        for x, y in zip(getattr(runtime.linalg, name)(runtime.tensor(a)), getattr(torch.linalg, name)(torch.tensor(a))):
            assert x.dtype.name == str(y.dtype).removeprefix("torch.")
            np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-12, atol=1e-12)
    LU, piv = torch.linalg.lu_factor(torch.tensor(a))
    ours = runtime.linalg.lu_solve(runtime.tensor(LU.numpy()), runtime.tensor(piv.numpy()), runtime.tensor(b))
    np.testing.assert_allclose(ours.numpy(), torch.linalg.lu_solve(LU, piv, torch.tensor(b)).numpy(), rtol=1e-10)
    t = G(6, 2, 3)
    np.testing.assert_allclose(runtime.linalg.tensorinv(runtime.tensor(t), 1).numpy(),
                               torch.linalg.tensorinv(torch.tensor(t), 1).numpy(), rtol=1e-10)
    s, r = G(2, 3, 6), G(2, 3)
    np.testing.assert_allclose(runtime.linalg.tensorsolve(runtime.tensor(s), runtime.tensor(r)).numpy(),
                               torch.linalg.tensorsolve(torch.tensor(s), torch.tensor(r)).numpy(), rtol=1e-10)


def test_cholesky_of_a_non_symmetric_matrix_reads_its_lower_triangle_as_torch(torch):
    """LAPACK's factorization, so torch's, reads only the lower triangle: the upper one never changes the factor,
    and the gradient is torch's symmetric one on both triangles."""
    a = spd() + np.triu(G(3, 3), 1)  # a symmetric positive-definite lower triangle, anything above it
    weight = G(3, 3)
    results = []
    for lib in (torch, runtime):
        x = lib.tensor(a, requires_grad=True)
        factor = lib.linalg.cholesky(x)
        (factor * lib.tensor(weight)).sum().backward()
        results.append((factor.detach().numpy(), x.grad.numpy()))
    (want, want_grad), (got, got_grad) = results
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, np.linalg.cholesky(np.tril(a) + np.tril(a, -1).T), rtol=1e-12)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("a_shape,b_shape", [((5, 3), (5, 2)), ((5, 3), (5,)), ((2, 5, 3), (2, 5, 2)),
                                             ((3, 4), (3, 2)), ((2, 3, 4), (2, 3))])
def test_lstsq_returns_what_each_torch_driver_returns(torch, driver, a_shape, b_shape):
    """The solution, and beside it residuals, rank and singular values exactly where torch's CPU driver gives them
    (tall and wide systems, batches, a vector right-hand side)."""
    a, b = G(*a_shape), G(*b_shape)
    want = torch.linalg.lstsq(torch.tensor(a), torch.tensor(b), driver=driver)
    got = runtime.linalg.lstsq(runtime.tensor(a), runtime.tensor(b), driver=driver)
    for name, w, g in zip(got._fields, want, got):
        assert tuple(g.shape) == tuple(w.shape) and str(g.dtype)[-5:] == str(w.dtype)[-5:], name
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


def test_lstsq_names_its_drivers():
    with pytest.raises(RuntimeError, match=r"parameter `driver` should be one of \(gels, gelsy, gelsd, gelss\)"):
        runtime.linalg.lstsq(runtime.eye(2), runtime.eye(2), driver="gelsx")


@pytest.mark.parametrize("shape", [(5, 3), (4, 4), (2, 4, 3)])
def test_geqrf_and_householder_product_match_torch(torch, shape):
    """geqrf's compact QR (reflectors below the diagonal, their scales tau), and householder_product rebuilding Q
    from them, with householder_product's gradients in both arguments."""
    a = np.random.default_rng(0).standard_normal(shape)
    weights = np.random.default_rng(1).standard_normal(shape)
    results = []
    for lib in (runtime, torch):
        stored, tau = lib.geqrf(lib.tensor(a))
        reflectors, scales = stored.clone().requires_grad_(True), tau.clone().requires_grad_(True)
        q = lib.linalg.householder_product(reflectors, scales)
        (q * lib.tensor(weights)).sum().backward()
        results.append([stored, tau, q.detach(), reflectors.grad, scales.grad])
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-12)
