"""torch's out= keyword on module-level functions: eagerly as torch, and compiled as an in-place write."""
import warnings

import numpy as np
import pytest

import nnc
import runtime
from runtime import nn


def test_the_result_is_written_into_out_and_out_is_returned():
    a, b, out = runtime.tensor([1.0, 2.0]), runtime.tensor([3.0, 4.0]), runtime.empty(2)
    assert runtime.add(a, b, out=out) is out
    np.testing.assert_array_equal(out.numpy(), [4.0, 6.0])
    assert runtime.cat([a, b], out=runtime.empty(4)).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_out_of_another_shape_is_resized_with_torchs_warning():
    out = runtime.zeros(3)
    with pytest.warns(UserWarning, match="was resized since it had shape \\[3\\]"):
        runtime.mul(runtime.ones(2), 2, out=out)
    assert out.shape == (2,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty out is resized silently
        runtime.mul(runtime.ones(2), 2, out=runtime.empty(0))


def test_out_refuses_a_narrower_dtype_and_recorded_gradients():
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type int64"):
        runtime.add(runtime.ones(2), 1.5, out=runtime.zeros(2, dtype=runtime.int64))
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        runtime.exp(runtime.ones(2, requires_grad=True), out=runtime.empty(2))
    with runtime.no_grad():
        runtime.exp(runtime.ones(2, requires_grad=True), out=runtime.empty(2))  # allowed, as in torch


def test_same_as_torch(torch):
    for name in ("add", "mul", "maximum"):
        want = getattr(torch, name)(torch.tensor([1.0, -2.0]), torch.tensor([3.0, 4.0]), out=torch.empty(2))
        got = getattr(runtime, name)(runtime.tensor([1.0, -2.0]), runtime.tensor([3.0, 4.0]), out=runtime.empty(2))
        np.testing.assert_array_equal(got.numpy(), want.numpy())


class Accumulate(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", runtime.zeros(3))

    def forward(self, x):
        scaled = x * 0
        runtime.mul(x, 2, out=scaled)
        runtime.add(self.total, scaled, out=self.total)
        return scaled + self.total


def test_compiled_out_writes_are_functionalized():
    eager, compiled = Accumulate(), nnc.compile(Accumulate())
    with warnings.catch_warnings(), runtime.no_grad():
        warnings.simplefilter("error")  # compiles: no fallback warning
        for step in range(3):
            x = runtime.arange(3.0) + step
            np.testing.assert_array_equal(compiled(x).numpy(), eager(x).numpy())
    np.testing.assert_array_equal(compiled.total.numpy(), eager.total.numpy())
    (artifact,) = compiled._cache.values()
    assert [w.where for w in artifact.writes] == ["total"]


def test_out_into_a_tensor_made_outside_the_graph_runs_eagerly():
    """While tracing, such a tensor is real: the write would reach the graph but not the Python code after it."""

    class Fresh(nn.Module):
        def forward(self, x):
            h = runtime.zeros(3)
            runtime.add(h, x, out=h)
            h[0] = 5.0
            return h * 2

    compiled = nnc.compile(Fresh())
    with pytest.warns(RuntimeWarning, match="out= a tensor that is not a traced value"), runtime.no_grad():
        got = compiled(runtime.ones(3))
    assert got.tolist() == Fresh()(runtime.ones(3)).tolist() == [10.0, 2.0, 2.0]
