"""The later nn.functional additions (runtime/nn/_functional_more.py): values and gradients against torch in float64,
and finite differences where torch is absent."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from helpers import needs_torch

F = runtime.nn.functional


def _pair(torch, *arrays, grad=True):
    """The same float64 arrays as runtime and torch leaves."""
    r = [runtime.tensor(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
    t = [torch.tensor(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
    return r, t


def _check(torch, r_out, t_out, r_in, t_in, atol=1e-9):
    np.testing.assert_allclose(r_out.detach().numpy(), t_out.detach().numpy(), atol=atol, rtol=1e-7)
    gen = np.random.default_rng(1)
    w = gen.standard_normal(tuple(t_out.shape))
    (r_out * runtime.tensor(w)).sum().backward()
    (t_out * torch.tensor(w)).sum().backward()
    for a, b in zip(r_in, t_in):
        if b.requires_grad:
            ga = np.zeros(tuple(b.shape)) if a.grad is None else a.grad.numpy()
            gb = np.zeros(tuple(b.shape)) if b.grad is None else b.grad.numpy()
            np.testing.assert_allclose(ga, gb, atol=1e-7, rtol=1e-6)


def _fd(fn, *arrays):
    """runtime's gradient of sum(fn(*xs) * w) against central differences, in float64."""
    xs = [runtime.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*xs)
    w = np.random.default_rng(2).standard_normal(tuple(out.shape))
    (out * runtime.tensor(w)).sum().backward()
    for k, a in enumerate(arrays):
        num = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            vals = []
            for h in (1e-6, -1e-6):
                b = [x.copy() for x in arrays]
                b[k][i] += h
                vals.append(float((fn(*[runtime.tensor(v) for v in b]).numpy() * w).sum()))
            num[i] = (vals[0] - vals[1]) / 2e-6
        np.testing.assert_allclose(xs[k].grad.numpy(), num, atol=1e-5, rtol=1e-5)


rng = np.random.default_rng(0)


@needs_torch
@pytest.mark.parametrize("name,args", [("elu_", (0.7,)), ("celu_", (1.3,)), ("selu_", ()), ("hardtanh_", (-0.5, 0.4)),
                                       ("threshold_", (0.1, -2.0)), ("rrelu_", (0.1, 0.3, False))])
def test_inplace_activations_match_torch(torch, name, args):
    x = rng.standard_normal((3, 4))
    r, t = runtime.tensor(x), torch.tensor(x)
    out = getattr(F, name)(r, *args)
    ref = getattr(torch.nn.functional, name)(t, *args)
    assert out is r
    np.testing.assert_allclose(r.numpy(), t.numpy(), atol=1e-12)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=1e-12)


def test_alpha_dropout_keeps_selu_statistics():
    runtime.manual_seed(0)
    x = runtime.randn(200000, dtype=runtime.float64)
    y = F.alpha_dropout(x, 0.3, training=True)
    assert abs(float(y.mean())) < 0.02 and abs(float(y.std()) - 1) < 0.02
    assert F.alpha_dropout(x, 0.3) is x and F.alpha_dropout(x, 0.0, True) is x
    z = F.feature_alpha_dropout(runtime.randn(4, 6, 5, dtype=runtime.float64), 0.5, training=True)
    dropped = np.isclose(z.numpy(), z.numpy()[:, :, :1])  # a dropped channel is one constant
    assert (dropped.all(2) | ~dropped.all(2)).all() and dropped.all(2).any()
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.alpha_dropout(x, 1.5, True)


def test_gumbel_softmax_is_a_distribution_and_hard_is_one_hot():
    runtime.manual_seed(0)
    logits = runtime.randn(5, 7, requires_grad=True)
    soft = F.gumbel_softmax(logits, tau=0.5)
    np.testing.assert_allclose(soft.sum(-1).detach().numpy(), 1, atol=1e-6)
    hard = F.gumbel_softmax(logits, hard=True)
    assert set(np.unique(hard.detach().numpy())) <= {0.0, 1.0} and (hard.detach().numpy().sum(-1) == 1).all()
    hard.sum().backward()
    assert logits.grad is not None


@needs_torch
@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, float("inf")])
def test_pdist_matches_torch(torch, p):
    (r,), (t,) = _pair(torch, rng.standard_normal((5, 3)))
    _check(torch, F.pdist(r, p), torch.nn.functional.pdist(t, p), [r], [t])


@needs_torch
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multilabel_margin_loss_matches_torch(torch, reduction):
    x = rng.standard_normal((3, 5))
    target = np.array([[3, 0, -1, 1, 2], [1, 1, 4, 2, -1], [-1, 0, 0, 0, 0]])
    (r, rt), (t, tt) = _pair(torch, x, target)
    _check(torch, F.multilabel_margin_loss(r, rt, reduction=reduction),
           torch.nn.functional.multilabel_margin_loss(t, tt, reduction=reduction), [r], [t])
    (r, rt), (t, tt) = _pair(torch, x[0], target[0])
    _check(torch, F.multilabel_margin_loss(r, rt, reduction=reduction),
           torch.nn.functional.multilabel_margin_loss(t, tt, reduction=reduction), [r], [t])


