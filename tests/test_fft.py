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


# -- short-time transforms ---------------------------------------------------------------------------------------

STFT_CASES = [dict(n_fft=16), dict(n_fft=16, hop_length=5, win_length=12, window="hann"),
              dict(n_fft=15, center=False, window="hamming", normalized=True),
              dict(n_fft=16, onesided=False, window="hann"), dict(n_fft=16, pad_mode="constant", window="hann")]
STFT_IDS = ["rectangular", "short-window", "uncentered-odd-normalized", "two-sided", "constant-pad"]


def short_time(lib, signal, case):
    """stft of the signal, then istft back to its length: (spectrum, signal)."""
    kwargs = dict(case)
    if kwargs.get("window") is not None:
        make = lib.hann_window if kwargs["window"] == "hann" else lib.hamming_window
        kwargs["window"] = make(kwargs.get("win_length", kwargs["n_fft"]), dtype=lib.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the rectangular window's warning
        spectrum = lib.stft(signal, return_complex=True, **kwargs)
        back = {k: v for k, v in kwargs.items() if k != "pad_mode"}
        return spectrum, lib.istft(spectrum, length=signal.shape[-1], **back)


@needs_torch
@pytest.mark.parametrize("case", STFT_CASES, ids=STFT_IDS)
def test_stft_and_istft_match_torch_values_and_gradients(case):
    x = np.random.default_rng(2).standard_normal((2, 100))
    results = []
    for lib in (runtime, torch):
        signal = lib.tensor(x, requires_grad=True)
        spectrum, back = short_time(lib, signal, case)
        ((spectrum.abs() ** 2).sum() + (back * back).sum()).backward()
        results.append((values(spectrum), values(back), signal.grad.numpy()))
    for got, want in zip(*results):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_istft_inverts_stft_and_refuses_windows_that_leave_gaps():
    x = runtime.randn(3, 64, dtype=runtime.float64)
    window = runtime.hann_window(16, dtype=runtime.float64)
    spectrum = x.stft(16, hop_length=4, window=window, return_complex=True)
    assert tuple(spectrum.shape) == (3, 9, 17)
    np.testing.assert_allclose(spectrum.istft(16, hop_length=4, window=window, length=64).numpy(), x.numpy(),
                               atol=1e-12)
    with pytest.raises(RuntimeError, match="return_complex"):
        runtime.stft(x, 16, window=window)
    with pytest.raises(RuntimeError, match="window overlap add min"):
        runtime.istft(spectrum, 16, hop_length=16, window=window, center=False)


class LogSpectrogram(runtime.nn.Module):
    """An audio front end: log power spectrogram (stft with a Hann window buffer), then a linear map of each frame."""

    def __init__(self, n_fft=32, classes=4):
        super().__init__()
        self.register_buffer("window", runtime.hann_window(n_fft, dtype=runtime.float64))
        self.n_fft = n_fft
        self.head = runtime.nn.Linear(n_fft // 2 + 1, classes).double()

    def forward(self, audio):
        spectrum = runtime.stft(audio, self.n_fft, hop_length=8, window=self.window, return_complex=True)
        power = (spectrum.abs() ** 2 + 1e-6).log()
        return self.head(power.transpose(1, 2)).mean(1)


def test_a_spectrogram_front_end_compiles_as_eager():
    runtime.manual_seed(0)
    model = LogSpectrogram()
    audio = runtime.randn(2, 256, dtype=runtime.float64, requires_grad=True)
    want = model(audio)
    (want_grad,) = runtime.autograd.grad(want.sum(), audio)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = nnc.compile(model)
        got = compiled(audio)
    (got_grad,) = runtime.autograd.grad(got.sum(), audio)
    (artifact,) = compiled._cache.values()
    assert artifact.graph_breaks == []
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(got_grad.numpy(), want_grad.numpy(), rtol=1e-10, atol=1e-14)


class SpectralGate(runtime.nn.Module):
    """A denoiser's shape: a learned gain per frequency bin between stft and istft."""

    def __init__(self, n_fft=32):
        super().__init__()
        self.register_buffer("window", runtime.hann_window(n_fft, dtype=runtime.float64))
        self.gain = runtime.nn.Parameter(runtime.zeros(n_fft // 2 + 1, 1, dtype=runtime.float64))
        self.n_fft = n_fft

    def forward(self, audio):
        spectrum = runtime.stft(audio, self.n_fft, hop_length=8, window=self.window, return_complex=True)
        gated = spectrum * self.gain.sigmoid()
        return runtime.istft(gated, self.n_fft, hop_length=8, window=self.window, length=audio.shape[-1])


def test_a_spectral_gate_between_stft_and_istft_compiles_as_eager():
    model = SpectralGate()
    audio = runtime.randn(2, 128, dtype=runtime.float64)
    want = model(audio)
    (want_grad,) = runtime.autograd.grad((want ** 2).sum(), model.gain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = nnc.compile(model)(audio)
    (got_grad,) = runtime.autograd.grad((got ** 2).sum(), model.gain)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_grad.numpy(), want_grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(want.detach().numpy(), audio.numpy() * 0.5, atol=1e-12)  # gain sigmoid(0) = 1/2
