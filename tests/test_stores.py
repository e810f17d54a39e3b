"""Copies folded into their producers' stores (nnc.passes.stores): attention's head merge (a clone of a permuted
product) and the q/k/v gradients' cat are written by the matmuls themselves. Compiled against eager, forward and
backward, float32 and float64, the batched loop and np.matmul sizes, batch 1, size 0, the interpreter fallback,
threads and whole-graph mode; the memory plan never hands a written buffer to another value."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import nnc
import runtime as torch
from nnc.passes.fusion import verify
from nnc.passes.stores import Store
from runtime import nn

from helpers import compiled_matches_eager, run_in_threads


class Attention(nn.Module):
    """Multi-head self-attention as nanoGPT writes it: packed q/k/v, heads by view + transpose, merged back by
    transpose + contiguous + view."""

    def __init__(self, n_embd=16, n_head=2):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.n_head)), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


def plans(compiled):
    return [plan for compilation in compiled.compilations for plan in compilation.plans]


def stored_kernels(compiled):
    return [k for plan in plans(compiled) for k in plan.kernels if k.meta.get("stores")]


# float32: sums of 512 products (the BLAS size) differ from eager by ~1e-4 with the stores or without them
TOL = {torch.float32: 5e-4, torch.float64: 1e-12}
# (batch, length, n_embd, heads): the batched loop's sizes, and np.matmul's (over 2**20 multiply-adds a product)
SIZES = {"loop": (2, 8, 16, 2), "batch1": (1, 8, 16, 2), "blas": (8, 64, 64, 2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("size", sorted(SIZES))
def test_attention_stores_match_eager(size, dtype):
    b, t, c, h = SIZES[size]
    torch.manual_seed(0)
    model = Attention(c, h).to(dtype)
    x = torch.randn(b, t, c, dtype=dtype)
    compiled = compiled_matches_eager(model, x, tol=TOL[dtype])
    kernels = [k for plan in plans(compiled) for k in plan.kernels]
    # the forward's head merge and the backward's q/k/v cat run in no kernel of their own
    assert not [k for k in kernels if k.meta["ops"] == ["clone"] or k.kind == "cat"], [k.meta["ops"] for k in kernels]
    stored = stored_kernels(compiled)
    targets = [s.target.target.op.name for k in stored for s in k.meta["stores"].values()]
    assert targets.count("clone") == 1 and targets.count("cat") == 3, targets
    assert sum(bool(k.meta.get("writes_into")) for k in stored) == 2
    for plan in plans(compiled):
        verify(plan.kernels, plan.gm.graph)
        assert plan.fallbacks == []


def test_transposed_place_swaps_the_operands_for_blas():
    """v's gradient (att^T @ dy, computed transposed) lies in the cat with its rows down a column: np.matmul writes
    it as C^T = B^T A^T, so BLAS stores it directly."""
    b, t, c, h = SIZES["blas"]
    torch.manual_seed(0)
    compiled = compiled_matches_eager(Attention(c, h), torch.randn(b, t, c), tol=TOL[torch.float32])
    sources = [k.meta["source"] for k in stored_kernels(compiled)]
    assert any("np.swapaxes" in s for s in sources) and all("np.matmul(" in s for s in sources)
    assert all("buffer=outs[" in s for s in sources)


def test_batched_loop_writes_rows_at_their_places():
    torch.manual_seed(0)
    compiled = compiled_matches_eager(Attention(), torch.randn(2, 8, 16), tol=TOL[torch.float32])
    sources = [k.meta["source"] for k in stored_kernels(compiled)]
    assert sources and all("ro = " in s and "np.matmul" not in s for s in sources)


def test_size_zero_batch_matches_eager():
    torch.manual_seed(0)
    model = Attention()
    x = torch.randn(0, 8, 16, requires_grad=True)
    compiled = nnc.compile(model)
    out = compiled(x)
    assert out.shape == (0, 8, 16)
    out.sum().backward()
    assert x.grad.shape == (0, 8, 16)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in model.parameters())


def test_interpreter_fallback_writes_the_same_places(monkeypatch):
    """A stored kernel that fails to compile runs in the interpreter, which stores its product at the same place."""
    import nnc.codegen.cpu as cpu

    real = cpu.compile_kernel

    def refuse_stored(kernel):
        if kernel.meta.get("stores"):
            raise RuntimeError("refused for the test")
        return real(kernel)

    monkeypatch.setattr(cpu, "compile_kernel", refuse_stored)
    torch.manual_seed(0)
    model = Attention().to(torch.float64)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    compiled = nnc.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = compiled(x)
        seed = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
        (out * seed).sum().backward()
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    fallbacks = [name for plan in plans(compiled) for name, _ in plan.fallbacks]
    assert len(fallbacks) == 4, fallbacks  # the forward's store, the backward's three
    model.zero_grad()
    want = model(x)
    (want * seed).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    for got, p in zip(grads, model.parameters()):
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_memory_plan_keeps_a_written_buffer_to_its_value():
    """No value shares a buffer with the cat while any of its producers may still write it, nor with any value
    live at the same time (lifetimes computed here from the kernels: definition, reads, writes into)."""
    torch.manual_seed(0)
    compiled = compiled_matches_eager(Attention(), torch.randn(2, 8, 16), tol=TOL[torch.float32])
    checked = 0
    for plan in plans(compiled):
        kernels, memory = plan.kernels, plan.memory
        span = {}
        for i, k in enumerate(kernels):
            for node in k.outputs:
                span[node] = [i, i]
        for i, k in enumerate(kernels):
            for node in (*k.inputs, *k.meta.get("writes_into", ())):
                node = memory.aliases.get(node, node)
                if node in span:
                    span[node][1] = max(span[node][1], i)
        by_buffer = {}
        for node, slot in memory.slots.items():
            by_buffer.setdefault(slot.buffer, []).append(span[node])
        for spans in by_buffer.values():
            spans.sort()
            for (_, end), (start, _) in zip(spans, spans[1:]):
                assert end < start, spans
        checked += any(k.meta.get("writes_into") for k in kernels)
    assert checked == 1


def test_whole_graph_inference_stores_the_head_merge():
    torch.manual_seed(0)
    model = Attention().eval()
    compiled = nnc.compile(model)
    x = torch.randn(1, 8, 16)
    with torch.no_grad():
        got, want = compiled(x), model(x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-5, atol=2e-5)
    [plan] = plans(compiled)
    assert plan.whole_graph and len(stored_kernels(compiled)) == 1


def test_stored_kernels_from_threads():
    """Threads running one plan each write their own buffers: the stored head merge is no exception."""
    torch.manual_seed(0)
    model = Attention(64, 2)
    compiled = nnc.compile(model, whole_graph=False)
    inputs = [torch.randn(8, 64, 64) for _ in range(4)]
    with torch.no_grad():
        expected = [model(x).numpy().copy() for x in inputs]
        compiled(inputs[0])
    assert stored_kernels(compiled)
    wrong = []

    def work(k):
        for _ in range(20):
            x = k % len(inputs)
            with torch.no_grad():
                got = compiled(inputs[x]).numpy()
            if not np.allclose(got, expected[x], rtol=1e-4, atol=1e-4):
                wrong.append(x)

    run_in_threads(work, 4)
    assert not wrong, wrong


class NotOnlyCopied(nn.Module):
    """Products that must keep their own layout: one also read elsewhere, a cat of a product and a non-product,
    a cat reading one product twice."""

    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.randn(2, 3, 6, 5, dtype=torch.float64))

    def forward(self, a):
        b = self.b
        p = a @ b                              # [2, 3, 4, 5]
        q = p.transpose(1, 2).contiguous()     # a copy of p ...
        r = p.exp()                            # ... which is read here too
        s = torch.cat([(a @ b).transpose(1, 2), a[..., :5].transpose(1, 2)], dim=-1)
        t = a @ b
        u = torch.cat([t, t], dim=1)
        return q.sum() + r.sum() + (s * s).sum() + (u * 2).sum()


def test_copies_of_values_read_elsewhere_stay_copies():
    torch.manual_seed(0)
    a = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    compiled = compiled_matches_eager(NotOnlyCopied(), a, tol=1e-12)
    forward = plans(compiled)[0]
    assert not [k for k in forward.kernels if k.meta.get("stores")], [k.meta["ops"] for k in forward.kernels]
    assert [k.kind for k in forward.kernels].count("cat") == 2, [k.meta["ops"] for k in forward.kernels]


def test_store_view_places_elements():
    """Store.view: element (i, j) of the value at target.flat[offset + i * s0 + j * s1]."""
    target = np.zeros((3, 4))
    store = Store(None, None, 1, (2, 3), (4, 1), ())
    store.view(target)[...] = np.arange(6).reshape(2, 3) + 1
    assert target.reshape(-1)[[1, 2, 3, 5, 6, 7]].tolist() == [1, 2, 3, 4, 5, 6]
    assert target.reshape(-1)[[0, 4, 8, 9, 10, 11]].tolist() == [0] * 6
    with pytest.raises(ValueError, match="C-contiguous"):
        store.view(np.zeros((4, 3)).T)


class CatOfProducts(nn.Module):
    """A cat of three batched products along `dim`, one of them transposed, beside a contiguous copy of an
    expanded product (an expand is undone by no view: that product is never stored)."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.w = nn.Parameter(torch.randn(2, 3, 5, 5, dtype=torch.float64))

    def forward(self, a):
        w = self.w
        pieces = [a @ w, (a * 2) @ w.exp(), (w.sin() @ a.transpose(-1, -2)).transpose(-1, -2)]
        spread = (a.sin() @ w).unsqueeze(1).expand(2, 2, 3, 4, 5).contiguous()
        return torch.cat(pieces, dim=self.dim).tanh().sum() + (spread * 1.5).sum()


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cat_of_products_along_any_dim(dim):
    torch.manual_seed(0)
    compiled = compiled_matches_eager(CatOfProducts(dim), torch.randn(2, 3, 4, 5, dtype=torch.float64), tol=1e-12)
    forward = plans(compiled)[0]
    assert not [k for k in forward.kernels if k.kind == "cat"], [k.meta["ops"] for k in forward.kernels]
    targets = [s.target.target.op.name for k in forward.kernels for s in k.meta.get("stores", {}).values()]
    assert targets == ["cat"] * 3, targets
    verify(forward.kernels, forward.gm.graph)


