"""autocast: layers give torch's dtypes, and a compiled model computes what eager computes inside and outside it."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import nnc
import runtime
from runtime import nn

from helpers import needs_torch, torch


def _model(lib):
    lib.manual_seed(0)
    return lib.nn.Sequential(lib.nn.Conv2d(2, 4, 3, padding=1), lib.nn.ReLU(), lib.nn.Flatten(),
                             lib.nn.Linear(4 * 5 * 5, 6), lib.nn.Tanh(), lib.nn.Linear(6, 3))


LOW = ["float16", "bfloat16"]


@needs_torch
@pytest.mark.parametrize("low", LOW)
def test_layers_inside_autocast_give_torchs_dtypes_and_values(low):
    ours, theirs = _model(runtime), _model(torch)
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 2, 5, 5)).astype(np.float32)
    with runtime.autocast("cpu", dtype=getattr(runtime, low)):
        got = [ours[0](runtime.tensor(x)), ours(runtime.tensor(x))]
    with torch.autocast("cpu", dtype=getattr(torch, low)):
        want = [theirs[0](torch.tensor(x)), theirs(torch.tensor(x))]
    for a, b in zip(got, want):
        assert a.dtype.name == str(b.dtype).removeprefix("torch.") == low
        np.testing.assert_allclose(a.detach().float().numpy(), b.detach().float().numpy(),
                                   rtol=2e-2, atol=2e-2)  # low-precision rounding: torch accumulates differently


@needs_torch
def test_cpu_autocast_defaults_to_bfloat16_as_torchs():
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    with runtime.autocast("cpu"):
        ours = runtime.tensor(x) @ runtime.tensor(x).T
    with torch.autocast("cpu"):
        theirs = torch.tensor(x) @ torch.tensor(x).T
    assert ours.dtype is runtime.bfloat16 and theirs.dtype == torch.bfloat16
    np.testing.assert_array_equal(ours.float().numpy(), theirs.float().numpy())


def _step(model, x, autocast, low="float16"):
    for p in model.parameters():
        p.grad = None
    with runtime.autocast("cpu", dtype=getattr(runtime, low), enabled=autocast):
        out = model(x)
    out.float().pow(2).sum().backward()
    return [out.detach().float().numpy()] + [p.grad.numpy().copy() for p in model.parameters()] + [str(out.dtype)]


@pytest.mark.parametrize("low", LOW)
def test_compiled_model_matches_eager_inside_and_after_autocast(low):
    eager = _model(runtime)
    compiled = nnc.compile(copy.deepcopy(eager))
    x = runtime.randn(2, 2, 5, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # low-precision kernels run in the interpreter on the CPU
        for autocast in (True, False, True):  # each mode compiles once; the first is reused after the second
            got, want = _step(compiled, x, autocast, low), _step(eager, x, autocast, low)
            assert got[-1] == want[-1] == (f"runtime.{low}" if autocast else "runtime.float32")
            for a, b in zip(got[:-1], want[:-1]):  # float16 rounding, if lost, is ~1e-3 relative
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert len(compiled._cache) == 2


def test_no_grad_inference_inside_autocast_matches_eager():
    eager = _model(runtime)
    compiled = nnc.compile(copy.deepcopy(eager))
    x = runtime.randn(1, 2, 5, 5)
    with warnings.catch_warnings(), runtime.no_grad(), runtime.autocast("cpu", dtype=runtime.float16):
        warnings.simplefilter("ignore", RuntimeWarning)
        got, want = compiled(x), eager(x)
    assert got.dtype is want.dtype is runtime.float16
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_bias_follows_the_autocast_dtype(bias):
    layer = nn.Linear(3, 2, bias=bias)
    with runtime.autocast("cpu", dtype=runtime.float16):
        assert layer(runtime.randn(4, 3)).dtype is runtime.float16
    assert layer(runtime.randn(4, 3)).dtype is runtime.float32


_FLOAT32_UNDER_AUTOCAST = {
    "mse_loss": lambda lib, x, t, p, labels: lib.nn.functional.mse_loss(x, t),
    "l1_loss": lambda lib, x, t, p, labels: lib.nn.functional.l1_loss(x, t),
    "smooth_l1_loss": lambda lib, x, t, p, labels: lib.nn.functional.smooth_l1_loss(x, t),
    "huber_loss": lambda lib, x, t, p, labels: lib.nn.functional.huber_loss(x, t),
    "nll_loss": lambda lib, x, t, p, labels: lib.nn.functional.nll_loss(x, labels),
    "cross_entropy": lambda lib, x, t, p, labels: lib.nn.CrossEntropyLoss(label_smoothing=0.1)(x, labels),
    "kl_div": lambda lib, x, t, p, labels: lib.nn.functional.kl_div(x, p, reduction="batchmean"),
    "binary_cross_entropy": lambda lib, x, t, p, labels: lib.nn.functional.binary_cross_entropy(p, p * 0.5),
    "bce_with_logits": lambda lib, x, t, p, labels: lib.nn.functional.binary_cross_entropy_with_logits(x, p),
    "soft_margin_loss": lambda lib, x, t, p, labels: lib.nn.functional.soft_margin_loss(x, t.sign()),
    "multi_margin_loss": lambda lib, x, t, p, labels: lib.nn.functional.multi_margin_loss(x, labels),
    "poisson_nll_loss": lambda lib, x, t, p, labels: lib.nn.functional.poisson_nll_loss(x, p),
    "prod": lambda lib, x, t, p, labels: (x * 0.1 + 1).prod(),
    "cdist": lambda lib, x, t, p, labels: lib.cdist(x, t),
    "trace": lambda lib, x, t, p, labels: x[:, :4].trace(),
    "einsum": lambda lib, x, t, p, labels: lib.einsum("ij,kj->ik", x.float(), t.float()),
    "sum_stays_low": lambda lib, x, t, p, labels: x.sum(),
}


@needs_torch
@pytest.mark.parametrize("name", sorted(_FLOAT32_UNDER_AUTOCAST))
def test_autocast_runs_losses_in_float32_and_einsum_low_as_torch(name):
    """torch's CPU autocast computes its losses (and prod, cdist, trace) in float32 from bfloat16 activations, so a
    loss's .item() is not rounded to bfloat16; einsum runs as bmm, in the low dtype."""
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((2, 4, 5)).astype(np.float32)
    p = rng.uniform(0.05, 0.95, (4, 5)).astype(np.float32)
    results = []
    for lib in (runtime, torch):
        args = [lib.tensor(v).bfloat16() for v in (x, t, p)] + [lib.tensor([0, 1, 2, 3])]
        with lib.autocast("cpu", dtype=lib.bfloat16):
            results.append(_FLOAT32_UNDER_AUTOCAST[name](lib, *args))
    ours, theirs = results
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    np.testing.assert_allclose(ours.float().numpy(), theirs.float().numpy(), rtol=1e-2, atol=1e-2)


