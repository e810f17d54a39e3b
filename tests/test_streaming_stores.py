"""Streaming stores (nnc.codegen.streaming): the row helper writes exactly its row at every alignment, loops stream
only what cpu_elementwise.stream_stage admits, and compiled models whose kernels stream agree with eager mode,
forward and backward, serial and parallel.

Streaming starts at 3/4 of the last-level cache, tens of MiB; the model tests lower that threshold to 0 so that
small shapes stream (the `streaming_everywhere` fixture), and check in the generated sources that they did.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit

import nnc
import runtime as torch
from nnc.codegen import cache, cpu_elementwise
from nnc.codegen.cpu_elementwise import ElementwiseSchedule, elementwise_schedule, stage_length, stream_stage
from nnc.codegen.streaming import LINE, stack_row, stream_row
from runtime import nn

pytestmark = pytest.mark.usefixtures("fresh_kernel_cache")


@njit
def _double_into(x, out, start, n):
    """out[start:start + n] = 2 * x[:n], through a stage of 64 elements streamed by stream_row."""
    stage = stack_row(64, np.float64)
    for k in range(n):
        stage[k] = x[k] * 2
    stream_row(out[start:start + n], stage)


@njit
def _stage_address_mod_line():
    stage = stack_row(24, np.float32)
    return stage.ctypes.data % LINE


def test_stream_row_writes_exactly_its_row_at_every_alignment():
    x = np.arange(1.0, 65.0)
    for start in range(9):  # every element offset within a line of float64
        for n in range(65):  # rows shorter than a line, within one, spanning several, with and without a tail
            out = np.zeros(80)
            _double_into(x, out, start, n)
            want = np.zeros(80)
            want[start:start + n] = x[:n] * 2
            np.testing.assert_array_equal(out, want, err_msg=f"start {start}, n {n}")


def test_stream_row_stores_plainly_into_memory_not_aligned_to_its_itemsize():
    raw = np.zeros(81 * 8 + 1, np.uint8)
    out = raw[1:1 + 80 * 8].view(np.float64)  # one byte past an 8-byte boundary: no whole aligned line exists
    _double_into(np.arange(64.0), out, 3, 40)
    np.testing.assert_array_equal(out[3:43], np.arange(40.0) * 2)
    assert not out[:3].any() and not out[43:].any()


def test_stack_rows_are_line_aligned():
    assert _stage_address_mod_line() == 0


def test_stage_length_splits_long_rows_into_divisors_that_fit():
    most = cpu_elementwise.STAGE_MAX_BYTES // 4
    assert stage_length(1000, 4) == 1000
    assert stage_length(most, 4) == most
    long_row = stage_length(3 * most, 4)
    assert long_row is not None and (3 * most) % long_row == 0 and long_row * 4 <= cpu_elementwise.STAGE_MAX_BYTES
    assert stage_length(1_000_003, 4) is None  # a prime: no tile divides it


def test_stream_stage_admits_only_large_contiguous_outputs_where_something_broadcasts():
    big = cpu_elementwise.STREAM_MIN_BYTES // 4 // 1024 + 1  # rows of 1024 float32 reaching the threshold
    out = ([1024, 1], 4)  # (element strides over the collapsed sizes, itemsize)
    assert stream_stage(big * 1024, [big, 1024], [out]) == 1024
    assert stream_stage((big - 2) * 1024, [big - 2, 1024], [out]) is None  # below the threshold
    assert stream_stage(big * 1024, [big * 1024], [([1], 4)]) is None  # a flat loop keeps plain stores
    assert stream_stage(big * 1024, [big, 1024], [([1, 1024], 4)]) is None  # an output walked down a column
    assert stream_stage(big * 2048, [big, 1024], [([1024, 1], 2)]) is None  # float16: not a streamed itemsize
    assert stream_stage(big * 1024, [big, 1024], []) is None


def test_the_schedule_of_a_streamed_loop_counts_its_stage_rows():
    rows = cpu_elementwise.STREAM_MIN_BYTES // 4 // 4096 + 1
    shape = (rows, 4096)  # rows longer than a stage: tiles of a divisor of 4096
    got = elementwise_schedule(shape, [shape, (4096,), shape], outs=[(2, 4)])
    tile = stage_length(4096, 4)
    assert got == ElementwiseSchedule(rows * 4096, True, rows * 4096 // tile, tile, streamed=True)
    plain = elementwise_schedule(shape, [shape, (4096,), shape])  # no outputs named: nothing streams
    assert not plain.streamed and plain.rows == rows


@pytest.fixture
def kernel_dir(monkeypatch, tmp_path):
    """A kernel cache of the test's own (the kernels it generates are the files there)."""
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path))
    return tmp_path


