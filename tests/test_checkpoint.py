"""torch.utils.checkpoint: the same gradients as without it, no intermediate values kept, torch's errors."""
from __future__ import annotations

import gc
import warnings
import weakref

import numpy as np
import pytest

import runtime
from runtime import nn
from runtime.utils import checkpoint as ck

from helpers import needs_torch, torch


def _block(lib, seed=0):
    lib.manual_seed(seed)
    return lib.nn.Sequential(lib.nn.Linear(6, 12), lib.nn.GELU(), lib.nn.Dropout(0.25), lib.nn.Linear(12, 6),
                             lib.nn.LayerNorm(6)).double()


def _run(lib, block, x, mode, seed=7):
    """Loss and gradients (parameters, then input) of head(block(x)) with block checkpointed as `mode` says."""
    for p in block.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    lib.manual_seed(seed)
    if mode == "plain":
        h = block(x)
    else:
        h = lib.utils.checkpoint.checkpoint(block, x, use_reentrant=mode == "reentrant")
    loss = (h.tanh() * h).sum()
    loss.backward()
    return [loss.detach().numpy().copy()] + [p.grad.numpy().copy() for p in block.parameters()] + \
        [x.grad.numpy().copy()]


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpoint_gives_the_plain_gradients_with_dropout(mode):
    block = _block(runtime)
    x = runtime.randn(5, 6, dtype=runtime.float64)
    for got, want in zip(_run(runtime, block, x, mode), _run(runtime, block, x, "plain")):
        np.testing.assert_array_equal(got, want)  # the same random mask is drawn again: the same numbers


@needs_torch
@pytest.mark.parametrize("mode", ["plain", "reentrant", "non_reentrant"])
def test_checkpoint_matches_torch(mode):
    ours, theirs = _block(runtime), _block(torch)
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    for m in (ours, theirs):
        m.eval()  # the two libraries draw different dropout masks
    x = np.random.default_rng(0).standard_normal((5, 6))
    got = _run(runtime, ours, runtime.tensor(x), mode)
    want = _run(torch, theirs, torch.tensor(x), mode)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_non_reentrant_checkpoint_gives_parameter_gradients_when_no_input_requires_grad():
    block = _block(runtime)
    block.eval()
    x = runtime.randn(3, 6, dtype=runtime.float64)
    out = ck.checkpoint(block, x, use_reentrant=False)
    out.sum().backward()
    got = [p.grad.numpy().copy() for p in block.parameters()]
    block.zero_grad()
    block(x).sum().backward()
    for a, p in zip(got, block.parameters()):
        np.testing.assert_array_equal(a, p.grad.numpy())


def test_reentrant_checkpoint_warns_and_gives_no_gradients_when_no_input_requires_grad():
    block = _block(runtime)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        out = ck.checkpoint(block, runtime.randn(3, 6, dtype=runtime.float64), use_reentrant=True)
    assert not out.requires_grad


def test_use_reentrant_must_be_passed_or_it_warns_and_means_true():
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly"):
        out = ck.checkpoint(lambda t: t * 2, runtime.ones(2, requires_grad=True))
    assert out.grad_fn.name() == "CheckpointFunctionBackward"  # torch's name


def _activation_refs(store):
    """A function whose intermediate values' arrays are recorded (by weak reference) in `store`."""
    def fn(x):
        a = x.exp()
        b = (a * 3).sin()
        store.extend(weakref.ref(t.detach().numpy()) for t in (a, b))
        return b.sum(-1)
    return fn


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpoint_keeps_no_intermediate_values_after_forward(mode):
    x = runtime.randn(64, 64, dtype=runtime.float64, requires_grad=True)
    plain = []
    kept = _activation_refs(plain)(x)
    gc.collect()
    assert all(ref() is not None for ref in plain)  # without checkpointing the graph holds them
    refs = []
    out = ck.checkpoint(_activation_refs(refs), x, use_reentrant=mode == "reentrant")
    gc.collect()
    assert len(refs) == 2 and all(ref() is None for ref in refs)
    out.sum().backward()
    want = x.grad.clone()
    x.grad = None
    kept.sum().backward()
    np.testing.assert_allclose(want.numpy(), x.grad.numpy(), rtol=1e-12)


def test_non_reentrant_backward_twice_recomputes_each_time():
    calls = []
    x = runtime.randn(4, dtype=runtime.float64, requires_grad=True)

    def fn(t):
        calls.append(1)
        return (t.sin() * t).sum()

    out = ck.checkpoint(fn, x, use_reentrant=False)
    out.backward(retain_graph=True)
    first = x.grad.clone()
    out.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first.numpy(), rtol=1e-12)
    assert len(calls) == 3  # the forward, then one recomputation per backward