def _ctc_case(padded):
    t_len, n, c = 7, 3, 5
    logits = rng.standard_normal((t_len, n, c))
    in_lens = [7, 5, 6]
    tg_lens = [3, 0, 2]
    labels = [[1, 1, 2], [], [4, 3]]
    if padded:
        targets = np.array([seq + [0] * (3 - len(seq)) for seq in labels])
    else:
        targets = np.array([v for seq in labels for v in seq])
    return logits, targets, in_lens, tg_lens


@needs_torch
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_matches_torch(torch, padded, reduction):
    logits, targets, in_lens, tg_lens = _ctc_case(padded)
    (r, rt), (t, tt) = _pair(torch, logits, targets)
    got = F.ctc_loss(r.log_softmax(2), rt, in_lens, tg_lens, reduction=reduction)
    ref = torch.nn.functional.ctc_loss(t.log_softmax(2), tt, in_lens, tg_lens, reduction=reduction)
    _check(torch, got, ref, [r], [t])


@needs_torch
def test_ctc_loss_gradient_wrt_log_probs_leaf_matches_torch(torch):
    """torch's gradient with respect to log_probs themselves (not through log_softmax) has an exp(log_probs) term."""
    logits, targets, in_lens, tg_lens = _ctc_case(True)
    (r, rt), (t, tt) = _pair(torch, logits - 1.0, targets)
    _check(torch, F.ctc_loss(r, rt, in_lens, tg_lens, blank=0, reduction="sum"),
           torch.nn.functional.ctc_loss(t, tt, in_lens, tg_lens, blank=0, reduction="sum"), [r], [t])


@needs_torch
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_impossible_alignment_and_blank(torch, zero_infinity):
    logits = rng.standard_normal((3, 2, 4))
    targets = np.array([[1, 1, 1], [2, 1, 0]])  # three equal labels need 5 frames: impossible in 3
    in_lens, tg_lens = [3, 3], [3, 2]
    (r, rt), (t, tt) = _pair(torch, logits, targets)
    got = F.ctc_loss(r.log_softmax(2), rt, in_lens, tg_lens, blank=3, reduction="none", zero_infinity=zero_infinity)
    ref = torch.nn.functional.ctc_loss(t.log_softmax(2), tt, in_lens, tg_lens, blank=3, reduction="none",
                                       zero_infinity=zero_infinity)
    if zero_infinity:
        _check(torch, got, ref, [r], [t])
    else:
        np.testing.assert_allclose(got.detach().numpy(), ref.detach().numpy())


def test_ctc_loss_gradient_by_finite_differences():
    logits, targets, in_lens, tg_lens = _ctc_case(True)
    _fd(lambda x: F.ctc_loss(x.log_softmax(2), runtime.tensor(targets[:2]), [5, 4], tg_lens[:2]),
        logits[:5, :2])


@needs_torch
@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_matches_torch(torch, align_corners):
    (r,), (t,) = _pair(torch, rng.standard_normal((2, 2, 3)))
    _check(torch, F.affine_grid(r, (2, 3, 4, 5), align_corners), torch.nn.functional.affine_grid(
        t, (2, 3, 4, 5), align_corners), [r], [t])
    (r,), (t,) = _pair(torch, rng.standard_normal((2, 3, 4)))
    _check(torch, F.affine_grid(r, (2, 1, 2, 3, 4), align_corners), torch.nn.functional.affine_grid(
        t, (2, 1, 2, 3, 4), align_corners), [r], [t])


