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


@needs_torch
def test_layers_inside_autocast_give_torchs_dtypes_and_values():
    ours, theirs = _model(runtime), _model(torch)
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 2, 5, 5)).astype(np.float32)
    with runtime.autocast("cpu", dtype=runtime.float16):
        got = [ours[0](runtime.tensor(x)), ours(runtime.tensor(x))]
    with torch.autocast("cpu", dtype=torch.float16):
        want = [theirs[0](torch.tensor(x)), theirs(torch.tensor(x))]
    for a, b in zip(got, want):
        assert a.dtype.name == str(b.dtype).removeprefix("torch.") == "float16"
        np.testing.assert_allclose(a.detach().numpy().astype(np.float32), b.detach().numpy().astype(np.float32),
                                   rtol=2e-2, atol=2e-2)  # float16 rounding: torch accumulates differently


def _step(model, x, autocast):
    for p in model.parameters():
        p.grad = None
    with runtime.autocast("cpu", dtype=runtime.float16, enabled=autocast):
        out = model(x)
    out.float().pow(2).sum().backward()
    return [out.detach().float().numpy()] + [p.grad.numpy().copy() for p in model.parameters()] + [str(out.dtype)]


def test_compiled_model_matches_eager_inside_and_after_autocast():
    eager = _model(runtime)
    compiled = nnc.compile(copy.deepcopy(eager))
    x = runtime.randn(2, 2, 5, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # float16 kernels run in the interpreter on the CPU
        for autocast in (True, False, True):  # each mode compiles once; the first is reused after the second
            got, want = _step(compiled, x, autocast), _step(eager, x, autocast)
            assert got[-1] == want[-1] == ("runtime.float16" if autocast else "runtime.float32")
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
