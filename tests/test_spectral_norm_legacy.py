"""torch.nn.utils.spectral_norm / remove_spectral_norm, the hook-based form: <name>_orig with buffers <name>_u and
<name>_v updated by power iteration in training mode (kept in eval mode), forward and gradients equal to torch's over
several steps, torch's state dict keys and version metadata, the conversion of a pre-1.0 state dict, removal and
errors; and a compiled discriminator with the hook trains as eagerly."""
from collections import OrderedDict

import numpy as np
import pytest

import runtime
from helpers import needs_torch
from runtime import nn


def _copy_from_torch(state_dict):
    ours = OrderedDict((k, runtime.tensor(v.detach().numpy())) for k, v in state_dict.items())
    ours._metadata = state_dict._metadata
    return ours


@needs_torch
@pytest.mark.parametrize("make", ["Linear(5, 4)", "Conv2d(3, 4, 3)", "ConvTranspose2d(3, 4, 3)"])
def test_training_and_eval_steps_match_torch(torch, make):
    theirs, ours = eval("torch.nn." + make).double(), eval("nn." + make).double()
    torch.nn.utils.spectral_norm(theirs, n_power_iterations=2)
    nn.utils.spectral_norm(ours, n_power_iterations=2)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["bias", "weight_orig", "weight_u", "weight_v"]
    ours.load_state_dict(_copy_from_torch(theirs.state_dict()))  # the same random start of u and v
    x = np.random.default_rng(0).standard_normal((2, 5) if make.startswith("Linear") else (2, 3, 6, 6))
    for _ in range(3):
        want, got = theirs(torch.tensor(x)), ours(runtime.tensor(x))
        want.square().sum().backward()
        got.square().sum().backward()
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-12)
    for name in ("weight_orig", "bias"):
        np.testing.assert_allclose(getattr(ours, name).grad.numpy(), getattr(theirs, name).grad.numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=name)
    for name in ("weight_u", "weight_v"):
        np.testing.assert_allclose(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), rtol=1e-10, atol=1e-12)
    theirs.eval(), ours.eval()
    u = ours.weight_u.clone()
    np.testing.assert_allclose(ours(runtime.tensor(x)).detach().numpy(), theirs(torch.tensor(x)).detach().numpy(),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(ours.weight_u.numpy(), u.numpy())  # eval mode: no power iteration
    torch.nn.utils.remove_spectral_norm(theirs)
    assert nn.utils.remove_spectral_norm(ours) is ours
    assert list(ours.state_dict()) == list(theirs.state_dict()) and isinstance(ours.weight, nn.Parameter)
    np.testing.assert_allclose(ours.weight.detach().numpy(), theirs.weight.detach().numpy(), rtol=1e-10)
    assert not (ours._forward_pre_hooks or ours._state_dict_hooks or ours._load_state_dict_pre_hooks)


@needs_torch
def test_version_metadata_and_a_pre_1_0_state_dict_load_as_in_torch(torch):
    theirs = torch.nn.utils.spectral_norm(torch.nn.Linear(4, 3).double())
    ours = nn.utils.spectral_norm(nn.Linear(4, 3).double())
    assert ours.state_dict()._metadata[""]["spectral_norm"] == theirs.state_dict()._metadata[""]["spectral_norm"]
    old = theirs.state_dict()  # as torch < 1.0 saved it: the weight itself, no v, no version
    old["weight"] = theirs.weight.detach()
    del old["weight_v"]
    old._metadata[""].pop("spectral_norm")
    theirs.load_state_dict(old)
    ours.load_state_dict(_copy_from_torch(old))
    np.testing.assert_allclose(ours.weight_v.numpy(), theirs.weight_v.numpy(), rtol=1e-8, atol=1e-12)


def test_errors_name_the_parameter():
    model = nn.utils.spectral_norm(nn.Linear(3, 2))
    with pytest.raises(RuntimeError, match="Cannot register two spectral_norm hooks on the same parameter weight"):
        nn.utils.spectral_norm(model)
    with pytest.raises(ValueError, match="spectral_norm of 'bias' not found in Linear"):
        nn.utils.remove_spectral_norm(model, "bias")
    with pytest.raises(ValueError, match="Expected n_power_iterations to be positive, but got n_power_iterations=0"):
        nn.utils.spectral_norm(nn.Linear(3, 2), n_power_iterations=0)


def test_normalize_writes_into_out():
    x, out = runtime.tensor([3.0, 4.0]), runtime.empty(2)
    assert nn.functional.normalize(x, dim=0, out=out) is out
    np.testing.assert_allclose(out.numpy(), [0.6, 0.8])


def test_a_compiled_discriminator_with_the_hook_trains_as_eager():
    import nnc

    def discriminator():
        runtime.manual_seed(0)
        return nn.Sequential(nn.utils.spectral_norm(nn.Conv2d(1, 4, 3, stride=2)), nn.LeakyReLU(0.2), nn.Flatten(),
                             nn.utils.spectral_norm(nn.Linear(4 * 3 * 3, 1)))

    eager, twin = discriminator(), discriminator()
    compiled = nnc.compile(twin)
    x = runtime.randn(5, 1, 8, 8)
    for model in (eager, compiled):
        optimizer = runtime.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(3):
            optimizer.zero_grad()
            model(x).mean().backward()
            optimizer.step()
    for (name, a), b in zip(eager.state_dict().items(), twin.state_dict().values()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
