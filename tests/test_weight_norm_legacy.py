"""torch.nn.utils.weight_norm / remove_weight_norm, the hook-based form: parameters <name>_g and <name>_v with torch's
state dict keys, the weight recomputed before every forward, forward and gradients equal to torch's, removal, errors,
and a compiled model with the hook trains as eagerly."""
import warnings

import numpy as np
import pytest

import runtime
from helpers import needs_torch
from runtime import nn


def _weight_norm(module, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return nn.utils.weight_norm(module, **kwargs)


def test_it_warns_as_deprecated_like_torch():
    with pytest.warns(FutureWarning, match="in favor of `torch.nn.utils.parametrizations.weight_norm`"):
        nn.utils.weight_norm(nn.Linear(3, 4))


@needs_torch
@pytest.mark.parametrize("dim", [0, 1, None, -1, 2])
def test_forward_gradients_and_state_dict_match_torch(torch, dim):
    rng = np.random.default_rng(0)
    theirs = torch.nn.Conv1d(3, 4, 5).double()
    ours = nn.Conv1d(3, 4, 5).double()
    ours.load_state_dict({k: runtime.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.nn.utils.weight_norm(theirs, dim=dim)
    _weight_norm(ours, dim=dim)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["bias", "weight_g", "weight_v"]
    assert tuple(ours.weight_g.shape) == tuple(theirs.weight_g.shape)
    x = rng.standard_normal((2, 3, 9))
    want, got = theirs(torch.tensor(x)), ours(runtime.tensor(x))
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    want.square().sum().backward()
    got.square().sum().backward()
    for name in ("weight_g", "weight_v", "bias"):
        np.testing.assert_allclose(getattr(ours, name).grad.numpy(), getattr(theirs, name).grad.numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=name)


@needs_torch
def test_a_torch_checkpoint_loads_and_removal_keeps_the_weight(torch):
    theirs = torch.nn.Linear(3, 4).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.nn.utils.weight_norm(theirs)
    ours = _weight_norm(nn.Linear(3, 4).double())
    ours.load_state_dict({k: runtime.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})
    torch.nn.utils.remove_weight_norm(theirs)
    assert nn.utils.remove_weight_norm(ours) is ours
    assert isinstance(ours.weight, nn.Parameter) and list(ours.state_dict()) == list(theirs.state_dict())
    np.testing.assert_allclose(ours.weight.detach().numpy(), theirs.weight.detach().numpy(), rtol=1e-12)
    assert not ours._forward_pre_hooks


def test_the_weight_follows_g_and_v_at_every_forward():
    model = _weight_norm(nn.Linear(3, 2))
    optimizer = runtime.optim.SGD(model.parameters(), lr=0.5)
    x = runtime.randn(4, 3)
    model(x).sum().backward()
    optimizer.step()
    before = model.weight.detach().clone()
    model(x)  # the hook recomputes it from the stepped g and v
    g, v = model.weight_g.detach().numpy(), model.weight_v.detach().numpy()
    np.testing.assert_allclose(model.weight.detach().numpy(), v * g / np.linalg.norm(v, axis=1, keepdims=True),
                               rtol=1e-6)
    assert not np.allclose(model.weight.detach().numpy(), before.numpy())


def test_errors_name_the_parameter():
    model = _weight_norm(nn.Linear(3, 2))
    with pytest.raises(RuntimeError, match="Cannot register two weight_norm hooks on the same parameter weight"):
        _weight_norm(model)
    with pytest.raises(ValueError, match="weight_norm of 'bias' not found in Linear"):
        nn.utils.remove_weight_norm(model, "bias")


def test_a_compiled_model_with_the_hook_trains_as_eager():
    import nnc

    def model():  # NOTE: not deepcopy: the computed weight is no leaf, which torch's deepcopy refuses too
        runtime.manual_seed(0)
        return nn.Sequential(_weight_norm(nn.Linear(6, 8)), nn.Tanh(), _weight_norm(nn.Linear(8, 2), dim=None))

    eager, twin = model(), model()
    compiled = nnc.compile(twin)
    x = runtime.randn(5, 6)
    for model in (eager, compiled):
        optimizer = runtime.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            model(x).square().sum().backward()
            optimizer.step()
    for (name, a), b in zip(eager.named_parameters(), twin.parameters()):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


class _TemporalBlock(nn.Module):
    """A TCN block: a dilated causal Conv1d under weight_norm, chomped, plus a 1x1 residual."""

    def __init__(self, channels=4, kernel=3, dilation=2):
        super().__init__()
        self.chomp = (kernel - 1) * dilation
        self.conv = _weight_norm(nn.Conv1d(channels, channels, kernel, padding=self.chomp, dilation=dilation))
        self.out = _weight_norm(nn.Linear(channels, 2), dim=None)

    def forward(self, x):
        y = runtime.relu(self.conv(x)[:, :, :-self.chomp] + x)
        return self.out(y.transpose(1, 2))


def test_weight_normed_layers_compile_with_their_hook_inline():
    """The hook's weight is a traced value: the model compiles whole (no eager module), gives eager's outputs and
    gradients, and leaves each module's weight as eager mode does, with its gradient history."""
    import nnc

    runtime.manual_seed(4)
    model = _TemporalBlock()
    x = runtime.randn(2, 4, 9)
    compiled = nnc.compile(model)
    results = []
    for fn in (model, compiled):
        model.zero_grad()
        out = fn(x)
        out.square().sum().backward()
        weight = model.conv.weight
        assert weight.grad_fn is not None
        results.append([out.detach().numpy(), weight.detach().numpy()]
                       + [p.grad.numpy().copy() for p in model.parameters()])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (artifact,) = compiled._cache.values()
    assert not artifact.opaque and not artifact.graph_breaks
    assert sorted(artifact.set_attributes) == [("conv", "weight"), ("out", "weight")]


def test_a_weight_normed_layer_compiled_by_itself_runs_its_hook_in_the_graph():
    """The root's hook runs eagerly before each call (it sees the wrapped model) and inline in the trace, so the
    layer compiles (it used to run eagerly with a warning) and its weight and gradients are eager's."""
    import nnc

    runtime.manual_seed(5)
    layer, twin = _weight_norm(nn.Linear(3, 2)), _weight_norm(nn.Linear(3, 2))
    twin.load_state_dict(layer.state_dict())
    compiled = nnc.compile(twin)
    x = runtime.randn(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for model in (layer, compiled):
            model(x).square().sum().backward()
    np.testing.assert_allclose(twin.weight.detach().numpy(), layer.weight.detach().numpy(), rtol=1e-6)
    for name in ("weight_g", "weight_v", "bias"):
        np.testing.assert_allclose(getattr(twin, name).grad.numpy(), getattr(layer, name).grad.numpy(), rtol=1e-5,
                                   atol=1e-7, err_msg=name)
    (artifact,) = compiled._cache.values()
    assert artifact.set_attributes == [("", "weight")]
