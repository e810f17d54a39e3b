"""Complex tensors print as torch prints them: repr of runtime tensors against torch's own repr."""
import re

import numpy as np
import pytest

import runtime
from helpers import torch
from test_tensor_str import PRINT_OPTION_CASES

if torch is None:  # every test here compares with torch's repr
    pytest.skip("torch (the oracle) is not installed", allow_module_level=True)

NAN, INF = float("nan"), float("inf")
DTYPES = [torch.complex64, torch.complex128]


def _unwrap_suffixes(s):
    """The repr with wrapped suffixes joined back: 'runtime.' is 2 characters longer than 'torch.'."""
    return re.sub(r",\n +(?=(size|dtype|requires_grad|grad_fn)=)", ", ", s)


def _mine(t):
    """The runtime tensor holding torch tensor t's values, dtype and requires_grad."""
    return runtime.tensor(t.detach().numpy(), requires_grad=t.requires_grad)


def check(mine, t):
    """runtime tensor `mine` prints as torch tensor t does, with 'torch.' spelled 'runtime.'."""
    want, got = repr(t).replace("torch.", "runtime."), repr(mine)
    if got != want:
        assert _unwrap_suffixes(got) == _unwrap_suffixes(want), f"\n--- got ---\n{got}\n--- expected ---\n{want}"
    assert str(mine) == got


VALUE_CASES = [
    1 + 2j, 0j, 0.5 - 0.25j, complex(1, -0.0), complex(-0.0, -0.0), complex(NAN, INF), 1e-5 + 1j, 1e9 - 3j,
    [1 + 2j, 3 - 1j], [1.5 + 2j, -3 - 0.25j], [complex(1, -0.0), complex(0, 0), complex(-0.0, 0.0)],
    [complex(NAN, INF), complex(-INF, NAN), 1 + 1j, complex(1, -INF)], [1e-5 + 1j, 2 + 3j], [1 + 1e-5j, 2 + 3j],
    [1e9 + 1j, 1 + 1e9j], [1e20 - 1e-20j, 0j], [1 + 10j, 2 - 100j, 3 + 1000j], [1 + 10j, 2 - 100j, 3 + 1001j],
    [123.456 - 0.001j, -7 + 8.5j], [0.1 + 0.2j, 0.3 - 0.4j, -0.5 + 0.6j],
    [[1 + 2j, 3 + 4j], [5 - 6j, 7 + 8.5j]], [[1e-8 + 1j, 1 + NAN * 1j], [INF + 0j, -5 - 0j]],
    [[[1 - 1j, -2 + 2j], [3 + 0j, 4j]], [[5 + 5j, 6 - 6j], [7 + 7j, 8.5 - 8.5j]]],
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("values", VALUE_CASES, ids=repr)
def test_values(values, dtype):
    # NOTE: built from numpy so that nan/inf/-0.0 parts survive (complex(x, y) arithmetic would not keep them)
    t = torch.from_numpy(np.array(values, dtype=np.complex128)).to(dtype)
    check(_mine(t), t)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 0, 4)], ids=str)
def test_empty(shape, dtype):
    check(runtime.zeros(shape, dtype=getattr(runtime, str(dtype).split(".")[-1])), torch.zeros(shape, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(40,), (7, 30), (3, 4, 25), (1001,), (5000,), (40, 40), (600, 2), (11, 11, 11)],
                         ids=str)
def test_wrapped_and_summarized(shape, dtype):
    g = torch.Generator().manual_seed(0)
    t = torch.randn(shape, generator=g, dtype=dtype) * 50
    check(_mine(t), t)


def test_summarized_formatter_sees_only_the_edges():
    t = torch.ones(1500, dtype=torch.complex64) * (1 + 1j)
    t[700] = 1e30 - 1e-30j  # hidden in the middle: must not switch to scientific notation
    check(_mine(t), t)
    t = torch.arange(2000.0) * (1 - 1j)
    check(_mine(t), t)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_requires_grad_and_grad_fn(dtype):
    for t in (torch.tensor([1 + 2j, 0.5 - 1j], dtype=dtype, requires_grad=True),
              torch.tensor(0.5 + 1j, dtype=dtype, requires_grad=True),
              torch.zeros(0, 3, dtype=dtype, requires_grad=True)):
        check(_mine(t), t)
    t = torch.tensor([1 + 2j, 3 - 4j], dtype=dtype, requires_grad=True)
    mine = _mine(t)
    check(mine * 2, t * 2)
    check(mine + 1j, t + 1j)


