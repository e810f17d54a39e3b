"""torch's older top-level decompositions (svd, qr, cholesky, pinverse, cholesky_solve, cholesky_inverse,
triangular_solve), as functions and methods: the same results, shapes and field names as torch's, and the
deprecation warnings torch gives."""
import warnings

import numpy as np
import pytest

import runtime
from helpers import needs_torch

pytestmark = needs_torch

RNG = np.random.default_rng(5)
A = RNG.standard_normal((5, 3))
SPD = A.T @ A + np.eye(3)
B = RNG.standard_normal((3, 2))


def _both(torch, fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn(torch), fn(runtime)


def _close(ours, theirs):
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("some", [True, False])
def test_svd_returns_v_and_its_shapes(torch, some):
    theirs, ours = _both(torch, lambda lib: lib.svd(lib.tensor(A), some=some))
    assert ours._fields == ("U", "S", "V") and [tuple(t.shape) for t in ours] == [tuple(t.shape) for t in theirs]
    _close(ours.S, theirs.S)
    for k in range(3):  # singular vectors up to sign, and the product rebuilds A either way
        sign = np.sign(ours.V.numpy()[0, k] * theirs.V.numpy()[0, k])
        np.testing.assert_allclose(ours.V.numpy()[:, k] * sign, theirs.V.numpy()[:, k], atol=1e-10)
    np.testing.assert_allclose((ours.U[:, :3] * ours.S) @ ours.V.T, A, atol=1e-12)
    theirs, ours = _both(torch, lambda lib: lib.tensor(A).svd(compute_uv=False))
    assert [tuple(t.shape) for t in ours] == [tuple(t.shape) for t in theirs] and not ours.U.numpy().any()


@pytest.mark.parametrize("some", [True, False])
def test_qr(torch, some):
    theirs, ours = _both(torch, lambda lib: lib.qr(lib.tensor(A), some=some))
    assert ours._fields == ("Q", "R") and [tuple(t.shape) for t in ours] == [tuple(t.shape) for t in theirs]
    np.testing.assert_allclose(np.abs(ours.R.numpy()), np.abs(theirs.R.numpy()), atol=1e-12)
    np.testing.assert_allclose(ours.Q.numpy() @ ours.R.numpy(), A, atol=1e-12)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse(torch, upper):
    for fn in (lambda lib: lib.cholesky(lib.tensor(SPD), upper=upper),
               lambda lib: lib.cholesky_solve(lib.tensor(B), lib.cholesky(lib.tensor(SPD), upper=upper), upper=upper),
               lambda lib: lib.cholesky(lib.tensor(SPD), upper=upper).cholesky_inverse(upper=upper)):
        _close(*reversed(_both(torch, fn)))


@pytest.mark.parametrize("upper,transpose,unitriangular", [(True, False, False), (False, True, False),
                                                           (True, True, True)])
def test_triangular_solve(torch, upper, transpose, unitriangular):
    square = RNG.standard_normal((3, 3)) + 3 * np.eye(3)
    theirs, ours = _both(torch, lambda lib: lib.tensor(B).triangular_solve(lib.tensor(square), upper=upper,
                                                                           transpose=transpose,
                                                                           unitriangular=unitriangular))
    assert ours._fields == ("solution", "cloned_coefficient")
    _close(ours.solution, theirs.solution)
    _close(ours.cloned_coefficient, theirs.cloned_coefficient)


def test_pinverse(torch):
    _close(*reversed(_both(torch, lambda lib: lib.pinverse(lib.tensor(A)))))
    _close(*reversed(_both(torch, lambda lib: lib.tensor(A).pinverse(rcond=0.5))))


def test_the_deprecated_ones_warn_once_as_torch_does():
    from runtime import legacy_linalg

    legacy_linalg._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            runtime.qr(runtime.tensor(A))
            runtime.cholesky(runtime.tensor(SPD))
            runtime.triangular_solve(runtime.tensor(B), runtime.tensor(SPD))
            runtime.svd(runtime.tensor(A))
    messages = [str(w.message).split(" is deprecated")[0] for w in caught]
    assert messages == ["torch.qr", "torch.cholesky", "torch.triangular_solve"]
