"""runtime.func.functional_call (torch.func.functional_call): a module run with other parameters and buffers for
one call gives torch's outputs, sends gradients to the given tensors (a MAML inner loop's meta-gradient equals
torch's), follows tied weights, checks keys when strict, and always puts the module's own tensors back."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
import runtime.nn as nn
from runtime.func import functional_call

from helpers import needs_torch


def _net(lib):
    lib.manual_seed(0)
    net = lib.nn.Sequential(lib.nn.Linear(3, 5), lib.nn.Tanh(), lib.nn.Linear(5, 1)).double()
    return net


def _same_weights(ours, theirs):
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        q.data.copy_(q.new_tensor(p.detach().numpy()))


@needs_torch
def test_a_maml_inner_step_gives_torchs_meta_gradient(torch):
    """fast = params - lr * grad(inner loss, create_graph) then the outer loss through functional_call: the
    gradient reaching the original parameters is torch's."""
    rng = np.random.default_rng(1)
    x_in, y_in, x_out, y_out = (rng.standard_normal(s) for s in ((8, 3), (8, 1), (6, 3), (6, 1)))
    nets = {"ours": (runtime, _net(runtime)), "theirs": (torch, _net(torch))}
    _same_weights(nets["ours"][1], nets["theirs"][1])
    grads = {}
    for key, (lib, net) in nets.items():
        params = dict(net.named_parameters())
        inner = ((lib.func.functional_call(net, params, (lib.tensor(x_in),)) - lib.tensor(y_in)) ** 2).mean()
        steps = lib.autograd.grad(inner, list(params.values()), create_graph=True)
        fast = {name: p - 0.1 * g for (name, p), g in zip(params.items(), steps)}
        outer = ((lib.func.functional_call(net, fast, lib.tensor(x_out)) - lib.tensor(y_out)) ** 2).mean()
        outer.backward()
        grads[key] = [outer.item()] + [p.grad.numpy() for p in net.parameters()]
    for got, want in zip(grads["ours"], grads["theirs"]):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_gradients_go_to_the_given_tensors_and_the_module_is_put_back():
    net = _net(runtime)
    own = {name: p.detach().numpy().copy() for name, p in net.named_parameters()}
    given = {name: (p.detach() * 2).requires_grad_(True) for name, p in net.named_parameters()}
    out = functional_call(net, given, runtime.ones(4, 3, dtype=runtime.float64))
    out.sum().backward()
    assert all(t.grad is not None for t in given.values())
    assert all(p.grad is None for p in net.parameters())
    for name, p in net.named_parameters():
        assert isinstance(p, nn.Parameter)
        np.testing.assert_array_equal(p.detach().numpy(), own[name])
    with pytest.raises(ValueError, match="boom"):  # put back after a failing forward too
        functional_call(_Raising(net), {"net." + k: v for k, v in given.items()}, runtime.ones(1))
    for name, p in net.named_parameters():
        np.testing.assert_array_equal(p.detach().numpy(), own[name])


class _Raising(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        raise ValueError("boom")


def test_buffers_are_replaced_for_the_call():
    bn = nn.BatchNorm1d(2).eval()
    x = runtime.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = functional_call(bn, {"running_mean": runtime.tensor([1.0, 1.0]), "running_var": runtime.tensor([4.0, 4.0])},
                          x)
    np.testing.assert_allclose(out.detach().numpy(), (x.numpy() - 1.0) / np.sqrt(4.0 + bn.eps), rtol=1e-6)
    np.testing.assert_array_equal(bn.running_mean.numpy(), [0.0, 0.0])


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, ids):
        return self.head(self.embedding(ids))


def test_tied_weights_follow_the_one_given_unless_asked_not_to():
    model, ids = TiedLM(), runtime.tensor([1, 3])
    new = runtime.randn(5, 3)
    tied = functional_call(model, {"embedding.weight": new}, ids)
    np.testing.assert_allclose(tied.detach().numpy(), (new.numpy()[[1, 3]] @ new.numpy().T), rtol=1e-5)
    untied = functional_call(model, {"embedding.weight": new}, ids, tie_weights=False)
    np.testing.assert_allclose(untied.detach().numpy(), new.numpy()[[1, 3]] @ model.head.weight.detach().numpy().T,
                               rtol=1e-5)
    with pytest.raises(ValueError, match="tied"):
        functional_call(model, {"embedding.weight": new, "head.weight": runtime.randn(5, 3)}, ids)


def test_strict_keys_and_dictionaries_in_a_sequence():
    net = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match=r"reparametrizing for Linear:\n\tUnexpected key\(s\): 'extra'\.\n\t"
                                           r"Missing key\(s\): 'bias'\."):
        functional_call(net, {"weight": runtime.ones(2, 2), "extra": runtime.ones(1)}, runtime.ones(1, 2),
                        strict=True)
    out = functional_call(net, ({"weight": runtime.ones(2, 2)}, {"bias": runtime.zeros(2)}), runtime.ones(1, 2))
    np.testing.assert_array_equal(out.detach().numpy(), [[2.0, 2.0]])
    with pytest.raises(ValueError, match="multiple dictionaries"):
        functional_call(net, ({"bias": runtime.zeros(2)}, {"bias": runtime.zeros(2)}), runtime.ones(1, 2))


def test_the_stateless_spelling_warns_as_deprecated():
    with pytest.warns(FutureWarning, match="torch.func.functional_call"):
        out = nn.utils.stateless.functional_call(nn.Linear(2, 1), {"weight": runtime.ones(1, 2),
                                                                   "bias": runtime.zeros(1)}, runtime.ones(1, 2))
    assert out.item() == 2.0
