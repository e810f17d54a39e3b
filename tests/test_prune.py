"""runtime.nn.utils.prune against torch's: masks, layout, state_dict, gradients, iteration, remove, errors, nnc."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import nnc
import runtime
import runtime.nn.utils.prune as prune
from runtime.nn import functional as F


@pytest.fixture
def tprune(torch):
    """torch.nn.utils.prune (torch does not import it with torch.nn.utils)."""
    import torch.nn.utils.prune as torch_prune

    return torch_prune


def _weights(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _linear_pair(torch, seed=0):
    """A runtime Linear(5, 6) and a torch one with the same weights."""
    w, b = _weights((6, 5), seed), _weights(6, seed + 1)
    mine = runtime.nn.Linear(5, 6)
    mine.load_state_dict({"weight": runtime.tensor(w), "bias": runtime.tensor(b)})
    theirs = torch.nn.Linear(5, 6)
    theirs.load_state_dict({"weight": torch.tensor(w), "bias": torch.tensor(b)})
    return mine, theirs


def _same_state(mine, theirs):
    a, b = mine.state_dict(), theirs.state_dict()
    assert list(a) == list(b)
    for key in a:
        np.testing.assert_array_equal(a[key].numpy(), b[key].detach().numpy(), err_msg=key)


def test_both_import_forms_give_the_module():
    from runtime.nn.utils import prune as imported

    assert imported is prune


def test_l1_unstructured_layout_without_torch():
    m = runtime.nn.Linear(4, 3)
    original = m.weight
    prune.l1_unstructured(m, "weight", amount=5)
    assert m.weight_orig is original and "weight" not in m._parameters
    assert list(m.state_dict()) == ["bias", "weight_orig", "weight_mask"]
    assert int(m.weight_mask.sum().item()) == 7
    kept = np.abs(original.detach().numpy())[m.weight_mask.numpy() == 1]
    pruned = np.abs(original.detach().numpy())[m.weight_mask.numpy() == 0]
    assert pruned.max() <= kept.min()
    np.testing.assert_array_equal(m.weight.detach().numpy(), original.detach().numpy() * m.weight_mask.numpy())
    assert prune.is_pruned(m) and not isinstance(m.weight, runtime.nn.Parameter)


@pytest.mark.parametrize("amount", [0.3, 7, 0, 1.0])
def test_l1_unstructured_matches_torch(torch, amount, tprune):
    mine, theirs = _linear_pair(torch)
    prune.l1_unstructured(mine, "weight", amount=amount)
    tprune.l1_unstructured(theirs, "weight", amount=amount)
    _same_state(mine, theirs)
    np.testing.assert_array_equal(mine.weight.detach().numpy(), theirs.weight.detach().numpy())


def test_forward_and_gradients_match_torch(torch, tprune):
    mine, theirs = _linear_pair(torch)
    prune.l1_unstructured(mine, "weight", amount=0.5)
    tprune.l1_unstructured(theirs, "weight", amount=0.5)
    x = _weights((3, 5), 7)
    out_mine, out_theirs = mine(runtime.tensor(x)), theirs(torch.tensor(x))
    np.testing.assert_allclose(out_mine.detach().numpy(), out_theirs.detach().numpy(), rtol=1e-6, atol=1e-6)
    (out_mine ** 2).sum().backward()
    (out_theirs ** 2).sum().backward()
    grad = mine.weight_orig.grad.numpy()
    np.testing.assert_allclose(grad, theirs.weight_orig.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert np.all(grad[mine.weight_mask.numpy() == 0] == 0) and np.any(grad != 0)


def test_hook_recomputes_weight_every_forward():
    m = runtime.nn.Linear(4, 2)
    prune.l1_unstructured(m, "weight", amount=2)
    with runtime.no_grad():
        m.weight_orig.add_(1.0)
        m.weight_mask.fill_(1.0)
    m(runtime.randn(1, 4))
    np.testing.assert_array_equal(m.weight.detach().numpy(), m.weight_orig.detach().numpy())


def test_importance_scores_decide_the_mask():
    m = runtime.nn.Linear(3, 2)
    scores = runtime.tensor([[5.0, 0.1, 3.0], [0.2, 4.0, 6.0]])
    prune.l1_unstructured(m, "weight", amount=2, importance_scores=scores)
    np.testing.assert_array_equal(m.weight_mask.numpy(), [[1, 0, 1], [0, 1, 1]])
    with pytest.raises(AssertionError, match="same shape"):
        prune.l1_unstructured(runtime.nn.Linear(3, 2), "weight", 1, importance_scores=runtime.ones(3))


def test_ties_prune_the_requested_count():
    # NOTE: among tied magnitudes torch's topk picks an unspecified entry (runtime may pick another), so only the
    # count and the ordering between pruned and kept magnitudes are checked
    m = runtime.nn.Linear(4, 2)
    with runtime.no_grad():
        m.weight.copy_(runtime.tensor([[1.0, -1.0, 1.0, 2.0], [1.0, 3.0, -1.0, 1.0]]))
    prune.l1_unstructured(m, "weight", amount=3)
    assert int((m.weight_mask == 0).sum().item()) == 3
    assert np.all(np.abs(m.weight_orig.detach().numpy())[m.weight_mask.numpy() == 0] == 1.0)


@pytest.mark.parametrize("n,dim,amount", [(2, 0, 2), (1, 1, 0.4), (float("inf"), -1, 1), ("fro", 0, 0.5)])
def test_ln_structured_matches_torch(torch, n, dim, amount, tprune):
    mine, theirs = _linear_pair(torch, seed=3)
    prune.ln_structured(mine, "weight", amount=amount, n=n, dim=dim)
    tprune.ln_structured(theirs, "weight", amount=amount, n=n, dim=dim)
    _same_state(mine, theirs)


def test_ln_structured_conv_channels():
    conv = runtime.nn.Conv2d(2, 4, 3)
    prune.ln_structured(conv, "weight", amount=0.5, n=2, dim=0)
    per_channel = conv.weight_mask.numpy().reshape(4, -1)
    assert sorted(per_channel.min(axis=1).tolist()) == [0, 0, 1, 1]
    assert np.all(per_channel.min(axis=1) == per_channel.max(axis=1))


def test_iterative_pruning_matches_torch(torch, tprune):
    mine, theirs = _linear_pair(torch, seed=5)
    for lib, m in ((prune, mine), (tprune, theirs)):
        lib.l1_unstructured(m, "weight", amount=0.2)
        lib.ln_structured(m, "weight", amount=2, n=1, dim=0)
        lib.l1_unstructured(m, "weight", amount=4)
    _same_state(mine, theirs)
    hooks = list(mine._forward_pre_hooks.values())
    assert len(hooks) == 1 and isinstance(hooks[0], prune.PruningContainer) and len(hooks[0]) == 3


def test_iterative_pruning_only_prunes_unpruned_entries():
    m = runtime.nn.Linear(5, 4)
    prune.l1_unstructured(m, "weight", amount=6)
    first = m.weight_mask.numpy().copy()
    prune.l1_unstructured(m, "weight", amount=4)
    assert int((m.weight_mask == 0).sum().item()) == 10
    assert np.all(m.weight_mask.numpy() <= first)


def test_global_unstructured_matches_torch(torch, tprune):
    mine = [_linear_pair(torch, seed=s) for s in (10, 20)]
    for lib, layers in ((prune, [p[0] for p in mine]), (tprune, [p[1] for p in mine])):
        lib.l1_unstructured(layers[0], "weight", amount=3)
        lib.global_unstructured([(layers[0], "weight"), (layers[1], "weight"), (layers[1], "bias")],
                                pruning_method=lib.L1Unstructured, amount=0.25)
    for a, b in mine:
        _same_state(a, b)


def test_global_unstructured_ranks_across_layers():
    small, large = runtime.nn.Linear(2, 2), runtime.nn.Linear(2, 2)
    with runtime.no_grad():
        small.weight.copy_(runtime.tensor([[0.1, 0.2], [0.3, 0.4]]))
        large.weight.copy_(runtime.tensor([[10.0, 20.0], [30.0, 0.05]]))
    prune.global_unstructured([(small, "weight"), (large, "weight")], pruning_method=prune.L1Unstructured, amount=4)
    np.testing.assert_array_equal(small.weight_mask.numpy(), [[0, 0], [0, 1]])
    np.testing.assert_array_equal(large.weight_mask.numpy(), [[1, 1], [1, 0]])
    with pytest.raises(TypeError, match="unstructured"):
        prune.global_unstructured([(small, "weight")], pruning_method=prune.LnStructured, amount=1, n=2, dim=0)


def test_custom_from_mask_and_identity():
    m = runtime.nn.Linear(2, 2)
    prune.custom_from_mask(m, "weight", mask=runtime.tensor([[1.0, 0.0], [0.0, 1.0]]))
    prune.identity(m, "bias")
    np.testing.assert_array_equal(m.weight.detach().numpy()[[0, 1], [1, 0]], [0, 0])
    np.testing.assert_array_equal(m.bias_mask.numpy(), [1, 1])
    assert list(m.state_dict()) == ["weight_orig", "bias_orig", "weight_mask", "bias_mask"]


def test_random_methods_prune_the_requested_count():
    m = runtime.nn.Conv2d(3, 6, 3)
    prune.random_unstructured(m, "weight", amount=0.25)
    assert int((m.weight_mask == 0).sum().item()) == round(0.25 * 162)
    prune.random_structured(m, "weight", amount=2, dim=0)
    channel_max = m.weight_mask.numpy().reshape(6, -1).max(axis=1)
    assert int((channel_max == 0).sum()) == 2


def test_remove_matches_torch(torch, tprune):
    mine, theirs = _linear_pair(torch, seed=2)
    for lib, m in ((prune, mine), (tprune, theirs)):
        lib.l1_unstructured(m, "weight", amount=0.5)
        lib.remove(m, "weight")
    _same_state(mine, theirs)
    assert isinstance(mine.weight, runtime.nn.Parameter) and not prune.is_pruned(mine)
    assert not hasattr(mine, "weight_orig") and not hasattr(mine, "weight_mask")


def test_remove_keeps_the_pruned_values_as_the_parameter():
    m = runtime.nn.Linear(3, 3)
    prune.l1_unstructured(m, "weight", amount=4)
    pruned = m.weight.detach().numpy().copy()
    orig = m.weight_orig
    prune.remove(m, "weight")
    assert m.weight is orig and list(m.state_dict()) == ["bias", "weight"]
    np.testing.assert_array_equal(m.weight.detach().numpy(), pruned)
    with pytest.raises(ValueError, match="has to be pruned before pruning can be removed"):
        prune.remove(m, "weight")


@pytest.mark.parametrize("amount,error,message", [
    (-1, ValueError, "non-negative integer"), (1.5, ValueError, "range"), ("a", TypeError, "Invalid type"),
    (31, ValueError, "should be smaller than the number of parameters")])
def test_bad_amount_errors(amount, error, message):
    m = runtime.nn.Linear(5, 6)
    with pytest.raises(error, match=message):
        prune.l1_unstructured(m, "weight", amount=amount)
    assert "weight" in m._parameters and not prune.is_pruned(m)


def test_bad_amount_errors_match_torch(torch, tprune):
    for amount in (-1, 1.5, 31):
        with pytest.raises(ValueError) as mine:
            prune.l1_unstructured(runtime.nn.Linear(5, 6), "weight", amount=amount)
        with pytest.raises(ValueError) as theirs:
            tprune.l1_unstructured(torch.nn.Linear(5, 6), "weight", amount=amount)
        assert str(mine.value) == str(theirs.value)


def test_structured_pruning_needs_two_dims():
    with pytest.raises(ValueError, match="multidimensional"):
        prune.ln_structured(runtime.nn.Linear(3, 2), "bias", amount=1, n=2, dim=0)


# -- nnc ---------------------------------------------------------------------------------------------------


class _Net(runtime.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = runtime.nn.Linear(5, 8), runtime.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class _OwnWeight(runtime.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = runtime.nn.Parameter(runtime.randn(3, 5))

    def forward(self, x):
        return (x @ self.weight.t()).tanh()


def _pruned(make):
    runtime.manual_seed(0)
    model = make()
    for m in model.modules():
        if "weight" in m._parameters:
            prune.l1_unstructured(m, "weight", amount=0.4)
    return model


def _train(model, steps=3, prune_at=None, prune_module=None):
    """Losses of a few SGD steps; at step `prune_at`, prunes `prune_module(model)`'s weight further."""
    opt = runtime.optim.SGD(list(model.parameters()), lr=0.1)
    runtime.manual_seed(1)
    losses = []
    for step in range(steps):
        if step == prune_at:
            prune.l1_unstructured(prune_module(model), "weight", amount=3)
        x, y = runtime.randn(4, 5), runtime.randn(4, 3)
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _assert_same_training(eager, compiled_root, losses_eager, losses_compiled):
    np.testing.assert_allclose(losses_compiled, losses_eager, rtol=1e-6)
    a, b = eager.state_dict(), compiled_root.state_dict()
    assert list(a) == list(b)
    for key in a:
        np.testing.assert_allclose(b[key].numpy(), a[key].numpy(), rtol=1e-6, atol=1e-7, err_msg=key)
    for (name, p), q in zip(eager.named_parameters(), compiled_root.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("make", [_Net, lambda: runtime.nn.Linear(5, 3), _OwnWeight])
def test_compiled_pruned_model_trains_as_eager(make):
    eager, model = _pruned(make), _pruned(make)
    compiled = nnc.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a pruned root runs eagerly, with a warning
        losses = _train(compiled)
    _assert_same_training(eager, model, _train(eager), losses)
    assert any(np.all(p.grad.numpy()[model.get_buffer(n[:-5] + "_mask").numpy() == 0] == 0)
               for n, p in model.named_parameters() if n.endswith("_orig"))


def test_explain_keeps_the_rest_of_a_pruned_model_compiled():
    model = _pruned(_Net)
    report = str(nnc.explain(model, runtime.randn(4, 5)))
    assert "opaque node fc1: the module has hooks" in report and "relu" in report


def test_compiled_root_with_a_pruned_weight_is_not_frozen():
    # NOTE: a pruned root's `weight` is a plain attribute its pre-hook recomputes; a trace would freeze it
    model = _pruned(lambda: runtime.nn.Linear(5, 3))
    compiled = nnc.compile(model)
    x = runtime.randn(2, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        compiled(x)
        with runtime.no_grad():
            model.weight_orig.mul_(2.0)
        out = compiled(x)
    np.testing.assert_allclose(out.detach().numpy(), model(x).detach().numpy(), rtol=1e-6)


@pytest.mark.parametrize("make,pick", [(_Net, lambda m: m.fc1), (_OwnWeight, lambda m: m)])
def test_pruning_after_compiling_is_picked_up(make, pick):
    runtime.manual_seed(0)
    eager = make()
    runtime.manual_seed(0)
    model = make()
    compiled = nnc.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        losses = _train(compiled, steps=4, prune_at=2, prune_module=lambda c: pick(model))
    _assert_same_training(eager, model, _train(eager, steps=4, prune_at=2, prune_module=pick), losses)
    assert prune.is_pruned(model)
