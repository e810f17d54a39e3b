"""nnc.passes.autodiff: what the backward graph saves and what it recomputes (the save-or-recompute rule in the
module docstring), and that compiled gradients still match eager autograd."""
from __future__ import annotations

import numpy as np
import pytest

import helpers
import nnc
import runtime as torch
import runtime.nn.functional as F
from nnc.passes.autodiff import build_backward
from nnc.passes.decompose import decompose
from nnc.pipeline import FORWARD_CLEANUPS, run_passes
from runtime import nn


class Chain(nn.Module):
    """gelu_tanh(x * w + b) * sigmoid(x) + 0.5 * x: elementwise ops over an input and two parameters."""

    def __init__(self, cols):
        super().__init__()
        self.w = nn.Parameter(torch.randn(cols))
        self.b = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return F.gelu(x * self.w + self.b, approximate="tanh") * torch.sigmoid(x) + 0.5 * x


class TwoLayers(nn.Module):
    """l2(act(l1(x))), or act applied to two matmuls combined by `act` (see forward)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.l1, self.l2, self.l3 = nn.Linear(8, 16), nn.Linear(16, 4), nn.Linear(8, 16)

    def forward(self, x):
        if self.kind == "relu":
            return self.l2(torch.relu(self.l1(x)))
        if self.kind == "gelu":
            return self.l2(F.gelu(self.l1(x), approximate="tanh"))
        if self.kind == "tanh_of_sum":
            return torch.tanh(self.l1(x) + self.l3(x))
        return torch.tanh(self.l1(x) * self.l3(x))  # tanh_of_product


def backward_of(model, *examples):
    """(forward GraphModule, BackwardGraph) for the gradients of every tensor input and parameter."""
    forward = run_passes(decompose(nnc.trace(model), *examples), FORWARD_CLEANUPS, "forward")
    params = {name for name, _ in model.named_parameters()}
    graph = forward.graph
    wrt = [n for n in graph.placeholders if "shape" in n.meta]
    wrt += [n for n in graph.nodes if n.op == "get_attr" and n.target in params]
    return forward, build_backward(forward, wrt)


def ops_of(nodes):
    return [n.target.op.name if hasattr(n.target, "op") else n.op for n in nodes]


def assert_bookkeeping(backward):
    """`saved` lists exactly the saved_* placeholders the backward reads, in order; `recomputed` names forward
    nodes whose recomputation is still in the backward graph."""
    placeholders = [n for n in backward.gm.graph.placeholders if n.name.startswith("saved_")]
    assert [p.name for p in placeholders] == [f"saved_{n.name}" for n in backward.saved]
    assert all(p.users for p in placeholders)
    origins = {n.meta.get("from_node") for n in backward.gm.graph.nodes}
    assert set(backward.recomputed) <= origins


def test_elementwise_chain_saves_only_its_input_and_parameters():
    _, backward = backward_of(Chain(16), torch.randn(8, 16))
    assert sorted(n.name for n in backward.saved) == ["b", "w", "x"]
    assert {"tanh", "sigmoid"} <= set(backward.recomputed)
    assert_bookkeeping(backward)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_recomputed_chain_gradients_match_eager(dtype):
    torch.manual_seed(0)
    model = Chain(24).to(dtype)
    x = (torch.randn(32, 24) * 3).to(dtype)
    seed = torch.randn(32, 24).to(dtype)
    compiled = nnc.compile(Chain(24).to(dtype))
    compiled.load_state_dict(model.state_dict())
    results = []
    for m in (model, compiled):
        xi = x.clone().requires_grad_()
        out = m(xi)
        out.backward(seed)
        results.append([out.detach().numpy(), xi.grad.numpy()] + [p.grad.numpy() for p in m.parameters()])
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    for want, got in zip(*results):
        np.testing.assert_allclose(got, want, **tol)


def test_relu_feeding_a_matmul_saves_its_output_not_the_matmul():
    """Recomputing relu(mm + b) needs mm, as many bytes as the relu output, but the forward writes the relu output
    anyway (the next matmul reads it) and would have to write mm just for the backward."""
    _, backward = backward_of(TwoLayers("relu"), torch.randn(5, 8))
    assert "relu" in ops_of(backward.saved) and "linear" not in ops_of(backward.saved)
    assert_bookkeeping(backward)


def test_gelu_between_matmuls_saves_only_the_first_matmul():
    _, backward = backward_of(TwoLayers("gelu"), torch.randn(5, 8))
    assert [n for n in ops_of(backward.saved) if n not in ("placeholder", "get_attr")] == ["linear"]
    assert {"tanh", "mul_5"} <= set(backward.recomputed)  # mul_5 is the gelu output the second matmul reads
    assert_bookkeeping(backward)


def test_a_value_whose_recomputation_needs_two_unsaved_matmuls_is_saved():
    """tanh(mm1 + mm2): tanh's rule reads its output; recomputing it would save two matmul results that no rule
    reads (add's rule reads nothing), twice the bytes: the tanh output is saved instead."""
    _, backward = backward_of(TwoLayers("tanh_of_sum"), torch.randn(5, 8))
    computed = [n for n in ops_of(backward.saved) if n not in ("placeholder", "get_attr")]
    assert computed == ["tanh"] and backward.recomputed == []
    assert_bookkeeping(backward)


def test_leaves_saved_anyway_make_recomputation_free():
    """tanh(mm1 * mm2): mul's rule reads both matmul results (plus bias), so they are saved whatever happens; the
    second run sees that and recomputes the tanh from them instead of saving it too."""
    _, backward = backward_of(TwoLayers("tanh_of_product"), torch.randn(5, 8))
    computed = [n for n in ops_of(backward.saved) if n not in ("placeholder", "get_attr")]
    assert computed == ["linear", "linear"]
    assert "tanh" in backward.recomputed
    assert_bookkeeping(backward)


@pytest.mark.parametrize("kind", ["relu", "gelu", "tanh_of_sum", "tanh_of_product"])
def test_two_layer_gradients_match_eager(kind):
    torch.manual_seed(1)
    model = TwoLayers(kind)
    compiled = nnc.compile(model)
    x = torch.randn(5, 8)
    grads = []
    for m in (model, compiled):
        m.zero_grad()
        xi = x.clone().requires_grad_()
        m(xi).sum().backward()
        params = [p.grad.numpy().copy() for p in model.parameters() if p.grad is not None]
        grads.append([xi.grad.numpy().copy()] + params)
    for want, got in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class Slices(nn.Module):
    """Reads slices or int indices of a parameter `w` (shape `shape`), each through its own product with x."""

    def __init__(self, shape, keys):
        super().__init__()
        self.w = nn.Parameter(torch.randn(*shape, dtype=torch.float64))
        self.keys = keys

    def forward(self, x):
        return read_pieces(self.w, x, self.keys)


def read_pieces(w, x, keys):
    """The Slices model's sum, written with tensor methods only so that it runs on torch's tensors too."""
    out = x.sum()
    for k, key in enumerate(keys):
        out = out + ((k + 1) * w[key].tanh()).sum() * x.mean()
    return out


SLICE_CASES = {
    "chunks_cover": ((6, 3), [slice(0, 2), slice(2, 4), slice(4, 6)]),
    "chunks_out_of_order": ((6, 3), [slice(4, 6), slice(0, 2), slice(2, 4)]),
    "gaps": ((7, 3), [slice(1, 2), slice(4, 6)]),
    "last_dim": ((2, 9), [(slice(None), slice(0, 3)), (slice(None), slice(6, 9)), (slice(None), slice(3, 6))]),
    "overlapping": ((6, 2), [slice(0, 4), slice(2, 6), slice(1, 3)]),
    "one_piece": ((5, 2), [slice(1, 3)]),
    "negative_bounds": ((6, 2), [slice(-2, None), slice(0, -2)]),
    "empty_piece": ((4, 2), [slice(2, 2), slice(0, 4)]),
    "empty_dim": ((0, 3), [slice(0, 0), slice(0, None)]),
    "mixed_dims": ((4, 6), [slice(0, 2), (slice(None), slice(3, 6)), slice(2, 4)]),
    "repeated_slices": ((5, 2), [slice(1, 3), slice(0, 1), slice(1, 3)]),
    # int indices read x[t] as x[t:t+1] with that dim dropped
    "ints_every_step": ((5, 3), [0, 1, 2, 3, 4]),
    "ints_any_order": ((5, 3), [3, 0, 4, 1, 2]),
    "ints_subset": ((7, 3), [5, 1]),
    "ints_negative": ((6, 2), [-1, 3, -6, 1]),
    "ints_repeated": ((5, 3), [2, 4, 2, -3, 4]),
    "ints_middle_dim": ((3, 4, 2), [(slice(None), 1), (slice(None), -1), (slice(None), 1), (slice(None), 0)]),
    "ints_last_dim": ((2, 5), [(slice(None), 4), (slice(None), 0), (slice(None), -2)]),
    "ints_of_a_vector": ((4,), [0, 3, -1, 3]),
    "ints_and_slices": ((6, 3), [slice(0, 2), 3, slice(4, 6), 2]),
    "ints_inside_slices": ((6, 2), [slice(1, 4), 2, -1, slice(4, 6), 2]),
    "ints_mixed_dims": ((4, 5), [1, (slice(None), 3), slice(2, 4), (slice(None), -5), 1]),
}


@pytest.mark.parametrize("case", sorted(SLICE_CASES))
def test_slice_gradients_match_eager(case):
    """The gradient of several slices or int indices of one tensor is laid out by `cat` (zero gaps, repeats and
    overlaps added), and equals eager autograd's sum of zero-filled slices; so does the forward."""
    shape, keys = SLICE_CASES[case]
    torch.manual_seed(2)
    model = Slices(shape, keys)
    compiled = nnc.compile(Slices(shape, keys))
    compiled.load_state_dict(model.state_dict())
    x = torch.randn(3, dtype=torch.float64)
    outs, grads = [], []
    for m in (model, compiled):
        out = m(x)
        out.backward()
        outs.append(out.item())
        grads.append(m.w.grad.numpy().copy())
    assert outs[1] == pytest.approx(outs[0], rel=1e-12)
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", sorted(k for k in SLICE_CASES if k.startswith("ints")))
def test_int_index_gradients_match_torch(case):
    """The compiled gradient of int-index reads against torch's (the oracle) on the same parameter."""
    real = helpers.require_torch()
    shape, keys = SLICE_CASES[case]
    torch.manual_seed(3)
    compiled = nnc.compile(Slices(shape, keys))
    x = torch.randn(3, dtype=torch.float64)
    compiled(x).backward()
    w = real.tensor(compiled.w.detach().numpy().copy(), requires_grad=True)
    read_pieces(w, real.tensor(x.numpy().copy()), keys).backward()
    np.testing.assert_allclose(compiled.w.grad.numpy(), w.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_chunked_parameter_gradient_is_one_cat():
    """chunk(3) of a packed projection weight: the backward concatenates the three gradients, with no zero tensor
    and slice write per chunk."""
    model = Slices((6, 3), [slice(0, 2), slice(2, 4), slice(4, 6)])
    _, backward = backward_of(model, torch.randn(3, dtype=torch.float64))
    ops = ops_of(backward.gm.graph.nodes)
    assert ops.count("cat") == 1 and "index_put" not in ops and "full" not in ops


class PerStep(nn.Module):
    """An RNN's input projection read a step at a time, proj[t] for t in `steps` (runtime's RNNBase._run reads
    x_proj[t] so)."""

    def __init__(self, size, steps):
        super().__init__()
        self.linear, self.steps = nn.Linear(size, size, dtype=torch.float64), steps

    def forward(self, x):
        proj = self.linear(x)
        out = proj[self.steps[0]].tanh()
        for k, t in enumerate(self.steps[1:]):
            out = (k + 2) * proj[t].tanh() + out * 0.5
        return out


@pytest.mark.parametrize("steps", [range(8), [3, 0, -1, 3, 7, 5]], ids=["every_step", "some_steps_repeated"])
def test_per_step_reads_match_eager(steps):
    torch.manual_seed(4)
    helpers.compiled_matches_eager(PerStep(4, list(steps)), torch.randn(8, 2, 4, dtype=torch.float64))


def test_per_step_reads_gradient_is_one_cat():
    """proj[t] for each of T steps: the backward stacks the T step gradients with one cat, instead of writing each
    into a zero tensor of proj's whole (T, B, H) shape and summing T of them. A step read by two keys (-1 and 7:
    two nodes, where one key read twice is one node) has its gradients added before the cat."""
    x = torch.randn(8, 2, 4, dtype=torch.float64)
    _, backward = backward_of(PerStep(4, list(range(8))), x)
    ops = ops_of(backward.gm.graph.nodes)
    assert ops.count("cat") == 1 and "index_put" not in ops and "full" not in ops
    _, backward = backward_of(PerStep(4, [3, 0, -1, 3, 7, 5]), x)  # -1 is 7
    ops = ops_of(backward.gm.graph.nodes)
    assert ops.count("cat") == 1 and "index_put" not in ops  # zeros only for the gaps


class Recurrent(nn.Module):
    """h = tanh(x[t] + h @ W^T) over T steps: the recurrent weight's gradient is a sum of T thin products."""

    def __init__(self, size, batch, steps):
        super().__init__()
        self.cell, self.batch, self.steps = nn.Linear(size, size, bias=False, dtype=torch.float64), batch, steps

    def forward(self, x):
        h = torch.zeros(self.batch, x.shape[-1], dtype=torch.float64)
        for t in range(self.steps):
            h = (x[t] + self.cell(h)).tanh()
        return h


def test_recurrent_weight_gradient_matches_eager():
    torch.manual_seed(5)
    helpers.compiled_matches_eager(Recurrent(6, 2, 5), torch.randn(5, 2, 6, dtype=torch.float64))


def test_recurrent_weight_gradient_is_one_product():
    """The T products h_t^T @ dh_t of a recurrent weight's gradient (batch 2, so each reads fewer elements than it
    writes) are one product of concatenated operands; products as large as their operands stay apart."""
    _, backward = backward_of(Recurrent(6, 2, 5), torch.randn(5, 2, 6, dtype=torch.float64))
    weight_grads = [n for n in backward.gm.graph.nodes if ops_of([n]) == ["matmul"] and n.meta["shape"] == (6, 6)]
    assert len(weight_grads) == 1 and tuple(weight_grads[0].args[0].meta["shape"]) == (6, 10)
    _, backward = backward_of(Recurrent(6, 8, 5), torch.randn(5, 8, 6, dtype=torch.float64))
    weight_grads = [n for n in backward.gm.graph.nodes if ops_of([n]) == ["matmul"] and n.meta["shape"] == (6, 6)]
    assert len(weight_grads) == 5


class NormThenLinear(nn.Module):
    """LayerNorm then a linear over a transposed copy: a per-row rstd and a copy the forward writes anyway."""

    def __init__(self):
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(self.norm(x).transpose(0, 1).contiguous().reshape(-1, 8))


def test_per_row_values_and_written_copies_are_saved_not_recomputed():
    """LayerNorm's rstd (read with broadcasting) and the contiguous copy a matmul reads are saved: recomputed in the
    backward, each would be a kernel of its own there."""
    _, backward = backward_of(NormThenLinear(), torch.randn(4, 3, 8))
    saved = ops_of(backward.saved)
    assert "rsqrt" in saved and "clone" in saved, saved
    assert not {"rsqrt", "clone"} & set(ops_of(n for n in backward.gm.graph.nodes if n.op == "call_function"))
    assert_bookkeeping(backward)


def test_a_view_counts_its_base_bytes():
    """A third of a packed projection's output, transposed: saving the view would keep the whole output alive, so
    the backward saves the output (as many bytes) and recomputes the view, which folds into its readers."""
    model = nn.MultiheadAttention(12, 2)
    x = torch.randn(5, 2, 12)
    forward = run_passes(decompose(nnc.trace(_SelfAttention(model)), x), FORWARD_CLEANUPS, "forward")
    wrt = [n for n in forward.graph.nodes if n.op == "get_attr"]
    backward = build_backward(forward, wrt)
    assert not any(n.op == "call_function" and n.target.op.name in ("permute", "getitem", "reshape")
                   for n in backward.saved), ops_of(backward.saved)


class _SelfAttention(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention = attention

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


def test_self_attention_gradients_match_eager():
    torch.manual_seed(3)
    model = _SelfAttention(nn.MultiheadAttention(12, 3, dtype=torch.float64))
    compiled = nnc.compile(model)
    x = torch.randn(5, 2, 12, dtype=torch.float64)
    grads = []
    for m in (model, compiled):
        model.zero_grad()
        xi = x.clone().requires_grad_()
        (m(xi) * torch.linspace(-1, 1, 120, dtype=torch.float64).reshape(5, 2, 12)).sum().backward()
        grads.append([xi.grad.numpy().copy()] + [p.grad.numpy().copy() for p in model.parameters()])
    for want, got in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)
