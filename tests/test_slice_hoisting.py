"""nnc.passes.slices: a basic slice of a computed value moves above the ops computing it. Compiled results (forward
and parameter gradients, float64) match eager's, and the graph computes only the slice where the rules allow."""
import numpy as np
import pytest

import nnc
import runtime
from nnc import pipeline
from runtime import nn
from tests.helpers import compiled_matches_eager

F = nn.functional


def _forward(model, x, needs_grad=False):
    """The forward graph of model(x) after the simplify stage."""
    c = pipeline.Compilation(model, {}, {"x": x}, needs_grad=needs_grad)
    pipeline.run_stages(c, until="simplify")
    return c.forward.graph


def _calls(graph, name):
    return [n for n in graph.nodes if n.op == "call_function" and getattr(n.target, "__name__", "") == name]


def _x(*shape, seed=0):
    return runtime.tensor(np.random.default_rng(seed).standard_normal(shape))


class LastRow(nn.Module):
    """A transformer tail: LayerNorm, GELU MLP with a residual, a head; the last position's logits."""

    def __init__(self, width=8, vocab=5):
        super().__init__()
        self.ln, self.fc, self.out = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, x):
        x = x + self.out(F.gelu(self.fc(self.ln(x))))
        return self.head(x)[:, -1, :]


class Attention(nn.Module):
    """Causal self-attention (view, transpose, batched matmuls, masked softmax) returning some query rows."""

    def __init__(self, width=8, heads=2, length=6, rows=slice(-2, None)):
        super().__init__()
        self.qkv, self.proj, self.heads, self.rows = nn.Linear(width, 3 * width), nn.Linear(width, width), heads, rows
        self.register_buffer("mask", runtime.tril(runtime.ones(length, length)).view(1, 1, length, length))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * 0.5
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)[:, self.rows]


class Lambda(nn.Module):
    def __init__(self, fn, *params):
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(_x(*params[0], seed=3)) if params else None

    def forward(self, x):
        return self.fn(x, self.w)


CASES = {
    "int index after linear": (LastRow, (2, 6, 8)),
    "attention rows": (Attention, (2, 6, 8)),
    "one attention row": (lambda: Attention(rows=slice(3, 4)), (1, 6, 8)),
    "strided rows": (lambda: Lambda(lambda x, w: (x * w).softmax(-1)[:, 1::2], (1, 5)), (3, 7, 5)),
    "broadcast operand": (lambda: Lambda(lambda x, w: (x.exp() + w)[1:, 2], (7, 1)), (3, 7, 4)),
    "sum over the other dim": (lambda: Lambda(lambda x, w: (x * w).sum(1)[:, 2:5], (6, 6)), (2, 6, 6)),
    "amax keepdim": (lambda: Lambda(lambda x, w: (x * w).amax(-1, keepdim=True)[0], (4,)), (3, 2, 4)),
    "slice of a slice": (lambda: Lambda(lambda x, w: (x * w)[:, 2:10][:, ::3], (12,)), (2, 12)),
    "permute and reshape": (lambda: Lambda(lambda x, w: (x * w).reshape(2, 3, 4).permute(0, 2, 1)[:, 1], (12,)),
                            (2, 12)),
    "matmul with a 2-d weight": (lambda: Lambda(lambda x, w: (x @ w).tanh()[:, -1], (4, 3)), (2, 5, 4)),
    "size-1 dims": (lambda: Lambda(lambda x, w: (x * w).relu()[0, :, 0:1], (1,)), (1, 1, 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_matches_eager_forward_and_backward(name):
    build, shape = CASES[name]
    runtime.manual_seed(0)
    model = build().double()
    compiled_matches_eager(model, _x(*shape))


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_matches_eager_under_no_grad(name):
    build, shape = CASES[name]
    runtime.manual_seed(0)
    model = build().double()
    x = _x(*shape)
    with runtime.no_grad():
        got, want = nnc.compile(model)(x), model(x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)


def test_the_head_and_mlp_compute_only_the_last_row():
    runtime.manual_seed(0)
    graph = _forward(LastRow().double(), _x(2, 6, 8))
    linears = _calls(graph, "linear")
    assert [tuple(n.args[0].meta["shape"])[:-1] for n in linears] == [(2, 1)] * 3
    assert {tuple(n.meta["shape"]) for n in _calls(graph, "sum")} == {(2, 1, 1)}


def test_attention_keeps_keys_and_values_whole_and_slices_the_queries():
    runtime.manual_seed(0)
    graph = _forward(Attention(rows=slice(3, 4)).double(), _x(1, 6, 8))
    (qkv, proj) = _calls(graph, "linear")
    assert tuple(qkv.meta["shape"]) == (1, 6, 24)  # keys and values need every position
    assert tuple(proj.meta["shape"]) == (1, 1, 8)
    assert sorted(tuple(n.meta["shape"]) for n in _calls(graph, "matmul")) == [(1, 2, 1, 4), (1, 2, 1, 6)]
    assert {tuple(n.meta["shape"]) for n in _calls(graph, "exp")} == {(1, 2, 1, 6)}


def test_a_value_also_used_whole_is_computed_once_whole():
    model = Lambda(lambda x, w: (x * w).exp()[:, 0] + (x * w).exp().sum(1), (4,)).double()
    graph = _forward(model, _x(3, 4))
    assert [tuple(n.meta["shape"]) for n in _calls(graph, "exp")] == [(3, 4)]
    compiled_matches_eager(model, _x(3, 4))


def test_a_reduction_is_sliced_on_the_dims_it_keeps():
    model = Lambda(lambda x, w: (x * w).sum(1, keepdim=True)[:, :, 1], (3,)).double()
    graph = _forward(model, _x(2, 3, 3))
    assert [tuple(n.meta["shape"]) for n in _calls(graph, "sum")] == [(2, 1, 1)]
    model = Lambda(lambda x, w: (x * w).sum(-1)[:1], (5,)).double()
    graph = _forward(model, _x(4, 5))
    assert [tuple(n.args[0].meta["shape"]) for n in _calls(graph, "sum")] == [(1, 5)]
    compiled_matches_eager(model, _x(4, 5))


def test_an_empty_slice():
    model = Lambda(lambda x, w: (x * w).tanh()[:, 3:3], (4,)).double()
    graph = _forward(model, _x(2, 4))
    assert [tuple(n.meta["shape"]) for n in _calls(graph, "tanh")] == [(2, 0)]
    compiled_matches_eager(model, _x(2, 4))


def test_random_draws_stay_whole():
    """Dropout's Philox draw depends on each element's position: the slice stays below it."""
    model = Lambda(lambda x, w: F.dropout((x * w).tanh(), 0.5, training=True)[:, -1], (4,)).double()
    graph = _forward(model, _x(3, 5, 4), needs_grad=True)
    draws = [n for n in graph.nodes if n.op == "call_function" and getattr(n.target, "__name__", "")
             .startswith("philox")]
    assert draws and all(tuple(n.meta["shape"]) == (3, 5, 4) for n in draws)


def test_float32_gpt_shaped_tail_matches_eager():
    runtime.manual_seed(0)
    model = LastRow(width=16, vocab=11)
    model.eval()
    x = runtime.tensor(np.random.default_rng(1).standard_normal((1, 9, 16)).astype(np.float32))
    with runtime.no_grad():
        got, want = nnc.compile(model)(x), model(x)
    assert got.shape == (1, 11)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
