"""Compare runtime._tensor_str.format_tensor against torch's own tensor repr."""
import re

import numpy as np
import pytest

from helpers import torch
from runtime._tensor_str import format_tensor

if torch is None:  # every test here compares with torch's repr; test_tensor_str_standalone.py runs without it
    pytest.skip("torch (the oracle) is not installed", allow_module_level=True)

NAN, INF = float("nan"), float("inf")
DTYPES = [torch.float16, torch.float32, torch.float64, torch.int32, torch.int64, torch.bool]


def _suffixes(t):
    if t.grad_fn is not None:
        return [f"grad_fn=<{type(t.grad_fn).__name__}>"]
    return ["requires_grad=True"] if t.requires_grad else []


def _unwrap_suffixes(s):
    return re.sub(r",\n +(?=(size|dtype|requires_grad|grad_fn)=)", ", ", s)


def check(t):
    name = str(t.dtype).replace("torch.", "")
    is_default = t.dtype in (torch.float32, torch.int64, torch.bool)
    data, suffixes = t.detach().numpy(), _suffixes(t)
    # Exact layout check: with torch's own dtype name the output must be identical.
    expected = repr(t)
    got = format_tensor(data, f"torch.{name}", is_default, suffixes)
    assert got == expected, f"\n--- got ---\n{got}\n--- expected ---\n{expected}"
    # NOTE: 'runtime.' is 2 chars longer than 'torch.', which can legitimately move
    # the ', dtype=...' suffix onto its own line; compare modulo that one wrap.
    expected = expected.replace("torch.", "runtime.")
    got = format_tensor(data, f"runtime.{name}", is_default, suffixes)
    if got != expected:
        assert _unwrap_suffixes(got) == _unwrap_suffixes(expected), f"\n{got}\n!=\n{expected}"


VALUE_CASES = [
    3.0, 0.5, -2.0, 0.0, -0.0, 1e-5, 123456789.0, NAN, INF, -INF,
    [1.0, 2.0], [0.5, 1.25, -3.0], [1.0, 2.0, 3.5], [1e-5, 1.0], [1.0, 1000.5],
    [1.0, 1001.0], [1e9, 1.0], [1e8, 1.0], [-1.0, -2.0, 3.0], [0.0, -0.0],
    [NAN, 1.0], [INF, -INF, NAN], [1.5, INF], [1.0, -INF], [1e-5, NAN, INF],
    [0.1, 0.2, 0.3], [123.456, -0.001], [1e20, -1e-20, 0.0], [100000.0, 2.5],
    [[1.0, 2.0], [3.0, 4.0]], [[0.5, -1.5], [2.25, 1e3]],
    [[[1.0, -2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.5]]],
    [[1e-8, 1.0, NAN], [INF, -5.0, 0.0]],
]


# Non-finite values have no integer representation, so those pairs are not generated.
VALUE_DTYPE_CASES = [pytest.param(v, d, id=f"{v!r}-{d}") for v in VALUE_CASES for d in DTYPES
                     if d.is_floating_point or np.all(np.isfinite(np.array(v, dtype=np.float64)))]


@pytest.mark.parametrize("values,dtype", VALUE_DTYPE_CASES)
def test_values(values, dtype):
    check(torch.tensor(np.array(values, dtype=np.float64)).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 0, 4), (0, 0)], ids=str)
