"""torch-free checks of format_tensor against reprs captured from torch 2.x."""
import numpy as np
import pytest

from runtime._tensor_str import format_tensor

NAN, INF = float("nan"), float("inf")

CASES = [
    # (data, dtype_name, is_default_dtype, suffixes, expected)
    (np.array([1.0, 2.0], np.float32), "runtime.float32", True, [], "tensor([1., 2.])"),
    (np.array(3.0, np.float32), "runtime.float32", True, [], "tensor(3.)"),
    (np.array(0.5, np.float32), "runtime.float32", True, [], "tensor(0.5000)"),
    (np.array([1e-5, 1.0], np.float32), "runtime.float32", True, [],
     "tensor([1.0000e-05, 1.0000e+00])"),
    (np.array([[1, 2], [3, 4]], np.int64), "runtime.int64", True, [],
     "tensor([[1, 2],\n        [3, 4]])"),
    (np.array([True, False]), "runtime.bool", True, [], "tensor([ True, False])"),
    (np.zeros(0, np.float64), "runtime.float64", False, [], "tensor([], dtype=runtime.float64)"),
    (np.zeros(0, np.int64), "runtime.int64", True, [], "tensor([], dtype=runtime.int64)"),
    (np.zeros((0, 3), np.float32), "runtime.float32", True, [], "tensor([], size=(0, 3))"),
    (np.zeros((0, 3), np.bool_), "runtime.bool", True, [],
     "tensor([], size=(0, 3), dtype=runtime.bool)"),
    (np.array([1.0, 2.0], np.float32), "runtime.float32", True, ["requires_grad=True"],
     "tensor([1., 2.], requires_grad=True)"),
    (np.array([NAN, INF, -INF], np.float32), "runtime.float32", True, [],
     "tensor([nan, inf, -inf])"),
    (np.array([0.0, NAN, -0.0], np.float32), "runtime.float32", True, [],
     "tensor([0., nan, -0.])"),
    (np.array([1.5, -2.25], np.float16), "runtime.float16", False, [],
     "tensor([ 1.5000, -2.2500], dtype=runtime.float16)"),
    (np.arange(1001.0, dtype=np.float32), "runtime.float32", True, [],
     "tensor([   0.,    1.,    2.,  ...,  998.,  999., 1000.])"),
    (np.arange(12.0, dtype=np.float32).reshape(2, 2, 3), "runtime.float32", True, [],
     "tensor([[[ 0.,  1.,  2.],\n         [ 3.,  4.,  5.]],\n\n"
     "        [[ 6.,  7.,  8.],\n         [ 9., 10., 11.]]])"),
    (np.array([0.5]), "runtime.float64", False, [], "tensor([0.5000], dtype=runtime.float64)"),
    (np.arange(30.0, dtype=np.float32) + 0.5, "runtime.float32", True, [],
     "tensor([ 0.5000,  1.5000,  2.5000,  3.5000,  4.5000,  5.5000,  6.5000,  7.5000,\n"
     "         8.5000,  9.5000, 10.5000, 11.5000, 12.5000, 13.5000, 14.5000, 15.5000,\n"
     "        16.5000, 17.5000, 18.5000, 19.5000, 20.5000, 21.5000, 22.5000, 23.5000,\n"
     "        24.5000, 25.5000, 26.5000, 27.5000, 28.5000, 29.5000])"),
    (np.array([1, 2], np.int32), "runtime.int32", False, [], "tensor([1, 2], dtype=runtime.int32)"),
    (np.array([[1, -20], [300, 4]], np.int32), "runtime.int32", False, [],
     "tensor([[  1, -20],\n        [300,   4]], dtype=runtime.int32)"),
    (np.array([1e9, -1.0, 0.0], np.float32), "runtime.float32", True, [],
     "tensor([ 1.0000e+09, -1.0000e+00,  0.0000e+00])"),
    (np.array([1e-30, 2.5e30]), "runtime.float64", False, [],
     "tensor([1.0000e-30, 2.5000e+30], dtype=runtime.float64)"),
    (np.array(-np.inf, np.float32), "runtime.float32", True, [], "tensor(-inf)"),
    (np.array(-7, np.int64), "runtime.int64", True, [], "tensor(-7)"),
    (np.array([2.0, 4.0], np.float32), "runtime.float32", True, ["grad_fn=<MulBackward0>"],
     "tensor([2., 4.], grad_fn=<MulBackward0>)"),
    (np.arange(8.0, dtype=np.float32) * 1.5 + 10, "runtime.float32", True,
     ["requires_grad=True"],
     "tensor([10.0000, 11.5000, 13.0000, 14.5000, 16.0000, 17.5000, 19.0000, 20.5000],\n"
     "       requires_grad=True)"),
    (np.arange(6.0) * 1.5 + 10, "runtime.float64", False, [],
     "tensor([10.0000, 11.5000, 13.0000, 14.5000, 16.0000, 17.5000],\n"
     "       dtype=runtime.float64)"),
    (np.arange(10000.0, dtype=np.float32).reshape(100, 100) / 8, "runtime.float32", True, [],
     "tensor([[0.0000e+00, 1.2500e-01, 2.5000e-01,  ..., 1.2125e+01, 1.2250e+01,\n"
     "         1.2375e+01],\n"
     "        [1.2500e+01, 1.2625e+01, 1.2750e+01,  ..., 2.4625e+01, 2.4750e+01,\n"
     "         2.4875e+01],\n"
     "        [2.5000e+01, 2.5125e+01, 2.5250e+01,  ..., 3.7125e+01, 3.7250e+01,\n"
     "         3.7375e+01],\n"
     "        ...,\n"
     "        [1.2125e+03, 1.2126e+03, 1.2128e+03,  ..., 1.2246e+03, 1.2248e+03,\n"
     "         1.2249e+03],\n"
     "        [1.2250e+03, 1.2251e+03, 1.2252e+03,  ..., 1.2371e+03, 1.2372e+03,\n"
     "         1.2374e+03],\n"
     "        [1.2375e+03, 1.2376e+03, 1.2378e+03,  ..., 1.2496e+03, 1.2498e+03,\n"
     "         1.2499e+03]])"),
]


@pytest.mark.parametrize("data, dtype_name, is_default, suffixes, expected", CASES)
def test_known_reprs(data, dtype_name, is_default, suffixes, expected):
    assert format_tensor(data, dtype_name, is_default, suffixes) == expected