def test_a_compiled_loss_under_autocast_is_float32_as_eager():
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))
    compiled = nnc.compile(copy.deepcopy(model))
    x, labels = runtime.randn(4, 8), runtime.tensor([0, 1, 2, 3])
    losses = []
    for m in (model, compiled):
        with runtime.autocast("cpu"):
            loss = nn.functional.cross_entropy(m(x), labels)
        loss.backward()
        losses.append(loss)
    assert losses[0].dtype is losses[1].dtype is runtime.float32
    np.testing.assert_allclose(losses[1].item(), losses[0].item(), rtol=1e-6)
    for a, b in zip(compiled.parameters(), model.parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_the_deprecated_cpu_amp_namespace_autocasts_and_warns_as_torch():
    """`torch.cpu.amp.autocast()` (older scripts) is torch.amp.autocast('cpu') with a FutureWarning; torch.cpu
    answers as the one, synchronous CPU device."""
    linear = nn.Linear(3, 3)
    with pytest.warns(FutureWarning, match="torch.amp.autocast"):
        with runtime.cpu.amp.autocast():
            assert linear(runtime.randn(2, 3)).dtype is runtime.bfloat16
    assert linear(runtime.randn(2, 3)).dtype is runtime.float32
    with pytest.warns(FutureWarning, match="GradScaler"):
        assert runtime.cpu.amp.GradScaler(enabled=False).is_enabled() is False
    assert runtime.cpu.is_available() and runtime.cpu.device_count() == 1 and runtime.cpu.current_device() == "cpu"
    runtime.cpu.synchronize()
