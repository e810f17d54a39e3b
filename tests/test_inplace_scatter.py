"""In-place scatters (scatter_, index_add_, index_fill_, fill_diagonal_ ...): eager vs torch, compiled vs eager."""
import copy
import warnings

import numpy as np
import pytest

import nnc
import runtime
from runtime import nn


def _weighted_sum(lib, out):
    """A loss whose gradient differs per element, so a gradient in the wrong place shows."""
    return (out * lib.tensor(np.linspace(-1, 1, out.numel()).reshape(tuple(out.shape)))).sum()


def _grads(*tensors):
    return [None if t.grad is None else t.grad.numpy().copy() for t in tensors]


def _assert_same(got, want, tol=1e-12):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def _compiled_matches_eager(model, *inputs):
    """Compiled and eager agree on outputs and input gradients; the compiled module runs no part eagerly."""
    results = []
    for module in (nnc.compile(copy.deepcopy(model)), model):
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to eager, no kernel left to the interpreter
            out = module(*leaves)
            _weighted_sum(runtime, out).backward()
        results.append([out.detach().numpy(), *_grads(*leaves)])
    _assert_same(*results)
    report = nnc.explain(model, *inputs, backward=True)
    assert report.graph_breaks == [] and report.pieces == 0, str(report)


# -- index_put of a Python scalar as a generated gather kernel ------------------------------------------------------


class FillColumns(nn.Module):
    """A Python scalar written into whole columns: by index_fill_, or by `y[:, index] = value`."""

    def __init__(self, value, setitem=False):
        super().__init__()
        self.value, self.setitem = value, setitem

    def forward(self, x):
        y = x * 2
        index = runtime.tensor([0, 3, -1, 0])
        if self.setitem:
            y[:, index] = self.value
        else:
            y.index_fill_(1, index, self.value)
        return y + 1


@pytest.mark.parametrize("setitem", [False, True], ids=["index_fill_", "setitem"])
@pytest.mark.parametrize("dtype, value", [(runtime.float32, 0.1), (runtime.float64, -2.5), (runtime.int64, 1.7),
                                          (runtime.int32, -3), (runtime.float32, float("nan"))])
def test_a_scalar_written_at_an_index_runs_as_a_generated_gather_kernel(dtype, value, setitem):
    x = runtime.arange(30).reshape(5, 6).to(dtype)
    model = FillColumns(value, setitem)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a kernel that fails to generate warns and runs in the interpreter
        got = nnc.compile(model)(x)
    np.testing.assert_array_equal(got.numpy(), model(x).numpy())
    report = nnc.explain(model, x)
    gathers = [k for k in report.kernels if k.kind == "gather"]
    assert gathers and all(k.generated and not k.fallback for k in gathers), str(report)


def test_a_scalar_written_at_an_index_has_eager_gradients():
    _compiled_matches_eager(FillColumns(0.25), runtime.randn(5, 6, dtype=runtime.float64, requires_grad=True))