@pytest.fixture
def streaming_everywhere(monkeypatch, kernel_dir):
    """Every loop stream_stage admits streams, at any size; yields the kernel cache directory."""
    monkeypatch.setattr(cpu_elementwise, "STREAM_MIN_BYTES", 0)
    return kernel_dir


def _streamed_sources(cache_dir) -> list[str]:
    texts = [p.read_text() for p in cache_dir.glob("*.py")]
    return [t for t in texts if "stream_row(" in t]


class Affine(nn.Module):
    """relu(x * w + b) + 0.5 * x, and x * w as a second output: a broadcasting loop with two outputs."""

    def __init__(self, width, dtype):
        super().__init__()
        self.w = nn.Parameter(torch.randn(width, dtype=dtype))
        self.b = nn.Parameter(torch.randn(width, dtype=dtype))

    def forward(self, x):
        return torch.relu(x * self.w + self.b) + 0.5 * x, x * self.w


def _compare(model, x, tol):
    """Compiled and eager outputs, and gradients of x and every parameter, agree."""
    compiled = nnc.compile(model)
    results = []
    for fn in (model, compiled):
        xi = x.detach().clone().requires_grad_(True)
        model.zero_grad()
        outs = fn(xi)
        (outs[0].sum() + (outs[1] * outs[1]).sum()).backward()
        results.append([o.detach().numpy() for o in outs] + [xi.grad.numpy()]
                       + [p.grad.numpy().copy() for p in model.parameters()])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, **tol)
    return compiled


@pytest.mark.parametrize("shape,dtype", [
    ((6, 37), torch.float32),     # a row of 148 bytes: unaligned heads and tails in every row
    ((5, 1000), torch.float64),
    ((3, 3000), torch.float32),   # 12000-byte rows: tiles of a divisor of 3000
    ((300, 1024), torch.float32),  # parallel (2**18 elements and more): the rows run as tasks on numba's threads
])
def test_compiled_models_that_stream_match_eager(streaming_everywhere, shape, dtype):
    torch.manual_seed(0)
    model = Affine(shape[-1], dtype)
    x = torch.randn(*shape, dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    _compare(model, x, tol)
    assert _streamed_sources(streaming_everywhere), "some kernel streams its outputs"


def test_in_place_updates_stream_into_the_tensor_they_read(streaming_everywhere):
    class AddBias(nn.Module):
        def forward(self, x, b):
            y = x * 1.5
            y.add_(b)
            return y
    x, b = torch.randn(40, 100), torch.randn(100)
    with torch.no_grad():
        np.testing.assert_allclose(nnc.compile(AddBias())(x, b).numpy(), AddBias()(x, b).numpy(), rtol=1e-6)
    assert _streamed_sources(streaming_everywhere)


def test_symbolic_sizes_keep_plain_stores(streaming_everywhere):
    torch.manual_seed(1)
    model = Affine(64, torch.float32)
    compiled = nnc.compile(model)
    with torch.no_grad():
        for rows in (3, 5, 7, 9):  # the batch dim turns symbolic after the second size
            x = torch.randn(rows, 64)
            for got, want in zip(compiled(x), model(x)):
                np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    sources = [p.read_text() for p in streaming_everywhere.glob("*.py")]
    symbolic = [s for s in sources if "sizes[" in s]
    assert symbolic and not any("stream_row(" in s for s in symbolic)


def test_kernels_below_the_threshold_store_plainly(kernel_dir):
    model = Affine(256, torch.float32)
    x = torch.randn(8, 256)
    assert math.prod(x.shape) * 4 < cpu_elementwise.STREAM_MIN_BYTES
    _compare(model, x, dict(rtol=1e-5, atol=1e-5))
    assert not _streamed_sources(kernel_dir)


class LinearGate(nn.Module):
    """A linear layer whose product feeds a broadcasting epilogue (the matmul kernel's elementwise_function)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(24, 40)
        self.scale = nn.Parameter(torch.randn(40))

    def forward(self, x):
        return torch.relu(self.fc(x) * self.scale) + 1.0


@pytest.mark.parametrize("rows", [7, 7000])  # serial, and parallel (2**18 elements and more)
def test_matmul_epilogues_that_stream_match_eager(streaming_everywhere, rows):
    torch.manual_seed(3)
    model = LinearGate()
    x = torch.randn(rows, 24)
    compiled = nnc.compile(model)
    results = []
    for fn in (model, compiled):
        xi = x.detach().clone().requires_grad_(True)
        model.zero_grad()
        fn(xi).square().sum().backward()
        results.append([fn(x).detach().numpy(), xi.grad.numpy()] + [p.grad.numpy().copy() for p in model.parameters()])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    assert any("_epilogue" in s for s in _streamed_sources(streaming_everywhere))