def test_nested_non_reentrant_checkpoints():
    x = runtime.randn(3, 4, dtype=runtime.float64, requires_grad=True)
    inner = lambda t: (t.exp() * t).tanh()  # noqa: E731
    outer = lambda t: ck.checkpoint(inner, t * 2, use_reentrant=False).sin()  # noqa: E731
    ck.checkpoint(outer, x, use_reentrant=False).sum().backward()
    got = x.grad.clone()
    x.grad = None
    inner(x * 2).sin().sum().backward()
    np.testing.assert_allclose(got.numpy(), x.grad.numpy(), rtol=1e-12)


def test_recomputation_that_saves_other_shapes_is_a_checkpoint_error():
    sizes = iter([4, 3])
    x = runtime.randn(4, dtype=runtime.float64, requires_grad=True)
    out = ck.checkpoint(lambda t: (t[:next(sizes)].exp()).sum(), x, use_reentrant=False)
    with pytest.raises(ck.CheckpointError, match="different metadata"):
        out.backward()


def test_recomputation_that_saves_a_different_count_is_a_checkpoint_error():
    steps = iter([1, 2])
    x = runtime.randn(4, dtype=runtime.float64, requires_grad=True)

    def fn(t):
        for _ in range(next(steps)):
            t = t.exp()
        return t.sum()

    out = ck.checkpoint(fn, x, use_reentrant=False, determinism_check="none")
    with pytest.raises(ck.CheckpointError, match="A different number of tensors was saved"):
        out.backward()


def test_reentrant_checkpoint_refuses_autograd_grad():
    x = runtime.randn(3, dtype=runtime.float64, requires_grad=True)
    out = ck.checkpoint(lambda t: t.exp().sum(), x, use_reentrant=True)
    with pytest.raises(RuntimeError, match="incompatible with .grad()"):
        runtime.autograd.grad(out, x)


def test_bad_arguments_raise_torchs_errors():
    x = runtime.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="determinism_check should be one of"):
        ck.checkpoint(lambda t: t, x, use_reentrant=False, determinism_check="strict")
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        ck.checkpoint(lambda t, scale: t * scale, x, use_reentrant=True, scale=2)
    with pytest.raises(ValueError, match="only supported when use_reentrant=False"):
        ck.checkpoint(lambda t: t, x, use_reentrant=True, debug=True)


def test_non_reentrant_checkpoint_passes_keyword_arguments_and_context_fn():
    entered = []

    class Mark:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            entered.append(self.name)

        def __exit__(self, *exc):
            return False

    x = runtime.randn(3, dtype=runtime.float64, requires_grad=True)
    out = ck.checkpoint(lambda t, scale: (t * scale).exp().sum(), x, scale=3.0, use_reentrant=False,
                        context_fn=lambda: (Mark("forward"), Mark("recompute")))
    out.backward()
    assert entered == ["forward", "recompute"]
    np.testing.assert_allclose(x.grad.numpy(), 3 * (3 * x.detach()).exp().numpy(), rtol=1e-12)


@pytest.mark.parametrize("segments", [1, 2, 3, 5])
def test_checkpoint_sequential_matches_the_plain_sequential(segments):
    runtime.manual_seed(3)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(5, 5), nn.Tanh()) for _ in range(5)]).double()
    x = runtime.randn(2, 5, dtype=runtime.float64, requires_grad=True)
    ck.checkpoint_sequential(model, segments, x, use_reentrant=False).pow(2).sum().backward()
    got = [p.grad.numpy().copy() for p in model.parameters()] + [x.grad.numpy().copy()]
    model.zero_grad()
    x.grad = None
    model(x).pow(2).sum().backward()
    want = [p.grad.numpy() for p in model.parameters()] + [x.grad.numpy()]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_checkpoint_inside_a_compiled_model_matches_eager():
    import copy

    import nnc

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.GELU()) for _ in range(2))

        def forward(self, x):
            for block in self.blocks:
                x = x + ck.checkpoint(block, x, use_reentrant=False)
            return x

    eager = Model().double()
    compiled_model = copy.deepcopy(eager)
    compiled = nnc.compile(compiled_model)
    x = runtime.randn(3, 6, dtype=runtime.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(x).sum().backward()
    eager(x).sum().backward()
    for a, b in zip(compiled_model.parameters(), eager.parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12, atol=1e-15)
    (artifact,) = compiled._cache.values()
    assert not artifact.opaque  # traced through: the compiler keeps what its own backward needs