@needs_torch
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_matches_torch(torch, mode, padding_mode, align_corners):
    x = rng.standard_normal((2, 3, 4, 5))
    grid = rng.uniform(-1.6, 1.6, (2, 3, 6, 2))  # reaches outside [-1, 1] to exercise the padding modes
    (r, rg), (t, tg) = _pair(torch, x, grid)
    got = F.grid_sample(r, rg, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    ref = torch.nn.functional.grid_sample(t, tg, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    _check(torch, got, ref, [r, rg], [t, tg])
    assert rg.grad is not None  # a zero tensor in nearest mode, as torch's (not None)


def test_grid_sample_gradient_by_finite_differences():
    x = rng.standard_normal((1, 2, 3, 4))
    grid = rng.uniform(-1.3, 1.3, (1, 2, 3, 2))
    for padding_mode in ("zeros", "border", "reflection"):
        _fd(lambda a, g: F.grid_sample(a, g, padding_mode=padding_mode, align_corners=False), x, grid)


def test_grid_sample_refuses_what_it_does_not_support():
    with pytest.raises(NotImplementedError, match="bicubic"):
        F.grid_sample(runtime.zeros(1, 1, 2, 2), runtime.zeros(1, 1, 1, 2), mode="bicubic", align_corners=False)
    with pytest.raises(NotImplementedError, match="5-D"):
        F.grid_sample(runtime.zeros(1, 1, 2, 2, 2), runtime.zeros(1, 1, 1, 1, 3), align_corners=False)


@needs_torch
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_max_unpool_inverts_max_pool_like_torch(torch, nd):
    shape = (2, 3) + (6, 4, 4)[:nd]
    x = rng.standard_normal(shape)
    pool = getattr(torch.nn.functional, f"max_pool{nd}d")
    vals, idx = pool(torch.tensor(x), 2, return_indices=True)
    (r, ri), (t, ti) = _pair(torch, vals.numpy(), idx.numpy())
    unpool = f"max_unpool{nd}d"
    _check(torch, getattr(F, unpool)(r, ri, 2, output_size=shape),
           getattr(torch.nn.functional, unpool)(t, ti, 2, output_size=shape), [r], [t])
    _check(torch, getattr(F, unpool)(r, ri, 2, 2, 0), getattr(torch.nn.functional, unpool)(t, ti, 2, 2, 0), [r], [t])


@needs_torch
@pytest.mark.parametrize("nd,out", [(1, 3), (2, (3, 2)), (3, (2, None, 3))])
def test_adaptive_max_pool_returns_torch_indices(torch, nd, out):
    x = rng.standard_normal((2, 3) + (7, 5, 4)[:nd])
    (r,), (t,) = _pair(torch, x)
    name = f"adaptive_max_pool{nd}d"
    got, got_i = getattr(F, name)(r, out, return_indices=True)
    ref, ref_i = getattr(torch.nn.functional, name)(t, out, return_indices=True)
    assert np.array_equal(got_i.numpy(), ref_i.numpy())
    _check(torch, got, ref, [r], [t])
    np.testing.assert_allclose(getattr(F, name)(r, out).detach().numpy(), ref.detach().numpy())
    got_i2 = getattr(F, name + "_with_indices")(r, out)[1]
    assert np.array_equal(got_i2.numpy(), ref_i.numpy())


@needs_torch
def test_pool_with_indices_lp_pool3d_and_conv_tbc_match_torch(torch):
    x = rng.standard_normal((1, 2, 4, 4, 4))
    (r,), (t,) = _pair(torch, x)
    for nd in (1, 2, 3):
        a = x.reshape((1, 2) + (64, (8, 8), (4, 4, 4))[nd - 1] if nd > 1 else (1, 2, 64))
        got = getattr(F, f"max_pool{nd}d_with_indices")(runtime.tensor(a), 2)
        ref = getattr(torch.nn.functional, f"max_pool{nd}d_with_indices")(torch.tensor(a), 2)
        assert np.array_equal(got[1].numpy(), ref[1].numpy())
    _check(torch, F.lp_pool3d(r.abs() + 0.1, 2.0, 2), torch.nn.functional.lp_pool3d(t.abs() + 0.1, 2.0, 2), [r], [t])
    (xi, w, b), (txi, tw, tb) = _pair(torch, rng.standard_normal((6, 2, 3)), rng.standard_normal((3, 3, 4)),
                                      rng.standard_normal(4))
    _check(torch, F.conv_tbc(xi, w, b, 1), torch.conv_tbc(txi, tw, tb, 1), [xi, w, b], [txi, tw, tb])


class _SpeechModel(runtime.nn.Module):
    """A GRU acoustic model trained with CTC: ctc_loss reads its lengths and targets as Python values."""

    def __init__(self):
        super().__init__()
        self.rnn = runtime.nn.GRU(4, 6)
        self.out = runtime.nn.Linear(6, 5)

    def forward(self, x, targets, in_lens, tgt_lens):
        h, _ = self.rnn(x)
        return F.ctc_loss(F.log_softmax(self.out(h), -1), targets, in_lens, tgt_lens, zero_infinity=True)


def test_a_compiled_model_runs_only_ctc_loss_eagerly():
    """The functions of this module are recorded as calls when traced, like nn.functional's own: ctc_loss, which
    reads values, becomes one eager node, and the GRU and the projection around it compile (the whole forward
    used to run eagerly)."""
    import nnc

    runtime.manual_seed(2)
    model = _SpeechModel()
    rng = np.random.default_rng(2)
    args = (runtime.randn(7, 2, 4), runtime.tensor(rng.integers(1, 5, (2, 3))), runtime.tensor([7, 6]),
            runtime.tensor([3, 2]))
    compiled = nnc.compile(model)
    results = []
    for fn in (model, compiled):
        model.zero_grad()
        loss = fn(*args)
        loss.backward()
        results.append([loss.item()] + [p.grad.numpy().copy() for p in model.parameters()])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (artifact,) = compiled._cache.values()
    assert type(artifact).__name__ == "Compilation"
    assert [n.target.__name__ for n in artifact.opaque] == ["ctc_loss"]