def test_empty(shape, dtype):
    check(torch.zeros(shape, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zero_dim(dtype):
    for v in (0, 1, 7, -3, 0.5, 1e-7, 2.5e10):
        check(torch.tensor(v).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(40,), (100,), (7, 30), (3, 4, 25), (2, 2, 2, 20)], ids=str)
def test_long_rows_wrap(shape, dtype):
    g = torch.Generator().manual_seed(0)
    t = torch.randn(shape, generator=g, dtype=torch.float64) * 50
    check(t.to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape", [(1001,), (5000,), (40, 40), (2, 600), (600, 2), (11, 11, 11), (4, 5, 6, 10)], ids=str
)
def test_summarized(shape, dtype):
    g = torch.Generator().manual_seed(1)
    t = torch.randn(shape, generator=g, dtype=torch.float64) * 10
    check(t.to(dtype))


def test_summarized_arange_and_edge_only_formatter():
    check(torch.arange(2000))
    check(torch.arange(2000.0))
    # Huge value in the hidden middle must not affect the formatter.
    t = torch.ones(1500)
    t[700] = 1e30
    check(t)
    check(torch.arange(10000.0).reshape(100, 100) / 7)


def test_exactly_threshold_is_not_summarized():
    check(torch.arange(1000.0))
    check(torch.arange(1000).reshape(10, 100))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
def test_requires_grad(dtype):
    check(torch.tensor([1.0, 2.0], dtype=dtype, requires_grad=True))
    check(torch.tensor(0.5, dtype=dtype, requires_grad=True))
    check(torch.zeros(0, 3, dtype=dtype, requires_grad=True))
    check(torch.randn(5, 30, dtype=dtype, requires_grad=True))


def test_grad_fn_suffix():
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    check(a + 1)
    check((a * 3).sum())
    b = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    check(b * 2)


def test_suffix_wraps_to_new_line():
    # Last line long enough that ', dtype=...' or the grad suffix must wrap.
    check(torch.arange(17.0, dtype=torch.float64) + 0.5)
    check(torch.arange(16.0, dtype=torch.float64) + 0.5)
    for n in range(10, 20):
        check(torch.arange(float(n), requires_grad=True) * 1.5)
        check(torch.arange(float(n), dtype=torch.float16) + 0.25)


def test_float16_specifics():
    check(torch.tensor([65504.0, -65504.0], dtype=torch.float16))
    check(torch.tensor([6e-8, 1.0], dtype=torch.float16))
    check(torch.tensor([0.1, 0.2, 0.3333], dtype=torch.float16))
    check(torch.tensor([70000.0, 1.0], dtype=torch.float16))  # overflows to inf


def test_integer_extremes_and_bool():
    check(torch.tensor([2**62, -(2**62), 0]))
    check(torch.tensor([2**31 - 1, -(2**31)], dtype=torch.int32))
    check(torch.tensor([[True, False], [False, True]]))
    check(torch.tensor(False))
    check(torch.ones(2000, dtype=torch.bool))


def test_random_fuzz():
    rng = np.random.default_rng(123)
    for _ in range(300):
        ndim = int(rng.integers(0, 4))
        shape = tuple(int(s) for s in rng.integers(1, 9, size=ndim))
        scale = 10.0 ** rng.integers(-9, 12)
        arr = rng.standard_normal(shape) * scale
        if rng.random() < 0.3:
            arr = np.round(arr)
        if rng.random() < 0.2 and arr.size:
            arr.flat[int(rng.integers(arr.size))] = rng.choice([NAN, INF, -INF, 0.0])
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        if not dtype.is_floating_point:
            arr = np.nan_to_num(np.clip(arr, -1e15, 1e15))
        check(torch.tensor(arr).to(dtype))


@pytest.fixture
def print_options():
    """Both libraries' print options, back at their defaults after the test."""
    import runtime

    yield runtime.set_printoptions
    runtime.set_printoptions(profile="default")
    torch.set_printoptions(profile="default")


PRINT_OPTION_CASES = [dict(precision=2), dict(precision=8), dict(threshold=5), dict(edgeitems=1, threshold=10),
                      dict(linewidth=30), dict(sci_mode=True), dict(sci_mode=False), dict(profile="short"),
                      dict(profile="full"), dict(profile="short", precision=6, sci_mode=True), dict(edgeitems=0),
                      dict(edgeitems=0, threshold=3)]


@pytest.mark.parametrize("options", PRINT_OPTION_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_print_options_match_torch(print_options, options):
    import runtime

    rng = np.random.default_rng(3)
    tensors = [torch.tensor([1.12345, -2.5, 3e-5]), torch.arange(12), torch.tensor([1e9, 1.0]),
               torch.from_numpy(rng.standard_normal((4, 30)).astype(np.float32)), torch.arange(1500.0),
               torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64, requires_grad=True)]
    print_options(**options)
    torch.set_printoptions(**options)
    for t in tensors:
        mine = runtime.tensor(t.detach().numpy(), requires_grad=t.requires_grad)
        want = repr(t).replace("torch.", "runtime.")  # 2 more characters can move a suffix (see check)
        assert _unwrap_suffixes(repr(mine)) == _unwrap_suffixes(want), (options, repr(mine), want)


def test_print_options_reset_and_reject_an_unknown_profile(print_options):
    import runtime

    x = runtime.tensor([1.12345])
    print_options(precision=2)
    assert repr(x) == "tensor([1.12])"
    with pytest.raises(ValueError, match="profile must be one of default, short, full, got 'ful'"):
        print_options(profile="ful")
    print_options(profile="default")
    assert repr(x) == "tensor([1.1235])"