def test_whole_graph_writes_a_cat_from_its_producers():
    torch.manual_seed(0)
    model = CatOfProducts(1)
    compiled = nnc.compile(model)
    a = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    with torch.no_grad():
        got, want = compiled(a), model(a)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
    [plan] = plans(compiled)
    assert plan.whole_graph and sum(bool(k.meta.get("writes_into")) for k in plan.kernels) == 2


def test_verify_refuses_a_cat_read_before_its_last_writer():
    from nnc.passes.fusion import FusionError

    torch.manual_seed(0)
    compiled = compiled_matches_eager(CatOfProducts(0), torch.randn(2, 3, 4, 5, dtype=torch.float64), tol=1e-12)
    kernels = list(plans(compiled)[0].kernels)
    graph = plans(compiled)[0].gm.graph
    verify(kernels, graph)
    writer = [k for k in kernels if k.meta.get("writes_into")][-1]
    kernels.remove(writer)
    kernels.append(writer)  # now after the kernels reading the cat
    with pytest.raises(FusionError, match="before a kernel produces them"):
        verify(kernels, graph)


def test_batched_loop_reads_views_with_unit_stride_rows_in_place():
    """q and v (views of the packed projection, rows along unit strides) are read where they lie; k^T (its rows
    down a column) is still copied for the loop."""
    torch.manual_seed(0)
    compiled = compiled_matches_eager(Attention().to(torch.float64), torch.randn(2, 8, 16, dtype=torch.float64),
                                      tol=1e-12)
    forward = plans(compiled)[0]
    products = [k for k in forward.kernels if k.kind == "matmul" and k.meta["ops"][0] == "matmul"]
    copies = [k.meta["source"].split("def launch")[1].count("ascontiguousarray(np.lib") for k in products]
    assert copies == [1, 0], copies  # q @ k^T copies k^T only; att @ v reads v in place
