"""Cat kernels (nnc/codegen/cpu_cat.py): a cat of static shapes and one dtype runs as a generated copy loop per
input, reading views folded into its indexing, compared with eager forward and backward; other cats run as is."""
import warnings

import numpy as np
import pytest

import nnc
import runtime
from runtime import nn

from helpers import compiled_matches_eager, kernels_of

F64 = runtime.float64


class Cat(nn.Module):
    """tanh of a cat of (views of) parameters along `dim`; `views` says how each parameter is read."""

    def __init__(self, shapes, dim, views=None):
        super().__init__()
        self.ws = nn.ParameterList([nn.Parameter(runtime.randn(*s, dtype=F64)) for s in shapes])
        self.dim, self.views = dim, views or [lambda w: w] * len(shapes)

    def forward(self, x):
        parts = [view(w * x) for view, w in zip(self.views, self.ws)]
        return runtime.tanh(runtime.cat(parts, self.dim))


class Fn(nn.Module):
    """A function as a Module (nnc.compile takes Modules)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a, b):
        return self.fn(a, b)


CASES = {
    "dim0": ([(2, 3), (4, 3), (1, 3)], 0, None),
    "last_dim": ([(3, 2), (3, 5)], -1, None),
    "middle_dim_3d": ([(2, 1, 4), (2, 3, 4), (2, 2, 4)], 1, None),
    "permuted_inputs": ([(4, 3), (3, 4)], 1, [lambda w: w.t(), lambda w: w]),
    "sliced_inputs": ([(5, 6), (3, 2)], 1, [lambda w: w[1:4, ::2], lambda w: w]),
    "size_1": ([(1, 1), (1, 1)], 0, None),
    "one_input": ([(2, 3)], 1, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cat_kernels_match_eager(case):
    shapes, dim, views = CASES[case]
    runtime.manual_seed(0)
    compiled = compiled_matches_eager(Cat(shapes, dim, views), runtime.tensor(1.5, dtype=F64))
    kinds = [k.kind for k in kernels_of(compiled)]
    assert "cat" in kinds, kinds
    assert not any(k.kind == "opaque" for k in kernels_of(compiled) if "cat" in k.meta.get("ops", ())), kinds


def test_views_only_a_cat_reads_are_folded_into_it():
    """A transposed and a sliced parameter read by a cat: no view runs as a step of its own."""
    runtime.manual_seed(1)
    compiled = compiled_matches_eager(Cat([(4, 3), (5, 6)], 1, [lambda w: w.t(), lambda w: w[1:4, ::3]]),
                        runtime.tensor(0.5, dtype=F64))
    forward = compiled.compilations[0].plans[0]
    assert not [k for k in forward.kernels if k.kind == "opaque"], [(k.kind, k.reason) for k in forward.kernels]


def test_a_large_cat_runs_parallel_loops_and_matches_eager():
    from nnc.codegen.cpu import schedule
    from nnc.codegen.cpu_elementwise import PARALLEL_MIN_ELEMENTS

    rows = PARALLEL_MIN_ELEMENTS // 64
    model = Cat([(rows, 64), (3, 64)], 0)
    compiled = compiled_matches_eager(model, runtime.tensor(0.25, dtype=F64))
    [cat] = [k for k in kernels_of(compiled) if k.kind == "cat"]
    assert schedule(cat).parallel == (True, False)


def test_integer_and_bool_cats_run_askernels_of():
    def both(a, b):
        return runtime.cat([a, b], 0), runtime.cat([a > 0, b > 0], 0)

    a, b = runtime.arange(6).reshape(2, 3), runtime.arange(3).reshape(1, 3) - 1
    compiled = nnc.compile(Fn(both))
    got, want = compiled(a, b), both(a, b)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert [k.kind for k in kernels_of(compiled)].count("cat") == 2


def test_size_0_inputs():
    def f(a, b):
        return runtime.cat([a, b], 0) * 2

    a, b = runtime.randn(0, 3, dtype=F64), runtime.randn(2, 3, dtype=F64)
    np.testing.assert_array_equal(nnc.compile(Fn(f))(a, b).numpy(), f(a, b).numpy())


def test_mixed_dtypes_are_cast_first_and_symbolic_sizes_stay_opaque():
    from nnc.kernel import is_plain_cat

    def mixed(a, b):
        return runtime.cat([a, b], 0)

    a, b = runtime.randn(2, 3), runtime.randn(1, 3, dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = nnc.compile(Fn(mixed))
        got = compiled(a, b)
    assert [k.kind for k in kernels_of(compiled)] == ["elementwise", "cat"]  # the float32 input cast, then the cat
    assert got.dtype == F64
    np.testing.assert_array_equal(got.numpy(), mixed(a, b).numpy())

    def grow(cache, x):
        return runtime.cat([cache, x], 1) * 2

    compiled = nnc.compile(Fn(grow), dynamic=True)
    for t in (3, 4, 5):
        cache, x = runtime.randn(2, t, 4), runtime.randn(2, 1, 4)
        np.testing.assert_array_equal(compiled(cache, x).numpy(), grow(cache, x).numpy())
    cats = [n for k in kernels_of(compiled) for n in k.nodes if getattr(n.target, "op", None) is not None
            and n.target.op.name == "cat"]
    assert cats and not any(is_plain_cat(n) for n in cats)
