"""Gather and scatter kernels (nnc/codegen/cpu_gather.py): getitem with one integer index tensor after full slices
(embedding, index_select, x[idx]) and index_put of that form (their backward, and x[idx] = v) run as generated loops,
compared with eager forward and backward."""
import warnings

import numpy as np
import pytest

import nnc
import runtime
from nnc.kernel import gather_dim
from runtime import nn


def _kinds(compiled):
    """(kind, op names) of every kernel of every plan the compiled module made."""
    return [(k.kind, tuple(n.target.op.name for n in k.nodes if hasattr(n.target, "op")))
            for c in compiled.compilations for p in c.plans for k in p.kernels]


def _compare(model, *inputs, tol=1e-12):
    """Compiled vs eager: outputs and parameter gradients (float64 models); returns the compiled module."""
    compiled = nnc.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to eager or to the interpreter
        out = compiled(*inputs)
    (out * runtime.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    want = model(*inputs)
    (want * runtime.linspace(-1, 1, want.numel(), dtype=want.dtype).reshape(want.shape)).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=tol, atol=tol)
    for got, p in zip(grads, model.parameters()):
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=tol, atol=tol)
    return compiled


class Embed(nn.Module):
    def __init__(self, vocab=11, dim=6, block=5):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, idx):
        _, t = idx.shape
        return self.head(runtime.tanh(self.tok(idx) + self.pos(runtime.arange(t))))


class Select(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.w = nn.Parameter(runtime.randn(4, 7, 3, dtype=runtime.float64))

    def forward(self, index):
        return runtime.sin(self.w.index_select(self.dim, index)) * 2


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_embedding_lookups_and_their_gradients_run_as_gather_kernels(index_dtype):
    runtime.manual_seed(0)
    model = Embed().double()
    idx = runtime.tensor(np.array([[1, 10, 3, 3, 0], [10, 10, 2, 9, 4], [5, 6, 7, 8, 1]], dtype=index_dtype))
    compiled = _compare(model, idx)
    kinds = _kinds(compiled)
    assert kinds.count(("gather", ("getitem",))) == 2  # token and position lookups
    assert kinds.count(("gather", ("index_put",))) == 2  # their weight gradients: rows added, repeats accumulate
    assert not [k for k in kinds if k[0] == "opaque" and k[1] in (("getitem",), ("index_put",))]


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_index_select_along_any_dim_with_negative_and_repeated_indices(dim):
    runtime.manual_seed(1)
    model = Select(dim)
    size = model.w.shape[dim]
    index = runtime.tensor(np.array([-1, 0, size - 1, -size, 0, 1]) % size - np.array([1, 0, 0, 0, 0, 0]) * size)
    _compare(model, index)


def test_size_one_index_and_size_one_rows():
    runtime.manual_seed(2)
    model = Embed(vocab=1, dim=1, block=1).double()
    _compare(model, runtime.tensor(np.zeros((1, 1), dtype=np.int64)))


def test_an_empty_index_gives_an_empty_result_as_eager():
    runtime.manual_seed(3)
    model = Select(0)
    _compare(model, runtime.tensor(np.zeros(0, dtype=np.int64)))


def test_an_index_out_of_range_raises_and_never_reads_outside():
    model = Select(1)
    compiled = nnc.compile(model)
    compiled(runtime.tensor(np.array([0, 6])))  # compiles
    for bad in (7, -8, 1000):
        with pytest.raises(IndexError, match="index out of range"):
            compiled(runtime.tensor(np.array([0, bad])))


def test_assigning_rows_in_forward_writes_the_last_repeat_as_eager():
    class Write(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(runtime.randn(5, 4, dtype=runtime.float64))

        def forward(self, index, values):
            x = self.w * 1.0
            x[index] = values * 3
            return x.cos()

    runtime.manual_seed(4)
    model = Write()
    index = runtime.tensor(np.array([3, 0, 3, -1]))
    values = runtime.tensor(np.random.default_rng(0).standard_normal((4, 4)))
    compiled = _compare(model, index, values)
    assert ("gather", ("index_put",)) in _kinds(compiled)


def test_float32_gathers_are_exact():
    runtime.manual_seed(5)
    model = Embed()
    idx = runtime.tensor(np.random.default_rng(1).integers(0, 11, (4, 5)))
    _compare(model, idx, tol=1e-6)


def test_only_full_slices_then_one_integer_index_is_a_gather():
    from nnc.passes.decompose import decompose

    class Mixed(nn.Module):
        def forward(self, x, i, mask):
            return x[i], x[:, i], x[:, i, None], x[1:, i], x[mask], x[i, i]

    x = runtime.randn(6, 6)
    i = runtime.tensor(np.array([0, 2]))
    mask = runtime.tensor(np.array([True, False] * 3))
    gm = decompose(nnc.symbolic_trace(Mixed(), example_inputs={"x": x, "i": i, "mask": mask}), x, i, mask)
    dims = [gather_dim(n) for n in gm.graph.nodes
            if n.op == "call_function" and getattr(getattr(n.target, "op", None), "name", None) == "getitem"]
    assert dims[:2] == [0, 1] and len(dims) >= 5 and set(dims[2:]) == {None}  # x[:, i, None], x[1:, i], x[mask], ..


def test_symbolic_sizes_gather_and_scatter_at_every_length():
    runtime.manual_seed(7)
    model = Embed(block=16).double()
    compiled = nnc.compile(model, dynamic=True)
    for t in (5, 9, 3, 16):
        idx = runtime.tensor(np.random.default_rng(t).integers(0, 11, (2, t)))
        out = compiled(idx)
        out.sum().backward()
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        model.zero_grad()
        want = model(idx)
        want.sum().backward()
        np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
        for got, p in zip(grads, model.parameters()):
            np.testing.assert_allclose(got, p.grad.numpy(), rtol=1e-12, atol=1e-12)
        model.zero_grad()
    # NOTE: a floor division in the reduction schedule pins the length (an equality guard), so lengths after the
    # first dynamic variant may compile static; the gathers themselves compile with symbols
    assert compiled.compiled_variants <= 3
    symbolic = [k for c in compiled.compilations for p in c.plans for k in p.kernels
                if k.kind == "gather" and "S" in str(k.shape)]
    assert symbolic


def test_a_gpt_forward_without_gradients_runs_as_one_numba_function():
    from real_models import GPT, GPTConfig

    runtime.manual_seed(6)
    model = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8, dropout=0.0))
    model.eval()
    idx = runtime.tensor(np.random.default_rng(2).integers(0, 16, (1, 8)))
    compiled = nnc.compile(model)
    with runtime.no_grad():
        got, _ = compiled(idx)
        want, _ = model(idx)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    plan = compiled.compilations[0].plans[0]
    assert plan.whole_graph, plan.whole_graph_reason


