"""Take kernels (nnc/codegen/cpu_take.py): torch.gather and scatter_add along one dim run as generated loops that
read folded views, compared with eager forward and backward; cross-entropy's pick and its gradient among them."""
import numpy as np
import pytest

import nnc
import runtime
import runtime.nn.functional as F
from runtime import nn

from helpers import compiled_matches_eager, kernels_of

F64 = runtime.float64


def _ops_of_kind(compiled, kind):
    return sorted(n.target.op.name for k in kernels_of(compiled) if k.kind == kind for n in k.nodes)


class Gather(nn.Module):
    """sin(gather(w or its transpose, dim, index)) * 2: gather forward, scatter_add in the backward."""

    def __init__(self, shape, dim, transposed=False):
        super().__init__()
        self.w = nn.Parameter(runtime.randn(*shape, dtype=F64))
        self.dim, self.transposed = dim, transposed

    def forward(self, index):
        w = self.w.t() if self.transposed else self.w
        return runtime.sin(runtime.gather(w, self.dim, index)) * 2


def _index(shape, size, seed):
    return runtime.tensor(np.random.default_rng(seed).integers(0, size, shape))


@pytest.mark.parametrize("shape,dim,index_shape,transposed", [
    ((5, 7), 1, (5, 3), False),     # a row's picks, as cross-entropy's
    ((5, 7), 0, (2, 7), False),
    ((5, 7), 1, (3, 2), False),     # an index smaller than x off the dim too
    ((7, 5), 1, (5, 4), True),      # x read through a transposed view
    ((2, 3, 4), 2, (2, 3, 6), False),  # more picks than the dim has: repeats accumulate in the backward
    ((2, 3, 4), 0, (2, 1, 4), False),
    ((1, 1), 1, (1, 1), False),
])
def test_gather_and_its_scatter_add_gradient_match_eager(shape, dim, index_shape, transposed):
    runtime.manual_seed(0)
    size = (shape[::-1] if transposed else shape)[dim]
    compiled = compiled_matches_eager(Gather(shape, dim, transposed), _index(index_shape, size, 1))
    assert _ops_of_kind(compiled, "take") == ["gather", "scatter_add"]


class ScatterAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Parameter(runtime.randn(4, 6, dtype=F64))
        self.src = nn.Parameter(runtime.randn(4, 9, dtype=F64))

    def forward(self, index):
        return runtime.tanh(self.base.scatter_add(1, index, self.src * 3))


def test_scatter_add_with_repeated_indices_and_its_gradients_match_eager():
    compiled = compiled_matches_eager(ScatterAdd(), _index((4, 9), 6, 2))
    assert "scatter_add" in _ops_of_kind(compiled, "take")


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(10, 7, dtype=F64)

    def forward(self, x, target):
        return F.cross_entropy(self.linear(x).reshape(-1, 7), target.reshape(-1))


def test_cross_entropy_picks_and_gradient_are_takekernels_of():
    runtime.manual_seed(3)
    x = runtime.randn(3, 4, 10, dtype=F64)
    target = _index((3, 4), 7, 4)
    model = Classifier()
    compiled = compiled_matches_eager(model, x, target)
    kinds = [(k.kind, k.meta["ops"]) for k in kernels_of(compiled)]
    assert not any(kind == "opaque" and {"gather", "scatter_add", "reshape"} & set(ops) for kind, ops in kinds), kinds


def test_a_large_gather_runs_a_parallel_loop():
    from nnc.codegen.cpu import schedule
    from nnc.codegen.cpu_elementwise import PARALLEL_MIN_ELEMENTS

    rows = PARALLEL_MIN_ELEMENTS // 8
    compiled = compiled_matches_eager(Gather((rows, 9), 1), _index((rows, 8), 9, 5))
    take = [k for k in kernels_of(compiled) if k.kind == "take"]
    assert [schedule(k).parallel for k in take] == [True, False]  # the gather; the scatter stays in order


@pytest.mark.parametrize("bad", [7, -1])
def test_an_index_out_of_range_raises_before_writing(bad):
    model = Gather((5, 7), 1)
    compiled = nnc.compile(model)
    good = _index((5, 3), 7, 6)
    compiled(good)  # compiled for these shapes
    index = good.clone()
    index[2, 1] = bad
    with pytest.raises(RuntimeError, match="out of bounds for dimension 1 with size 7"):
        compiled(index)
    with pytest.raises(RuntimeError, match="out of bounds for dimension 1 with size 7"):
        model(index)


def test_size_0_index():
    model = Gather((3, 4), 1)
    index = runtime.zeros(3, 0, dtype=runtime.int64)
    got = nnc.compile(model)(index)
    assert tuple(got.shape) == (3, 0)
