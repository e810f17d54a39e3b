"""runtime.fft (torch.fft): every transform's values and gradients against torch, and against finite differences
without it; argument rules (n, s, dim, norm), dtypes, helpers; a spectral layer compiled as eager."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import nnc
import runtime
from helpers import needs_torch, torch

NORMS = [None, "ortho", "forward"]
COMPLEX_IN = {"fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "irfft", "irfft2", "irfftn", "hfft", "hfft2", "hfftn"}
# (function, keyword arguments) over an input of shape (4, 6, 5)
CALLS = [
    ("fft", {}), ("fft", {"n": 8}), ("fft", {"n": 3, "dim": 1}), ("ifft", {"dim": 0}), ("ifft", {"n": 7}),
    ("fft2", {}), ("fft2", {"s": (3, 8)}), ("ifft2", {"dim": (0, 2)}),
    ("fftn", {}), ("fftn", {"s": (2, -1)}), ("fftn", {"dim": (2, 0)}), ("ifftn", {"s": (5, 4, 3)}),
    ("rfft", {}), ("rfft", {"n": 8}), ("rfft", {"n": 3, "dim": 0}), ("rfft2", {}), ("rfftn", {"dim": (0, 1)}),
    ("rfftn", {"s": (3, 7)}),
    ("irfft", {}), ("irfft", {"n": 9}), ("irfft", {"n": 4, "dim": 1}), ("irfft2", {}), ("irfft2", {"s": (4, 7)}),
    ("irfftn", {}), ("irfftn", {"dim": (1, 2), "s": (-1, 6)}),
    ("hfft", {}), ("hfft", {"n": 7}), ("ihfft", {}), ("ihfft", {"n": 6, "dim": 0}), ("hfft2", {}), ("ihfft2", {}),
    ("hfftn", {"dim": (0, 2)}), ("ihfftn", {}),
]
IDS = [f"{name}-{'-'.join(f'{k}{v}' for k, v in kw.items()) or 'default'}" for name, kw in CALLS]


def sample(name, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((4, 6, 5))
    if name in COMPLEX_IN:
        values = values + 1j * rng.standard_normal((4, 6, 5))
    return values.astype(np.result_type(dtype, values.dtype))


def call(lib, name, x, kwargs, norm):
    return getattr(lib.fft, name)(x, norm=norm, **kwargs)


def values(t) -> np.ndarray:
    t = t.detach()
    return (t.resolve_conj() if hasattr(t, "resolve_conj") else t).numpy()


@needs_torch
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name,kwargs", CALLS, ids=IDS)
def test_values_and_dtypes_match_torch(name, kwargs, norm):
    for dtype in (np.float32, np.float64):
        x = sample(name, dtype)
        got, want = call(runtime, name, runtime.tensor(x), kwargs, norm), call(torch, name, torch.tensor(x), kwargs,
                                                                               norm)
        assert got.dtype.name == str(want.dtype).removeprefix("torch.") and tuple(got.shape) == tuple(want.shape)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(values(got), values(want), rtol=tol, atol=tol)


@needs_torch
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name,kwargs", CALLS, ids=IDS)
def test_gradients_match_torch(name, kwargs, norm):
    x = sample(name)
    ours, theirs = runtime.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, want = call(runtime, name, ours, kwargs, norm), call(torch, name, theirs, kwargs, norm)
    rng = np.random.default_rng(1)
    seed = rng.standard_normal(tuple(out.shape)) + (1j * rng.standard_normal(tuple(out.shape))
                                                   if out.dtype.is_complex else 0)
    (g,) = runtime.autograd.grad(out, ours, runtime.tensor(seed))
    (w,) = torch.autograd.grad(want, theirs, torch.tensor(seed))
    np.testing.assert_allclose(g.numpy(), values(w), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,kwargs", [c for c in CALLS if c[0] in ("fft", "rfft", "irfft", "ihfft", "hfft2",
                                                                       "rfftn", "irfftn", "ifftn")],
                         ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("norm", NORMS)
def test_gradients_match_finite_differences(name, kwargs, norm):
    x = runtime.tensor(sample(name)[:2, :3], requires_grad=True)  # small: finite differences perturb each value
    kwargs = {k: v for k, v in kwargs.items() if k != "s"}
    assert runtime.autograd.gradcheck(lambda x: call(runtime, name, x, kwargs, norm), (x,), eps=1e-6, atol=1e-6,
                                      rtol=1e-5)


def test_round_trips_and_helpers():
    x = runtime.randn(3, 8, dtype=runtime.float64)
    np.testing.assert_allclose(runtime.fft.irfft(runtime.fft.rfft(x), n=8).numpy(), x.numpy(), atol=1e-12)
    np.testing.assert_allclose(runtime.fft.ifftn(runtime.fft.fftn(x)).real.numpy(), x.numpy(), atol=1e-12)
    assert runtime.fft.fft(runtime.arange(4)).dtype is runtime.complex64  # integers: the default complex dtype
    np.testing.assert_allclose(runtime.fft.fftfreq(5, d=0.5).numpy(), [0, 0.4, 0.8, -0.8, -0.4], rtol=1e-6)
    np.testing.assert_allclose(runtime.fft.rfftfreq(6).numpy(), [0, 1 / 6, 2 / 6, 0.5], rtol=1e-6)
    shifted = runtime.fft.fftshift(runtime.fft.fftfreq(6))
    assert shifted.numpy().tolist() == sorted(shifted.numpy().tolist())
    np.testing.assert_array_equal(runtime.fft.ifftshift(shifted).numpy(), runtime.fft.fftfreq(6).numpy())


@pytest.mark.parametrize("call_,message", [
    (lambda: runtime.fft.fft(runtime.ones(4), norm="sideways"), "Invalid normalization mode"),
    (lambda: runtime.fft.rfft(runtime.ones(4, dtype=runtime.cfloat)), "expects a real input"),
    (lambda: runtime.fft.fft(runtime.ones(4), n=0), "Invalid number of data points"),
    (lambda: runtime.fft.fftn(runtime.ones(4, 4), s=(2, 2), dim=(0,)), "same length"),
    (lambda: runtime.fft.fft(runtime.ones(4, dtype=runtime.float16)), "Unsupported dtype"),
    (lambda: runtime.fft.irfft(runtime.ones(1, dtype=runtime.cfloat)), "Invalid number of data points"),
])
def test_bad_arguments_raise_naming_them(call_, message):
    with pytest.raises((RuntimeError, ValueError), match=message):
        call_()


class SpectralMixing(runtime.nn.Module):
    """A Fourier-neural-operator-style layer: keep the lowest modes of the signal's spectrum, mix their channels
    with complex weights (a complex parameter), and transform back, beside a pointwise linear path."""

    def __init__(self, channels=3, modes=4):
        super().__init__()
        self.modes = modes
        scale = 1 / channels
        self.weights = runtime.nn.Parameter(scale * runtime.randn(channels, channels, modes, dtype=runtime.cdouble))
        self.pointwise = runtime.nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        spectrum = runtime.fft.rfft(x, norm="ortho")
        mixed = runtime.einsum("bim,iom->bom", spectrum[..., : self.modes], self.weights)
        full = runtime.zeros(x.shape[0], x.shape[1], spectrum.shape[-1], dtype=runtime.cdouble)
        full[..., : self.modes] = mixed
        return runtime.nn.functional.gelu(runtime.fft.irfft(full, n=x.shape[-1], norm="ortho") + self.pointwise(x))


def test_a_spectral_layer_with_complex_weights_compiles_and_trains_as_eager():
    runtime.manual_seed(0)
    model = SpectralMixing().double()
    x = runtime.randn(2, 3, 16, dtype=runtime.float64)
    target = runtime.randn(2, 3, 16, dtype=runtime.float64)

    def step(m):
        for p in m.parameters():
            p.grad = None
        loss = ((m(x) - target) ** 2).mean()
        loss.backward()
        return loss.item(), [p.grad.numpy().copy() for p in model.parameters()]

    want = step(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = nnc.compile(model)
        got = step(compiled)
    (artifact,) = compiled._cache.values()
    assert artifact.graph_breaks == [] and artifact.backward_plan is not None
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-14)
    assert model.weights.grad.dtype is runtime.complex128
