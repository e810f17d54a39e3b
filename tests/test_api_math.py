"""torch.* functions and Tensor methods beyond the primitives: values and gradients against torch (float64, tight
tolerances) on random data and edge shapes, and gradients by finite differences where torch is absent."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.autograd import gradcheck

rng = np.random.default_rng(7)


def U(*shape, low=0.1, high=0.9):
    return rng.uniform(low, high, shape)


def N(*shape):
    return rng.standard_normal(shape)


def I(*shape, high=4):  # noqa: E743
    return rng.integers(0, high, shape)


# name -> (call(lib, *inputs), inputs, differentiable inputs' positions)
CASES = {
    "tan": (lambda t, x: t.tan(x), [N(3, 4)], (0,)),
    "asin": (lambda t, x: t.asin(x), [U(3, 4)], (0,)),
    "acos": (lambda t, x: t.arccos(x), [U(5)], (0,)),
    "atan2": (lambda t, y, x: t.atan2(y, x), [N(3, 4), N(4)], (0, 1)),
    "sinh_cosh": (lambda t, x: t.sinh(x) + t.cosh(x) * t.asinh(x), [N(3, 4)], (0,)),
    "acosh_atanh": (lambda t, x, y: t.acosh(x + 1.5) + t.atanh(y), [U(3), U(3)], (0, 1)),
    "expm1_exp2": (lambda t, x: t.expm1(x) * t.exp2(x), [N(2, 3)], (0,)),
    "erfc_erfinv": (lambda t, x: t.erfc(x) + t.erfinv(x), [U(4)], (0,)),
    "lgamma_digamma": (lambda t, x: t.lgamma(x + 0.5) + t.digamma(x + 0.5), [U(4)], (0,)),
    "hypot": (lambda t, x, y: t.hypot(x, y), [N(3, 4), N(3, 1)], (0, 1)),
    "logaddexp": (lambda t, x, y: t.logaddexp(x, y) + t.logaddexp2(x, y), [N(3, 4), N(3, 4) * 30], (0, 1)),
    "xlogy": (lambda t, x, y: t.xlogy(x, y), [np.array([0.0, 1.5, 2.0]), U(3)], (0, 1)),
    "fmod_remainder": (lambda t, x: t.fmod(x, 0.7) + t.remainder(x, -0.7), [N(3, 4) * 3], (0,)),
    "copysign": (lambda t, x, y: t.copysign(x, y), [N(5), N(5)], (0,)),
    "lerp_addcmul": (lambda t, a, b, c: t.lerp(a, b, c) + t.addcmul(a, b, c, value=0.5) + t.addcdiv(a, b, c + 2),
                     [N(3), N(3), U(3)], (0, 1, 2)),
    "logit_sinc": (lambda t, x: t.logit(x) + t.sinc(x), [U(3, 2)], (0,)),
    "frac_trunc": (lambda t, x: t.frac(x) * 2 + t.trunc(x), [N(6) * 3], (0,)),
    "nan_to_num": (lambda t, x: t.nan_to_num(x / 0.0 * (x > 0).to(x.dtype)), [N(6)], ()),
    "cumsum": (lambda t, x: t.cumsum(x, 1) + t.cumprod(x, 1), [N(3, 4)], (0,)),
    "logcumsumexp": (lambda t, x: t.logcumsumexp(x * 50, 0), [N(4, 3)], (0,)),
    "cummax": (lambda t, x: t.cummax(x, 0).values * 2 + t.cummin(x, 1).values, [N(4, 3)], (0,)),
    "cummax_indices": (lambda t, x: t.cummax(x, 0).indices + t.cummin(x, 1).indices,
                       [np.array([[1.0, 1.0, 0.0], [1.0, 2.0, 2.0]])], ()),
    "diff": (lambda t, x: t.diff(x, n=2, dim=0), [N(5, 2)], (0,)),
    "flip_roll_rot": (lambda t, x: t.flip(x, (0, 1)) + t.roll(x, (1, -2), (0, 1)) + t.rot90(x, 2),
                      [N(3, 4)], (0,)),
    "rot90": (lambda t, x: t.rot90(x, 1, (0, 1)) * t.rot90(x, -1), [N(3, 3)], (0,)),
    "roll_flat": (lambda t, x: t.roll(x, 5), [N(3, 4)], (0,)),
    "repeat_interleave": (lambda t, x: t.repeat_interleave(x, 2, dim=1), [N(2, 3)], (0,)),
    "repeat_interleave_tensor": (lambda t, x: x.repeat_interleave(t.tensor([1, 0, 2]), dim=0), [N(3, 2)], (0,)),
    "gather_scatter": (lambda t, x, s: t.scatter(x, 1, t.tensor([[0, 2], [1, 0], [2, 1]]), s), [N(3, 3), N(3, 2)],
                       (0, 1)),
    "scatter_add": (lambda t, x, s: x.scatter_add(0, t.tensor([[0, 1, 1], [0, 0, 1]]), s), [N(2, 3), N(2, 3)],
                    (0, 1)),
    "scatter_reduce_mean": (lambda t, x, s: x.scatter_reduce(0, t.tensor([[0, 1, 1], [0, 0, 1]]), s, "mean",
                                                             include_self=False), [N(2, 3), N(2, 3)], (0, 1)),
    "scatter_reduce_amax": (lambda t, x, s: x.scatter_reduce(0, t.tensor([[0, 1, 1], [0, 0, 1]]), s, "amax"),
                            [N(2, 3), N(2, 3)], ()),
    "index_add": (lambda t, x, s: x.index_add(1, t.tensor([0, 2, 0]), s, alpha=2), [N(2, 3), N(2, 3)], (0, 1)),
    "index_copy_fill": (lambda t, x, s: x.index_copy(0, t.tensor([2, 0]), s).index_fill(1, t.tensor([1]), -1.0),
                        [N(3, 2), N(2, 2)], (0, 1)),
    "masked_select": (lambda t, x: t.masked_select(x, x > 0), [N(3, 4)], (0,)),
    "masked_scatter": (lambda t, x, s: x.masked_scatter(x > 0, s), [N(3, 4), N(12)], (0, 1)),
    "take": (lambda t, x: t.take(x, t.tensor([[0, 11], [5, 5]])), [N(3, 4)], (0,)),
    "index_select": (lambda t, x: t.index_select(x, 0, t.tensor([2, 0, 2])), [N(3, 4)], (0,)),
    "nonzero": (lambda t, x: t.nonzero(x > 0), [N(3, 4)], ()),
    "argwhere": (lambda t, x: t.argwhere(x > 0), [N(2, 2, 3)], ()),
    "sort": (lambda t, x: t.sort(x, 1, descending=True).values * 2 + t.sort(x, 0).values, [N(3, 3)], (0,)),
    "sort_indices": (lambda t, x: t.sort(x, stable=True).indices + t.argsort(x, 0, descending=True),
                     [np.array([[2.0, 1.0, 2.0], [0.0, 0.0, 1.0], [5.0, 1.0, 1.0]])], ()),
    "kthvalue": (lambda t, x: t.kthvalue(x, 2, 1).values, [N(3, 4)], (0,)),
    "median": (lambda t, x: t.median(x, 1).values * 2 + t.median(x), [N(3, 4)], (0,)),
    "median_indices": (lambda t, x: t.median(x, 0).indices, [np.array([[1.0, 2.0], [1.0, 0.0], [3.0, 2.0]])], ()),
    "nanmedian": (lambda t, x: t.nanmedian(x, 1).values,
                  [np.array([[np.nan, 1.0, 3.0, 2.0], [4.0, np.nan, np.nan, 0.0]])], ()),
    "mode": (lambda t, x: t.mode(x, 1).values + t.mode(x, 1).indices,
             [np.array([[1.0, 2.0, 2.0, 1.0], [3.0, 3.0, 0.0, 3.0]])], ()),
    "quantile": (lambda t, x: t.quantile(x, t.tensor([0.25, 0.5, 0.9], dtype=x.dtype), dim=1), [N(3, 5)], (0,)),
    "unique": (lambda t, x: t.unique(x, return_inverse=True, return_counts=True), [I(3, 4).astype(float)], ()),
    "unique_dim": (lambda t, x: t.unique(x, dim=0), [np.array([[1, 2], [0, 1], [1, 2]])], ()),
    "unique_consecutive": (lambda t, x: t.unique_consecutive(x, return_counts=True, return_inverse=True),
                           [np.array([1, 1, 2, 2, 3, 1, 1])], ()),
    "bincount": (lambda t, x, w: t.bincount(x, w, minlength=6), [I(7), N(7)], ()),
    "histc": (lambda t, x: t.histc(x, bins=4, min=-2, max=2), [N(20)], ()),
    "searchsorted": (lambda t, s, v: t.searchsorted(s, v) + t.searchsorted(s, v, right=True),
                     [np.array([0.0, 1.0, 1.0, 3.0]), np.array([[1.0, 2.0], [-1.0, 4.0]])], ()),
    "bucketize": (lambda t, v, b: t.bucketize(v, b), [np.array([0.5, 1.0, 7.0]), np.array([1.0, 2.0, 5.0])], ()),
    "count_nonzero": (lambda t, x: t.count_nonzero(x, 0), [I(3, 4).astype(float)], ()),
    "outer_dot": (lambda t, a, b: t.outer(a, b) * t.dot(a, b) + t.inner(a, b), [N(4), N(4)], (0, 1)),
    "addmm": (lambda t, c, a, b: t.addmm(c, a, b, beta=0.5, alpha=2.0), [N(2, 3), N(2, 4), N(4, 3)], (0, 1, 2)),
    "addmv_addr": (lambda t, c, a, v: t.addmv(c, a, v) + t.addr(a, c, v).sum(1), [N(2), N(2, 3), N(3)], (0, 1, 2)),
    "baddbmm": (lambda t, c, a, b: t.baddbmm(c, a, b, alpha=0.5) + t.addbmm(c[0], a, b),
                [N(2, 2, 3), N(2, 2, 4), N(2, 4, 3)], (0, 1, 2)),
    "mv": (lambda t, a, v: t.mv(a, v), [N(3, 4), N(4)], (0, 1)),
    "einsum_matmul": (lambda t, a, b: t.einsum("ij,jk->ik", a, b), [N(2, 3), N(3, 4)], (0, 1)),
    "einsum_batch": (lambda t, a, b: t.einsum("bij,bkj->bik", a, b), [N(2, 2, 3), N(2, 4, 3)], (0, 1)),
    "einsum_implicit": (lambda t, a, b: t.einsum("ij,j", a, b), [N(2, 3), N(3)], (0, 1)),
    "einsum_trace": (lambda t, a: t.einsum("ii", a) + t.einsum("ii->i", a).sum(), [N(3, 3)], (0,)),
    "einsum_ellipsis": (lambda t, a, b: t.einsum("...ij,...jk->...ik", a, b), [N(2, 2, 3), N(2, 3, 2)], (0, 1)),
    "tensordot": (lambda t, a, b: t.tensordot(a, b, dims=([1, 0], [0, 1])), [N(2, 3, 4), N(3, 2, 5)], (0, 1)),
    "tensordot_int": (lambda t, a, b: t.tensordot(a, b, 1), [N(2, 3), N(3, 4)], (0, 1)),
    "kron": (lambda t, a, b: t.kron(a, b), [N(2, 3), N(2, 2)], (0, 1)),
    "cross": (lambda t, a, b: t.cross(a, b, dim=1), [N(4, 3), N(4, 3)], (0, 1)),
    "cdist": (lambda t, a, b: t.cdist(a, b), [N(3, 4), N(5, 4)], (0, 1)),
    "cdist_p1": (lambda t, a, b: t.cdist(a, b, p=1.0), [N(2, 3, 2), N(2, 4, 2)], (0, 1)),
    "norm": (lambda t, x: t.norm(x) + t.norm(x, p=1, dim=1).sum() + t.norm(x, p=3.0, dim=0).sum(), [N(3, 4)], (0,)),
    "dist": (lambda t, a, b: t.dist(a, b, 3), [N(3, 4), N(4)], (0, 1)),
    "renorm": (lambda t, x: t.renorm(x, 2, 0, 1.0), [N(3, 4)], (0,)),
    "std_var_mean": (lambda t, x: t.std_mean(x, 1)[0] + t.var_mean(x, 0)[1].sum(), [N(3, 4)], (0,)),
    "aminmax": (lambda t, x: t.aminmax(x, dim=1).min + t.aminmax(x, dim=1).max, [N(3, 4)], ()),
    "nansum_nanmean": (lambda t, x: t.nansum(x, 1) + t.nanmean(x, 1),
                       [np.array([[1.0, np.nan, 2.0], [np.nan, np.nan, 4.0]])], ()),
    "cov_corrcoef": (lambda t, x: t.cov(x) + t.corrcoef(x), [N(3, 6)], (0,)),
    "diag_diagonal": (lambda t, x, v: t.diag(v, 1).sum() + t.diagonal(x, 1).sum() + t.diag(x, -1).sum() + t.trace(x),
                      [N(3, 4), N(3)], (0, 1)),
    "diag_embed": (lambda t, v: t.diag_embed(v, offset=-1, dim1=0, dim2=2), [N(2, 3)], (0,)),
    "diagflat": (lambda t, v: t.diagflat(v), [N(2, 2)], (0,)),
    "block_diag": (lambda t, a, b: t.block_diag(a, b), [N(2, 3), N(1, 2)], (0, 1)),
    "meshgrid": (lambda t, a, b: t.stack(t.meshgrid(a, b, indexing="xy")).sum(0), [N(3), N(4)], (0, 1)),
    "cartesian_prod": (lambda t, a, b: t.cartesian_prod(a, b), [N(3), N(2)], (0, 1)),
    "broadcast_tensors": (lambda t, a, b: t.broadcast_tensors(a, b)[0] * 2, [N(3, 1), N(4)], (0,)),
    "stacks": (lambda t, a, b: t.hstack([a, b]).sum() + t.vstack([a, b]).sum() + t.dstack([a, b]).sum(2)
               + t.column_stack([a.reshape(-1), b.reshape(-1)]).sum(), [N(2, 3), N(2, 3)], (0, 1)),
    "atleast": (lambda t, a: t.atleast_3d(a) + t.atleast_2d(a).sum() + t.atleast_1d(a).sum(), [N(3)], (0,)),
    "tensor_split": (lambda t, x: t.cat([p.sum(1, keepdim=True) for p in t.tensor_split(x, 3, 1)], 1)
                     + t.cat([p.sum(1, keepdim=True) for p in t.tensor_split(x, [1, 4], 1)], 1), [N(2, 7)], (0,)),
    "hsplit": (lambda t, x: t.hsplit(x, 2)[1] * t.vsplit(x, [1])[1].sum(), [N(2, 4)], (0,)),
    "movedim": (lambda t, x: t.movedim(x, (0, 2), (2, 0)) + t.moveaxis(x, 0, 2).permute(1, 0, 2), [N(2, 3, 2)],
                (0,)),
    "tile_ravel": (lambda t, x: t.tile(x, (2, 1, 2)).sum() + t.ravel(x.t()), [N(2, 3)], (0,)),
    "tile_method_sizes": (lambda t, x: x.tile(1, 2) + t.tile(x, dims=(2,)).sum() + x.tile(2).sum(), [N(2, 3)], (0,)),
    "unfold": (lambda t, x: x.unfold(1, 3, 2), [N(2, 7)], (0,)),
    "select_slice_diag_scatter": (
        lambda t, x, s: t.select_scatter(x, s[0], 0, 1) + t.slice_scatter(x, s[:2], 0, 0, 2)
        + t.diagonal_scatter(x, s[1, :3]), [N(3, 3), N(2, 3)], (0, 1)),
    "tril_triu_indices": (lambda t: (t.tril_indices(3, 4, 1), t.triu_indices(3, 4, -1), t.tril_indices(0, 2)), [], ()),
    "clamp_min_max": (lambda t, x: t.clamp_min(x, 0.0) + t.clamp_max(x, 0.2), [N(3, 4)], (0,)),
    "fmax_fmin": (lambda t, x, y: t.fmax(x, y) + t.fmin(x, y), [np.array([1.0, np.nan, 2.0]),
                                                                np.array([np.nan, 3.0, 1.0])], ()),
    "signbit_isposinf": (lambda t, x: t.signbit(x) & ~t.isposinf(x) | t.isneginf(x),
                         [np.array([-0.0, 0.0, -1.0, np.inf, -np.inf])], ()),
    "deg_rad": (lambda t, x: t.deg2rad(x) + t.rad2deg(x), [N(3)], (0,)),
    "float_power": (lambda t, x: t.float_power(x, 2.5), [U(3)], (0,)),
    "ldexp": (lambda t, x: t.ldexp(x, t.tensor([1, 2, 3])), [N(3)], (0,)),
    "gcd_lcm_shift": (lambda t, a, b: t.gcd(a, b) + t.lcm(a, b) + (a << 1) + t.bitwise_right_shift(a, 1),
                      [I(5, high=20), I(5, high=20)], ()),
    "heaviside": (lambda t, x: t.heaviside(x, t.tensor([0.5], dtype=x.dtype)), [np.array([-1.0, 0.0, 2.0])], ()),
    "trapezoid": (lambda t, y, x: t.trapezoid(y, x) + t.trapezoid(y, dx=0.5) + t.cumulative_trapezoid(y).sum(-1),
                  [N(2, 5), np.sort(N(5))], (0, 1)),
    "vander": (lambda t, x: t.vander(x, 4) + t.linalg.vander(x, N=4), [N(3)], ()),
    "logspace": (lambda t: t.logspace(0, 2, 5, dtype=t.float64) + t.hann_window(5, dtype=t.float64)
                 + t.hamming_window(5, periodic=False, dtype=t.float64), [], ()),
    "isin": (lambda t, a, b: t.isin(a, b), [I(3, 4), np.array([1, 3])], ()),
    "combinations": (lambda t, x: t.combinations(x, 2) + t.combinations(x, 2, with_replacement=True)[:6], [N(4)],
                     (0,)),
    "unravel_index": (lambda t: t.stack(t.unravel_index(t.tensor([4, 7, 1]), (2, 4))), [], ()),
    "empty_edges": (lambda t, x: t.cumsum(x, 0).sum() + t.flip(x, (0,)).sum() + t.sort(x).values.sum(), [N(0)], (0,)),
    "one_element": (lambda t, x: t.cumprod(x, 0) + t.roll(x, 1) + t.median(x) + t.diff(x, prepend=x), [N(1)], (0,)),
}


def _lib_inputs(lib, inputs, grad):
    out = []
    for k, a in enumerate(inputs):
        t = lib.tensor(a)
        if k in grad:
            t.requires_grad_(True)
        out.append(t)
    return out


def _flat(result):
    if isinstance(result, (tuple, list)):
        return [y for r in result for y in _flat(r)]
    return [result]


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name, torch):
    call, inputs, grad = CASES[name]
    ours_in, theirs_in = _lib_inputs(runtime, inputs, grad), _lib_inputs(torch, inputs, grad)
    ours, theirs = _flat(call(runtime, *ours_in)), _flat(call(torch, *theirs_in))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype.name == str(b.dtype).removeprefix("torch."), (a.dtype, b.dtype)
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10, atol=1e-12)
    if grad:
        seeds = [rng.standard_normal(tuple(b.shape)) for b in theirs]
        ours_total = sum((a * runtime.tensor(s)).sum() for a, s in zip(ours, seeds))
        theirs_total = sum((b * torch.tensor(s)).sum() for b, s in zip(theirs, seeds))
        ours_g = runtime.autograd.grad(ours_total, [ours_in[k] for k in grad], allow_unused=True)
        theirs_g = torch.autograd.grad(theirs_total, [theirs_in[k] for k in grad], allow_unused=True)
        for k, a, b in zip(grad, ours_g, theirs_g):
            expected = np.zeros(inputs[k].shape) if b is None else b.numpy()
            got = np.zeros(inputs[k].shape) if a is None else a.numpy()
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10, err_msg=f"gradient of input {k}")


FD = ["tan", "asin", "atan2", "sinh_cosh", "erfc_erfinv", "lgamma_digamma", "hypot", "logaddexp", "cumsum",
      "logcumsumexp", "cummax", "flip_roll_rot", "repeat_interleave", "gather_scatter", "index_add", "masked_scatter",
      "sort", "kthvalue", "quantile", "einsum_batch", "einsum_trace", "tensordot", "kron", "cross", "cdist", "norm",
      "cov_corrcoef", "diag_diagonal", "diag_embed", "unfold", "select_slice_diag_scatter", "trapezoid"]


@pytest.mark.parametrize("name", FD)
def test_gradients_by_finite_differences(name):
    call, inputs, grad = CASES[name]
    tensors = [runtime.tensor(a, dtype=runtime.float64) if a.dtype.kind == "f" else runtime.tensor(a) for a in inputs]
    for k in grad:
        tensors[k].requires_grad_(True)

    def fn(*diff):
        args = list(tensors)
        for k, t in zip(grad, diff):
            args[k] = t
        return tuple(_flat(call(runtime, *args)))

    assert gradcheck(fn, tuple(tensors[k] for k in grad))


def test_errors_name_the_problem():
    with pytest.raises(RuntimeError, match="out of range"):
        runtime.kthvalue(runtime.ones(3), 4)
    with pytest.raises(RuntimeError, match="shifts and dimensions must align"):
        runtime.roll(runtime.ones(3, 3), (1, 2), 0)
    with pytest.raises(RuntimeError, match="1D tensors expected"):
        runtime.dot(runtime.ones(2, 2), runtime.ones(2))
    with pytest.raises(RuntimeError, match="contracted dimensions need to match"):
        runtime.tensordot(runtime.ones(2, 3), runtime.ones(2, 3), 1)
    with pytest.raises(RuntimeError, match="number of subscripts"):
        runtime.einsum("ij,jk", runtime.ones(2, 3), runtime.ones(3))
    with pytest.raises(RuntimeError, match="bincount only supports"):
        runtime.bincount(runtime.tensor([-1, 2]))
    with pytest.raises(RuntimeError, match="out of bounds"):
        runtime.scatter(runtime.zeros(2, 2), 1, runtime.tensor([[2], [0]]), runtime.ones(2, 1))


MORE = {
    "mvlgamma": (lambda t, x: t.mvlgamma(x + 2, 3), [U(4)], (0,)),
    "i0": (lambda t, x: t.i0(x), [N(4)], (0,)),
    "index_reduce": (lambda t, x, s: x.index_reduce(0, t.tensor([0, 2, 0]), s, "amax"), [N(3, 2), N(3, 2)], ()),
    "index_reduce_mean": (lambda t, x, s: x.index_reduce(1, t.tensor([1, 1]), s, "mean", include_self=False),
                          [N(2, 3), N(2, 2)], ()),
    "frexp": (lambda t, x: t.frexp(x), [N(5) * 100], ()),
    "adjoint_fill": (lambda t, x: x.adjoint() + t.fill(x.T, 2.0), [N(2, 3)], (0,)),
}
CASES.update(MORE)


@pytest.mark.parametrize("name", sorted(MORE))
def test_more_match_torch(name, torch):
    test_matches_torch(name, torch)


def test_fill_diagonal_as_torch(torch):
    for shape, wrap in (((3, 3), False), ((5, 2), True), ((2, 4), False), ((3, 3, 3), False)):
        ours, theirs = runtime.zeros(*shape), torch.zeros(*shape)
        ours.fill_diagonal_(2.0, wrap=wrap)
        theirs.fill_diagonal_(2.0, wrap=wrap)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_random_samplers_have_torchs_shapes_dtypes_and_moments():
    g = runtime.Generator().manual_seed(3)
    p = runtime.full((20000,), 0.3)
    draws = runtime.bernoulli(p, generator=g)
    assert draws.dtype is runtime.float32 and abs(draws.mean().item() - 0.3) < 0.02
    assert runtime.normal(runtime.zeros(2, 3), 2.0).shape == (2, 3)
    n = runtime.normal(1.0, 2.0, size=(20000,), generator=g)
    assert abs(n.mean().item() - 1.0) < 0.05 and abs(n.std().item() - 2.0) < 0.05
    assert abs(runtime.poisson(runtime.full((20000,), 4.0), generator=g).mean().item() - 4.0) < 0.1
    x = runtime.empty(20000)
    assert abs(x.exponential_(2.0, generator=g).mean().item() - 0.5) < 0.02
    assert set(x.random_(3, generator=g).unique().tolist()) == {0.0, 1.0, 2.0}
    assert 0 < x.bernoulli_(0.5, generator=g).mean().item() < 1
    with pytest.raises(RuntimeError, match="p_in >= 0"):
        runtime.bernoulli(runtime.full((2,), 1.5))


def test_autograd_functional_matches_torch(torch):
    F, TF = runtime.autograd.functional, torch.autograd.functional
    x, y = N(3, 2), N(3, 2)

    def f(a, b):
        return (a ** 2 * b.sin()).sum(0)

    ours = F.jacobian(f, (runtime.tensor(x), runtime.tensor(y)))
    theirs = TF.jacobian(f, (torch.tensor(x), torch.tensor(y)))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    v = N(2)
    _, ours = F.vjp(f, (runtime.tensor(x), runtime.tensor(y)), runtime.tensor(v))
    _, theirs = TF.vjp(f, (torch.tensor(x), torch.tensor(y)), torch.tensor(v))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    _, ours = F.jvp(f, (runtime.tensor(x), runtime.tensor(y)), (runtime.tensor(x), runtime.tensor(y)))
    _, theirs = TF.jvp(f, (torch.tensor(x), torch.tensor(y)), (torch.tensor(x), torch.tensor(y)))
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12)

    def g(a):
        return (a ** 3).sum() + a[0] * a[1]

    z, w = np.array([1.0, 2.0, -0.5]), np.array([0.3, 1.0, 2.0])
    np.testing.assert_allclose(F.hessian(g, runtime.tensor(z)).numpy(), TF.hessian(g, torch.tensor(z)).numpy())
    np.testing.assert_allclose(F.hvp(g, runtime.tensor(z), runtime.tensor(w))[1].numpy(),
                               TF.hvp(g, torch.tensor(z), torch.tensor(w))[1].numpy())
    np.testing.assert_allclose(F.vhp(g, runtime.tensor(z), runtime.tensor(w))[1].numpy(),
                               TF.vhp(g, torch.tensor(z), torch.tensor(w))[1].numpy())


def test_gradgradcheck():
    x = runtime.tensor([0.5, 1.5], dtype=runtime.float64, requires_grad=True)
    assert runtime.autograd.gradgradcheck(lambda t: (t.sin() * t.atan()).sum(), (x,))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_scans_of_narrow_floats_accumulate_in_double_precision_as_torch(dtype):
    """torch's CPU cumsum and cumprod accumulate narrower floats in double: a float32 cumsum of [1e8, 1, -1e8, 1]
    is [1e8, 1e8, 1, 2] (float32 accumulation gives [1e8, 1e8, 0, 1])."""
    big = 1e8 if dtype == "float32" else 1e4
    x = runtime.tensor([big, 1.0, -big, 1.0], dtype=getattr(runtime, dtype))
    sums = x.cumsum(0)
    assert sums.dtype == x.dtype
    np.testing.assert_array_equal(sums[2:].float().numpy(), np.array([1.0, 2.0]))
    prods = runtime.tensor([3.0, 1 / 3, 3.0], dtype=getattr(runtime, dtype)).cumprod(0)
    assert prods.dtype == x.dtype


def test_scans_match_torch_on_cancelling_float32(torch):
    values = np.array([[1e8, 1.0, -1e8, 1.0, 3e38, 3e38, -np.inf]], np.float32)
    for name in ("cumsum", "cumprod"):
        got = getattr(runtime.tensor(values), name)(1).numpy()
        want = getattr(torch.tensor(values), name)(1).numpy()
        np.testing.assert_array_equal(got, want)
