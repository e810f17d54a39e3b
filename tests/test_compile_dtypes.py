"""nnc.compile on models with narrow integer inputs and numpy scalar operands: compiled == eager, forward and
backward, with every kernel compiled (no interpreter fallback)."""
from __future__ import annotations

import copy
import warnings

import numpy as np

import nnc
import runtime
from runtime import nn


class ScaledImage(nn.Module):
    """A uint8 image scaled to [0, 1) then a Linear, plus a mask read from the same bytes."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, image):
        return self.fc(image.float() / 255 - 0.5) * (image[:, :3] > 128)


class WrappingArithmetic(nn.Module):
    """uint8 + int8 promotes to int16, whose product by 300 wraps; a uint8 plus a Python int stays uint8."""

    def forward(self, u, c):
        return (u + c) * 3 - u // 3, u.to(runtime.int16) * 300, u + 250, c * c


def _plans(compiled):
    return [getattr(a, label) for a in compiled._cache.values()
            for label in ("forward_plan", "training_plan", "backward_plan") if getattr(a, label, None) is not None]


def _bytes(shape, dtype, seed):
    info = np.iinfo(dtype)
    return runtime.from_numpy(np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype))


def test_uint8_input_model_compiles_and_matches_eager_with_gradients():
    runtime.manual_seed(0)
    eager = ScaledImage()
    compiled = nnc.compile(copy.deepcopy(eager))
    image = _bytes((5, 12), np.uint8, 0)
    grads = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a kernel that falls back to the interpreter would warn
        for model in (eager, compiled):
            out = model(image)
            out.pow(2).sum().backward()
            grads.append((out.detach().numpy(), [p.grad.numpy() for p in model.parameters()]))
    (want, want_grads), (got, got_grads) = grads
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    for a, b in zip(got_grads, want_grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert _plans(compiled) and all(not p.fallbacks for p in _plans(compiled))


def test_narrow_integer_kernels_wrap_as_eager():
    u, c = _bytes((300,), np.uint8, 1), _bytes((300,), np.int8, 2)
    compiled = nnc.compile(WrappingArithmetic())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compiled(u, c)
    want = WrappingArithmetic()(u, c)
    for a, b, dtype in zip(got, want, (runtime.int16, runtime.int16, runtime.uint8, runtime.int8)):
        assert a.dtype is b.dtype is dtype
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert all(not p.fallbacks for p in _plans(compiled))
    assert int(want[1].numpy().max()) <= 32767 and (u.numpy().astype(np.int64) * 300 > 32767).any()  # it wrapped


class Block(nn.Module):
    """Linear, LayerNorm, GELU and a softmax: composites that on bfloat16 compute in float32 and round once."""

    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(8, 6), nn.LayerNorm(6)

    def forward(self, x):
        h = nn.functional.gelu(self.norm(self.fc(x)))
        return h.softmax(-1) * 2 + h.sum(-1, keepdim=True).exp()


def test_bfloat16_model_runs_in_numpy_quietly_and_matches_eager():
    """No code generator has bfloat16 arithmetic: its nodes are opaque by design (as complex ones), run in numpy as
    eager runs them, bit for bit, with no warning about kernels failing to compile."""
    runtime.manual_seed(0)
    eager = Block().to(runtime.bfloat16)
    compiled = nnc.compile(copy.deepcopy(eager))
    x = runtime.randn(4, 8).to(runtime.bfloat16)
    results = []
    for model in (eager, compiled):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model(x.detach().requires_grad_())
            out.float().pow(2).sum().backward()
        results.append((out, [p.grad for p in model.parameters()], caught))
    (want, want_grads, _), (got, got_grads, caught) = results
    assert not caught, [str(w.message) for w in caught]
    assert got.dtype is want.dtype is runtime.bfloat16
    np.testing.assert_array_equal(got.detach().float().numpy(), want.detach().float().numpy())
    for a, b in zip(got_grads, want_grads):
        assert a.dtype is b.dtype is runtime.bfloat16
        np.testing.assert_array_equal(a.float().numpy(), b.float().numpy())
    assert not any(p.fallbacks for p in _plans(compiled))
    assert "of bfloat16 values runs in numpy" in str(nnc.explain(copy.deepcopy(eager), x))


class GaussianLogLikelihood(nn.Module):
    """A normalizing flow's prior term: numpy scalars (np.log, np.pi, a float32 scale) as operands of tensors."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        z = self.fc(x)
        log_prior = -0.5 * (z ** 2).sum(-1) - 0.5 * z.shape[-1] * np.log(2 * np.pi)
        return log_prior * np.float32(0.5) + np.int64(2), z * np.float64(1.5)


def test_numpy_scalar_operands_compile_as_python_numbers():
    """torch takes a numpy scalar operand as a Python number (it does not widen a float32 tensor to float64); the
    compiled graph does the same, with every node compiled (it used to run such an op eagerly)."""
    model = GaussianLogLikelihood()
    x = runtime.randn(5, 4)
    compiled = nnc.compile(model)
    results = []
    for fn in (model, compiled):
        model.zero_grad()
        outs = fn(x)
        (outs[0].sum() + outs[1].sum()).backward()
        results.append([o.detach() for o in outs] + [p.grad for p in model.parameters()])
    for got, want in zip(results[1], results[0]):
        assert got.dtype == want.dtype == runtime.float32
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    (artifact,) = compiled._cache.values()
    assert not artifact.opaque, [n.meta.get("opaque_reason") for n in artifact.opaque]
