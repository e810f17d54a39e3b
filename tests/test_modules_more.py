"""The last issue-15 module classes and nn.utils (parametrize, parametrizations, fusion, two-step clipping), and the
ParameterList/ParameterDict reprs, against torch."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from helpers import needs_torch

nn = runtime.nn


def _to_runtime(torch_module, runtime_module):
    runtime_module.load_state_dict({k: runtime.tensor(v.detach().numpy()) for k, v in
                                    torch_module.state_dict().items()})
    return runtime_module


def _repr(text: str) -> str:
    return text.replace("runtime.", "torch.")


@needs_torch
def test_parameter_containers_repr_like_torch(torch):
    for lib in (torch, runtime):
        lib.manual_seed(0)
    pairs = [(torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(3))]),
              nn.ParameterList([nn.Parameter(runtime.zeros(2, 3)), nn.Parameter(runtime.zeros(3))])),
             (torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]),
              nn.ParameterList([nn.Parameter(runtime.zeros(2, dtype=runtime.float64))])),
             (torch.nn.ParameterDict({"a": torch.nn.Parameter(torch.zeros(2, 3)), "b": torch.zeros(1)}),
              nn.ParameterDict({"a": nn.Parameter(runtime.zeros(2, 3)), "b": runtime.zeros(1)})),
             (torch.nn.ParameterList(), nn.ParameterList())]
    for t, r in pairs:
        assert _repr(repr(r)) == repr(t)


@needs_torch
def test_new_module_reprs_and_state_dicts_match_torch(torch):
    specs = [("AlphaDropout", (0.2,)), ("FeatureAlphaDropout", (0.3, True)), ("CTCLoss", (2, "sum", True)),
             ("MultiLabelMarginLoss", ()), ("MaxUnpool1d", (2,)), ("MaxUnpool2d", (3, 1, 1)),
             ("MaxUnpool3d", ((2, 1, 2),)), ("AdaptiveMaxPool3d", ((2, None, 3), True)), ("LPPool3d", (2, 2))]
    for name, args in specs:
        t, r = getattr(torch.nn, name)(*args), getattr(nn, name)(*args)
        assert repr(r) == repr(t)
        assert list(r.state_dict()) == list(t.state_dict())


@needs_torch
def test_new_modules_compute_like_torch(torch):
    gen = np.random.default_rng(0)
    x = gen.standard_normal((2, 3, 4, 4, 4))
    t_pool, r_pool = torch.nn.AdaptiveMaxPool3d(2, return_indices=True), nn.AdaptiveMaxPool3d(2, return_indices=True)
    (tv, ti), (rv, ri) = t_pool(torch.tensor(x)), r_pool(runtime.tensor(x))
    np.testing.assert_allclose(rv.numpy(), tv.numpy())
    assert np.array_equal(ri.numpy(), ti.numpy())
    vals, idx = torch.nn.functional.max_pool2d(torch.tensor(x[:, :, 0]), 2, return_indices=True)
    ref = torch.nn.MaxUnpool2d(2)(vals, idx)
    got = nn.MaxUnpool2d(2)(runtime.tensor(vals.numpy()), runtime.tensor(idx.numpy()))
    np.testing.assert_allclose(got.numpy(), ref.numpy())
    logits = gen.standard_normal((6, 2, 4))
    t_lp, r_lp = torch.tensor(logits).log_softmax(2), runtime.tensor(logits).log_softmax(2)
    targets = np.array([[1, 2], [3, 3]])
    ref = torch.nn.CTCLoss()(t_lp, torch.tensor(targets), [6, 5], [2, 2])
    got = nn.CTCLoss()(r_lp, runtime.tensor(targets), [6, 5], [2, 2])
    np.testing.assert_allclose(float(got), float(ref), rtol=1e-6)
    drop = nn.AlphaDropout(0.5).eval()
    a = runtime.randn(3, 4)
    assert drop(a) is a


@needs_torch
@pytest.mark.parametrize("dim", [0, 1, None])
def test_weight_norm_parametrization_matches_torch(torch, dim):
    torch.manual_seed(0)
    t = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(3, 4).double(), dim=dim)
    r = nn.utils.parametrizations.weight_norm(nn.Linear(3, 4).double(), dim=dim)
    assert list(r.state_dict()) == list(t.state_dict())
    assert repr(r) == repr(t) and type(r).__name__ == "ParametrizedLinear"
    _to_runtime(t, r)
    x = np.random.default_rng(1).standard_normal((5, 3))
    t_out, r_out = t(torch.tensor(x)), r(runtime.tensor(x))
    np.testing.assert_allclose(r_out.detach().numpy(), t_out.detach().numpy(), rtol=1e-10)
    t_out.square().sum().backward()
    r_out.square().sum().backward()
    for (name, p), (_, q) in zip(r.named_parameters(), t.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, err_msg=name)
    np.testing.assert_allclose(r.weight.detach().numpy(), t.weight.detach().numpy(), rtol=1e-10)


@needs_torch
def test_spectral_norm_parametrization_matches_torch(torch):
    torch.manual_seed(0)
    t = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Conv2d(2, 3, 3).double())
    r = nn.utils.parametrizations.spectral_norm(nn.Conv2d(2, 3, 3).double())
    assert list(r.state_dict()) == list(t.state_dict())
    _to_runtime(t, r)
    x = np.random.default_rng(1).standard_normal((2, 2, 5, 5))
    for _ in range(2):  # training reads run a power iteration step and update _u, _v
        t_out, r_out = t(torch.tensor(x)), r(runtime.tensor(x))
        np.testing.assert_allclose(r_out.detach().numpy(), t_out.detach().numpy(), rtol=1e-9, atol=1e-12)
    t_out.sum().backward()
    r_out.sum().backward()
    np.testing.assert_allclose(r.parametrizations.weight.original.grad.numpy(),
                               t.parametrizations.weight.original.grad.numpy(), rtol=1e-8, atol=1e-12)
    t.eval(), r.eval()
    np.testing.assert_allclose(r.weight.detach().numpy(), t.weight.detach().numpy(), rtol=1e-9)
    sigma = np.linalg.svd(r.parametrizations.weight.original.detach().numpy().reshape(3, -1), compute_uv=False)[0]
    assert np.linalg.svd(r.weight.detach().numpy().reshape(3, -1), compute_uv=False)[0] == pytest.approx(1, rel=0.1)
    assert sigma > 0


def test_register_and_remove_parametrizations():
    class Symmetric(nn.Module):
        def forward(self, x):
            return x.triu() + x.triu(1).transpose(0, 1)

        def right_inverse(self, a):
            return a.triu()

    P = nn.utils.parametrize
    m = nn.Linear(3, 3)
    P.register_parametrization(m, "weight", Symmetric())
    assert P.is_parametrized(m) and P.is_parametrized(m, "weight") and not P.is_parametrized(m, "bias")
    w = m.weight.detach().numpy()
    np.testing.assert_allclose(w, w.T)
    sym = runtime.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 5.0], [3.0, 5.0, 6.0]])
    m.weight = sym  # assignment runs right_inverse
    np.testing.assert_allclose(m.weight.detach().numpy(), sym.numpy())
    with P.cached():
        assert m.weight is m.weight
    m(runtime.randn(2, 3)).sum().backward()
    assert m.parametrizations.weight.original.grad is not None
    P.remove_parametrizations(m, "weight")
    assert type(m) is nn.Linear and isinstance(m.weight, nn.Parameter) and not P.is_parametrized(m)
    np.testing.assert_allclose(m.weight.detach().numpy(), sym.numpy())
    assert list(m.state_dict()) == ["bias", "weight"]  # re-registered last, as torch
    wn = nn.utils.parametrizations.weight_norm(nn.Linear(2, 2))
    before = wn.weight.detach().numpy()
    P.remove_parametrizations(wn, "weight")
    np.testing.assert_allclose(wn.weight.detach().numpy(), before, rtol=1e-6)
    with pytest.raises(ValueError, match="does not have a parametrization"):
        P.remove_parametrizations(wn, "weight")


@needs_torch
def test_fusion_and_two_step_clipping_match_torch(torch):
    torch.manual_seed(0)
    conv, bn = torch.nn.Conv2d(2, 3, 3).double().eval(), torch.nn.BatchNorm2d(3).double()
    bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    bn.eval()
    r_conv, r_bn = _to_runtime(conv, nn.Conv2d(2, 3, 3).double().eval()), _to_runtime(bn, nn.BatchNorm2d(3).double())
    r_bn.eval()
    ref = torch.nn.utils.fuse_conv_bn_eval(conv, bn)
    got = nn.utils.fuse_conv_bn_eval(r_conv, r_bn)
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5))
    np.testing.assert_allclose(got(runtime.tensor(x)).detach().numpy(), ref(torch.tensor(x)).detach().numpy(),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got(runtime.tensor(x)).detach().numpy(),
                               r_bn(r_conv(runtime.tensor(x))).detach().numpy(), rtol=1e-10, atol=1e-12)
    lin, bn1 = torch.nn.Linear(3, 4).double().eval(), torch.nn.BatchNorm1d(4).double().eval()
    r_lin, r_bn1 = _to_runtime(lin, nn.Linear(3, 4).double().eval()), _to_runtime(bn1, nn.BatchNorm1d(4).double())
    r_bn1.eval()
    x = np.random.default_rng(1).standard_normal((2, 3))
    np.testing.assert_allclose(nn.utils.fuse_linear_bn_eval(r_lin, r_bn1)(runtime.tensor(x)).detach().numpy(),
                               torch.nn.utils.fuse_linear_bn_eval(lin, bn1)(torch.tensor(x)).detach().numpy())
    grads = [np.random.default_rng(2).standard_normal(s) for s in ((3, 2), (4,))]
    t_params = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64)) for g in grads]
    r_params = [nn.Parameter(runtime.zeros(g.shape, dtype=runtime.float64)) for g in grads]
    for tp, rp, g in zip(t_params, r_params, grads):
        tp.grad, rp.grad = torch.tensor(g), runtime.tensor(g)
    for norm_type in (2.0, 1.0, float("inf")):
        ref = torch.nn.utils.get_total_norm([p.grad for p in t_params], norm_type)
        got = nn.utils.get_total_norm([p.grad for p in r_params], norm_type)
        assert float(got) == pytest.approx(float(ref), rel=1e-12)
    torch.nn.utils.clip_grads_with_norm_(t_params, 0.5, ref)
    nn.utils.clip_grads_with_norm_(r_params, 0.5, got)
    for tp, rp in zip(t_params, r_params):
        np.testing.assert_allclose(rp.grad.numpy(), tp.grad.numpy(), rtol=1e-12)


_ORTHOGONAL_CASES = [((4, 4), None, True), ((4, 4), "cayley", True), ((2, 3, 3), None, True),
                     ((6, 3), None, False), ((3, 6), None, False), ((5, 3), "householder", False)]


@needs_torch
@pytest.mark.parametrize("shape,orthogonal_map,trivialization", _ORTHOGONAL_CASES)
def test_orthogonal_parametrization_matches_torch(torch, shape, orthogonal_map, trivialization):
    """The weight (orthonormal columns, or rows when wide), the original's gradient and the state_dict keys, as
    torch's (a non-square trivialization completes its base with random columns: its values match, not its
    gradient, which the next test checks by finite differences)."""
    weights = np.random.default_rng(0).standard_normal(shape)
    results = []
    for lib in (runtime, torch):
        module = lib.nn.Module()
        module.weight = lib.nn.Parameter(lib.tensor(weights))
        lib.nn.utils.parametrizations.orthogonal(module, orthogonal_map=orthogonal_map,
                                                 use_trivialization=trivialization)
        (module.weight * lib.tensor(np.random.default_rng(1).standard_normal(shape))).sum().backward()
        results.append((module.weight.detach().numpy(), module.parametrizations.weight.original.grad.numpy(),
                        sorted(module.state_dict())))
    (ours, ours_grad, ours_keys), (theirs, theirs_grad, theirs_keys) = results
    np.testing.assert_allclose(ours, theirs, atol=1e-12)
    np.testing.assert_allclose(ours_grad, theirs_grad, atol=1e-12)
    assert ours_keys == theirs_keys


@pytest.mark.parametrize("shape,orthogonal_map", [((6, 3), None), ((3, 5), "cayley"), ((5, 3), "matrix_exp")])
def test_orthogonal_parametrization_is_orthogonal_and_its_gradient_is_right(shape, orthogonal_map):
    module = nn.Module()
    module.weight = nn.Parameter(runtime.tensor(np.random.default_rng(0).standard_normal(shape)))
    nn.utils.parametrizations.orthogonal(module, orthogonal_map=orthogonal_map)
    w = module.weight.detach().numpy()
    gram = w.T @ w if shape[0] >= shape[1] else w @ w.T
    np.testing.assert_allclose(gram, np.eye(min(shape)), atol=1e-12)
    original = module.parametrizations.weight.original
    weights = runtime.tensor(np.random.default_rng(1).standard_normal(shape))
    (module.weight * weights).sum().backward()
    eps, worst = 1e-6, 0.0
    with runtime.no_grad():
        for index in np.ndindex(shape):
            if index[-1] == index[-2]:
                continue  # (householder's diagonal enters through .int(): a step, where differences mean nothing)
            old = float(original[index])
            original[index] = old + eps
            up = float((module.weight * weights).sum())
            original[index] = old - eps
            down = float((module.weight * weights).sum())
            original[index] = old
            worst = max(worst, abs((up - down) / (2 * eps) - float(original.grad[index])))
    assert worst < 1e-7
