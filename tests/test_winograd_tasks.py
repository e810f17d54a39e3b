"""How the Winograd plane transforms split their work into tasks (nnc/codegen/cpu_winograd.py): several channels a
task when one chunk holds every sample, several chunks of samples a channel otherwise, partial last groups and
chunks; each against the interpreter's numpy forwards, forward and both gradients, in float64. And which relu the
output transform's epilogue (winograd_output_bias) takes."""
from __future__ import annotations

import numpy as np
import pytest

import nnc
import runtime
from nnc.codegen import cpu_winograd
from nnc.passes import winograd as winograd_pass
from runtime import _winograd

from test_winograd import _module, _ops_in, _plans, _run

# 9 input channels, 5 output channels, 11 x 13 outputs (padding 1) in 3 x 4 tiles of 4 x 4: 12 tiles a sample
SHAPE, OUT_CHANNELS, PADDING = (3, 9, 11, 13), 5, 1


def _tiling(op: str, chunk_tiles: int, group_tiles: int, monkeypatch):
    monkeypatch.setattr(cpu_winograd, "CHUNK_TILES", chunk_tiles)
    monkeypatch.setattr(cpu_winograd, "GROUP_TILES", group_tiles)
    shape = ((36, OUT_CHANNELS, SHAPE[0] * 12) if op == "winograd_output" else SHAPE)
    out_shape = (OUT_CHANNELS, SHAPE[0] * 11 * 13) if op == "winograd_output" else (36, SHAPE[1], SHAPE[0] * 12)
    attrs = {"tile": 4, "padding": ((PADDING,) * 2,) * 2, "size": (11, 13)}
    return cpu_winograd._tiling_of(op, attrs, shape, out_shape)[0]


def test_which_row_strides_go_through_a_buffer():
    """36 rows 288 KiB apart (conv2 of the MNIST CNN at batch 64) map to one L1 set; 4.5 KiB apart to 8."""
    assert cpu_winograd._conflicting(36, 32 * 2304, 4)
    assert not cpu_winograd._conflicting(36, 1152, 4) and not cpu_winograd._conflicting(36, 2304, 4)
    assert not cpu_winograd._conflicting(36, 1153, 4)  # not line-aligned: rows spread over the sets


def test_the_task_split(monkeypatch):
    """Several channels a task only when one chunk holds every sample; the last group or chunk may be partial."""
    grouped = _tiling("winograd_input", 512, 72, monkeypatch)  # 36 tiles of 3 samples: 2 channels a task
    assert (grouped.chunks, grouped.group, grouped.tasks, grouped.columns) == (1, 2, 5, 72)
    chunked = _tiling("winograd_output", 24, 4096, monkeypatch)  # 2 samples a chunk, 2 chunks, one channel a task
    assert (chunked.chunks, chunked.group, chunked.tasks, chunked.columns) == (2, 1, 10, 24)
    whole = _tiling("winograd_output", 512, 4096, monkeypatch)
    assert (whole.chunks, whole.group, whole.tasks) == (1, OUT_CHANNELS, 1)


@pytest.mark.parametrize("chunk_tiles,group_tiles,rows_per_set", [(512, 72, 12), (24, 4096, 12), (24, 4096, 0)],
                         ids=["channel_groups", "sample_chunks", "rows_through_a_buffer"])
def test_task_splits_match_the_interpreter(chunk_tiles, group_tiles, rows_per_set, monkeypatch):
    """rows_per_set 0: every transform loop reads or writes the transformed rows through a buffer (as where their
    stride would map too many to one cache set)."""
    monkeypatch.setattr(winograd_pass, "MIN_DIRECT_WORK", 0)
    monkeypatch.setattr(cpu_winograd, "CHUNK_TILES", chunk_tiles)
    monkeypatch.setattr(cpu_winograd, "GROUP_TILES", group_tiles)
    monkeypatch.setattr(cpu_winograd, "ROWS_PER_SET", rows_per_set)
    runtime.manual_seed(0)
    m = _module(runtime, SHAPE, OUT_CHANNELS, PADDING, True, "relu").double()
    rng = np.random.default_rng(6)
    x = rng.standard_normal(SHAPE)
    gy = rng.standard_normal((SHAPE[0], OUT_CHANNELS) + _winograd.output_sizes(SHAPE[2:], ((PADDING,) * 2,) * 2))
    want = _run(m, nnc.compile(m, codegen=False), x, gy)
    compiled = nnc.compile(m)
    got = _run(m, compiled, x, gy)
    assert "winograd_input" in _ops_in(compiled) and all(not p.fallbacks for p in _plans(compiled))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_a_relu_that_is_not_the_convolutions_only_use_stays_a_kernel_of_its_own(monkeypatch):
    """The output transform takes the bias add, not a relu whose input is read elsewhere too."""
    monkeypatch.setattr(winograd_pass, "MIN_DIRECT_WORK", 0)
    runtime.manual_seed(0)
    conv = runtime.nn.Conv2d(8, 5, 3)  # test_winograd's valid_odd convolution

    class M(runtime.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            y = self.conv(x)
            return runtime.relu(y) * 1.5 + y

    m = M().double()
    rng = np.random.default_rng(7)
    x, gy = rng.standard_normal((2, 8, 7, 9)), rng.standard_normal((2, 5, 5, 7))
    compiled = nnc.compile(m)
    got, want = _run(m, compiled, x, gy), _run(m, m, x, gy)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    ops = _ops_in(compiled)
    assert "winograd_output_bias" in ops and "relu" in ops