def test_suffix_wraps_to_new_line():
    for n in range(4, 12):
        t = (torch.arange(float(n), dtype=torch.float64) + 0.5) * (1 + 1j)
        check(_mine(t), t)
        t = torch.arange(float(n), requires_grad=True) * (1.5 - 0.5j)
        mine = runtime.arange(float(n), requires_grad=True) * (1.5 - 0.5j)
        check(mine, t)


def test_random_fuzz():
    rng = np.random.default_rng(7)
    for _ in range(200):
        shape = tuple(int(s) for s in rng.integers(1, 8, size=int(rng.integers(0, 4))))
        parts = [np.asarray(rng.standard_normal(shape) * 10.0 ** rng.integers(-9, 12)) for _ in range(2)]
        for part in parts:
            if rng.random() < 0.3:
                part[...] = np.round(part)
            if rng.random() < 0.2 and part.size:
                part.flat[int(rng.integers(part.size))] = rng.choice([NAN, INF, -INF, 0.0, -0.0])
        t = torch.from_numpy(_combine(*parts)).to(DTYPES[int(rng.integers(2))])
        check(_mine(t), t)


def _combine(real, imag):
    """A complex array with exactly these parts (real + 1j * imag would turn inf * 0 into nan)."""
    out = np.empty(real.shape, np.complex128)
    out.real, out.imag = real, imag
    return out


@pytest.fixture
def print_options():
    """Both libraries' print options and default dtype, back at their defaults after the test."""
    yield
    runtime.set_printoptions(profile="default")
    torch.set_printoptions(profile="default")
    runtime.set_default_dtype(runtime.float32)
    torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("options", PRINT_OPTION_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_print_options(print_options, options):
    rng = np.random.default_rng(3)
    tensors = [torch.tensor([1.12345 - 2.5j, 3e-5 + 1j]), torch.tensor([1e9 + 1j, 1 - 1e9j]),
               torch.from_numpy(_combine(*rng.standard_normal((2, 4, 30))).astype(np.complex64)),
               torch.arange(1500.0) * (1 + 0.5j),
               torch.tensor([[1 + 2j, 3 - 4j]], dtype=torch.complex128, requires_grad=True), torch.tensor(1 - 1j),
               torch.ones(2, 3000) * 1j]
    runtime.set_printoptions(**options)
    torch.set_printoptions(**options)
    for t in tensors:
        check(_mine(t), t)


def test_default_complex_dtype_follows_the_default_float(print_options):
    runtime.set_default_dtype(runtime.float64)
    torch.set_default_dtype(torch.float64)
    for dtype in DTYPES:
        t = torch.tensor([1 + 2j, 3.5 - 4j], dtype=dtype)
        check(_mine(t), t)
        check(runtime.zeros(0, dtype=getattr(runtime, str(dtype).split(".")[-1])), torch.zeros(0, dtype=dtype))


@pytest.mark.parametrize("dtype", [runtime.complex64, runtime.complex128], ids=str)
def test_item_and_tolist_give_python_complex(dtype):
    x = runtime.tensor([[1 + 2j, complex(3, -0.0)], [complex(NAN, INF), 0.5j]], dtype=dtype)
    got = x.tolist()
    assert all(type(v) is complex for row in got for v in row)
    assert got[0] == [1 + 2j, 3 + 0j] and np.signbit(got[0][1].imag)
    assert got[1][0].real != got[1][0].real and got[1][0].imag == INF and got[1][1] == 0.5j
    item = x[0, 0].item()
    assert type(item) is complex and item == 1 + 2j
    assert type(runtime.tensor(2 - 1j, dtype=dtype).item()) is complex
    t = torch.tensor([[1 + 2j, 0.5j]], dtype=getattr(torch, str(dtype).split(".")[-1]))
    assert runtime.tensor(t.numpy()).tolist() == t.tolist()