class ViewedEmbed(nn.Module):
    """An embedding of a reshaped (contiguous view) or transposed (strided view) index, and its row gradient."""

    def __init__(self, transposed):
        super().__init__()
        self.emb = nn.Embedding(9, 4, dtype=runtime.float64)
        self.transposed = transposed

    def forward(self, idx):
        index = idx.t() if self.transposed else idx.reshape(-1)
        return runtime.tanh(self.emb(index)).reshape(-1, 4) * 3


@pytest.mark.parametrize("transposed", [False, True])
def test_views_of_the_index_fold_into_gather_kernels_when_contiguous(transposed):
    """A reshaped index (a contiguous run of its base) is read in place by the gather and its scatter, with no view
    step; a transposed one, which Embedding flattens, is copied by a clone kernel first. Both match eager."""
    runtime.manual_seed(4)
    idx = runtime.tensor(np.random.default_rng(4).integers(0, 9, (3, 5)))
    compiled = _compare(ViewedEmbed(transposed), idx)
    kernels = [k for c in compiled.compilations for p in c.plans for k in p.kernels]
    assert not [k for k in kernels if k.kind == "opaque" and {"reshape", "permute"} & set(k.meta["ops"])]
    copies = [k for k in kernels if k.meta["ops"] == ["clone"]]
    assert bool(copies) == transposed, [(k.kind, k.meta["ops"]) for k in kernels]


class ConvThenAntialiasedResize(nn.Module):
    """A batch-1 conv output resized with antialiasing: its gathers read the conv's [1, C, H, W] value through a
    permute whose size-1 dim has a stride a C-contiguous array would not have."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1).double()

    def forward(self, x):
        return nn.functional.interpolate(self.conv(x), size=(5, 5), mode="bilinear", antialias=True,
                                         align_corners=False)


def test_a_view_strided_only_along_a_size_one_dim_is_a_contiguous_run_for_gathers():
    runtime.manual_seed(6)
    compiled = _compare(ConvThenAntialiasedResize(), runtime.randn(1, 2, 4, 4, dtype=runtime.float64))
    kernels = [k for c in compiled.compilations for p in c.plans for k in p.kernels]
    folded = [v for k in kernels if k.kind == "gather" for v in k.meta.get("views", {}).values()]
    assert any(1 in v.shape for v in folded)  # the case: a folded view with a size-1 dim, compiled
