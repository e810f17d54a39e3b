"""nnc.passes.fusion: kernels from hand-built decomposed graphs (elementwise chains, broadcasts, reduction
prologues/epilogues, matmul epilogues, opaque views), their invariants (every node once, valid order, acyclic
kernel DAG, no duplicated work), their recorded reasons, and a run of the kernels against the interpreter."""
from __future__ import annotations

import dataclasses
import random

import networkx as nx
import numpy as np
import pytest

import nnc
import runtime as torch
from nnc.graph import Graph, map_arg
from nnc.kernel import BROADCAST, ELEMENTWISE, INJECTIVE, OPAQUE, REDUCTION
from nnc.passes import propagate_shapes
from nnc.passes.fusion import FusionError, fuse, kernel_dag, rank, verify
from nnc.prims import Prim, prims
from runtime import nn
from runtime.ops import OPS

from helpers import call

SUM1 = dict(dims=(1,), keepdim=True)


class Root(nn.Module):
    """Parameters for get_attr nodes: w (linear weight, 16x8), b (bias, 16), v (row vector, 8), m (8x8)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8))
        self.b = nn.Parameter(torch.randn(16))
        self.v = nn.Parameter(torch.randn(8))
        self.m = nn.Parameter(torch.randn(8, 8))


def build(body, *examples, root=None):
    """A decomposed graph: placeholders x0, x1, ... for the examples, then body(graph, *placeholders) -> outputs;
    shapes propagated. Returns (graph module, example inputs)."""
    g = Graph()
    inputs = [g.placeholder(f"x{i}") for i in range(len(examples))]
    result = body(g, *inputs)
    g.output(result)
    gm = nnc.GraphModule(root if root is not None else Root(), g)
    propagate_shapes(gm, *examples)
    g.lint(gm)
    return gm, examples


def ops(kernel):
    return kernel.meta["ops"]


def array(value):
    return value.detach().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def run_kernels(gm, kernels, examples):
    """Execute the kernels one by one, each seeing only its declared inputs; compare every kernel output with the
    interpreter's value and return the graph's result."""
    interp = nnc.Interpreter(gm)
    expected = interp.run(*examples)
    env = {n: interp.env[n] for n in gm.graph.nodes if n.op in ("placeholder", "get_attr")}
    for k in kernels:
        local = {n: env[n] for n in k.inputs}  # KeyError: an input is not available yet
        for view, m in k.meta.get("views", {}).items():  # folded views: read from their bases
            local[view] = torch.tensor(m.apply(array(local[m.base])))
        for node in k.nodes:
            args = map_arg(node.args, local.__getitem__)
            kwargs = map_arg(node.kwargs, local.__getitem__)
            local[node] = node.target(*args, **kwargs)
        for out in k.outputs:
            env[out] = local[out]
            np.testing.assert_allclose(array(local[out]), array(interp.env[out]), rtol=1e-6, atol=1e-6,
                                       equal_nan=True)
    result = map_arg(gm.graph.output_node.args[0], env.__getitem__)
    return result, expected


def fused(body, *examples, root=None):
    gm, examples = build(body, *examples, root=root)
    kernels = fuse(gm.graph)
    verify(kernels, gm.graph)
    run_kernels(gm, kernels, examples)
    return gm, kernels


X48 = lambda: torch.randn(4, 8)  # noqa: E731


# ---------------------------------------------------------------------------------------------------------------
# The lattice
# ---------------------------------------------------------------------------------------------------------------


def test_ranks_come_from_op_kinds_and_shapes():
    def body(g, x, idx):
        v = g.get_attr("v")
        same = call(g, "exp", x)
        bcast = call(g, "add", x, v)
        view = call(g, "reshape", x, shape=(8, 4))
        red = call(g, "sum", x, **SUM1)
        arg = call(g, "argmax", x, dim=1, keepdim=False)
        lin = call(g, "linear", x, g.get_attr("w"))
        gat = call(g, "gather", x, idx, dim=1)
        cat = call(g, "cat", x, x, dim=0)
        return same, bcast, view, red, arg, lin, gat, cat

    gm, _ = build(body, X48(), torch.zeros(4, 8, dtype=torch.int64))
    by_op = {n.name: rank(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert by_op == {"exp": ELEMENTWISE, "add": BROADCAST, "reshape": INJECTIVE, "sum_1": REDUCTION,
                     "argmax": OPAQUE, "linear": OPAQUE, "gather": OPAQUE, "cat": OPAQUE}


def test_decisions_read_kinds_not_names():
    """An elementwise op under a name fusion has never heard of fuses like any other elementwise op."""
    mystery = Prim(dataclasses.replace(OPS["exp"], name="mystery"))
    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(mystery, (x,))
    b = g.call_function(prims.neg, (a,))
    g.output(b)
    for node in (x, a, b):
        node.meta.update(shape=(4, 8), dtype=torch.float32)
    kernels = fuse(g)
    verify(kernels, g)
    assert [(k.kind, ops(k)) for k in kernels] == [("elementwise", ["mystery", "neg"])]


# ---------------------------------------------------------------------------------------------------------------
# Elementwise chains and broadcasting
# ---------------------------------------------------------------------------------------------------------------


def test_elementwise_chain_is_one_kernel():
    def body(g, x):
        a = call(g, "exp", x)
        b = call(g, "mul", a, 2.0)
        c = call(g, "tanh", b)
        return call(g, "add", c, x)

    gm, kernels = fused(body, X48())
    [k] = kernels
    assert k.kind == "elementwise" and ops(k) == ["exp", "mul", "tanh", "add"]
    assert k.shape == (4, 8)
    assert [n.name for n in k.inputs] == ["x0"] and [n.name for n in k.outputs] == ["add"]
    assert k.reason == "add is a graph output"
    assert k.meta["bytes_moved"] == 2 * 4 * 8 * 4  # x in, add out, float32
    assert k.meta["broadcast_inputs"] == []


def test_broadcast_bias_stays_an_input():
    def body(g, x):
        biased = call(g, "add", x, g.get_attr("v"))
        return call(g, "relu", biased)

    gm, kernels = fused(body, X48())
    [k] = kernels
    assert ops(k) == ["add", "relu"] and k.meta["ranks"] == ["broadcast", "elementwise"]
    assert [n.name for n in k.inputs] == ["x0", "v"]
    assert [n.name for n in k.meta["broadcast_inputs"]] == ["v"]
    assert k.meta["bytes_moved"] == 4 * 8 * 4 + 8 * 4 + 4 * 8 * 4


def test_relu_of_affine_plus_scaled_input_is_one_kernel():
    """relu(x * w + b) + 0.5 * x: broadcast inputs w and b, x read twice, one kernel."""
    def body(g, x, w, b):
        y = call(g, "relu", call(g, "add", call(g, "mul", x, w), b))
        return call(g, "add", y, call(g, "mul", 0.5, x))

    gm, kernels = fused(body, X48(), torch.randn(8), torch.randn(4, 1))
    [k] = kernels
    assert k.kind == "elementwise" and ops(k) == ["mul", "add", "relu", "mul", "add"]
    assert [n.name for n in k.inputs] == ["x0", "x1", "x2"]
    assert {n.name for n in k.meta["broadcast_inputs"]} == {"x1", "x2"}


def test_smaller_shaped_producer_is_not_recomputed_per_element():
    """exp of the bias has another shape: it is its own kernel, read with broadcasting (never duplicated)."""
    def body(g, x):
        t = call(g, "exp", g.get_attr("v"))
        return call(g, "sigmoid", call(g, "add", x, t))

    gm, kernels = fused(body, X48())
    assert [ops(k) for k in kernels] == [["exp"], ["add", "sigmoid"]]
    assert "read with broadcasting by add" in kernels[0].reason
    assert kernels[1].inputs[1] is kernels[0].outputs[0]


def test_multi_consumer_node_inside_a_group_and_read_outside_becomes_output():
    def body(g, x):
        a = call(g, "exp", x)
        b = call(g, "mul", a, 3.0)
        c = call(g, "sin", a)
        d = call(g, "add", b, c)
        return d, a  # a is also a graph output

    gm, kernels = fused(body, X48())
    [k] = kernels
    assert ops(k) == ["exp", "mul", "sin", "add"]
    assert [n.name for n in k.outputs] == ["exp", "add"]


def test_two_consumers_of_different_chains_share_one_kernel():
    def body(g, x):
        a = call(g, "exp", x)
        return call(g, "mul", a, 2.0), call(g, "neg", a)

    gm, kernels = fused(body, X48())
    [k] = kernels
    assert [n.name for n in k.outputs] == ["mul", "neg"]


# ---------------------------------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------------------------------


def softmax_body(g, x):
    m = call(g, "amax", x, **SUM1)
    md = call(g, "detach", m)
    e = call(g, "exp", call(g, "sub", x, md))
    s = call(g, "sum", e, **SUM1)
    return call(g, "div", e, s)


def test_softmax_kernels_and_reasons():
    """max, then the sum of exp(x - max), then exp / sum: one row kernel walks each row three times."""
    gm, kernels = fused(softmax_body, X48())
    [k] = kernels
    assert (k.kind, ops(k)) == ("row", ["amax", "detach", "sub", "exp", "sum", "div"])
    assert [(r["op"], r["dims"], r["out_shape"]) for r in k.meta["reductions"]] == [("amax", (1,), (4, 1)),
                                                                                   ("sum", (1,), (4, 1))]
    assert k.shape == (4, 8) and [n.name for n in k.outputs] == ["div"]  # exp and the sums stay inside
    assert k.reason == "div is a graph output"


def test_logsumexp_is_one_row_kernel():
    """log(sum(exp(x - m))) + m: the max, then the sum of exp and the log per row, in one row kernel."""
    def body(g, x):
        m = call(g, "amax", x, **SUM1)
        e = call(g, "exp", call(g, "sub", x, m))
        s = call(g, "sum", e, **SUM1)
        return call(g, "add", call(g, "log", s), m)

    gm, kernels = fused(body, X48())
    [k] = kernels
    assert (k.kind, ops(k)) == ("row", ["amax", "sub", "exp", "sum", "log", "add"])
    assert k.shape == (4, 8) and [n.name for n in k.inputs] == ["x0"] and [n.name for n in k.outputs] == ["add"]


def test_a_reduction_over_other_rows_stays_out_of_a_row_kernel():
    """The sum over dim 0 of exp(x - mean over dim 1) has another signature than the mean: x - mean becomes its
    prologue (post-dominated by it), and the two reductions keep kernels of their own."""
    def body(g, x):
        centered = call(g, "sub", x, call(g, "div", call(g, "sum", x, **SUM1), 8.0))
        return call(g, "sum", call(g, "exp", centered), dims=(0,), keepdim=True)

    gm, kernels = fused(body, X48())
    assert [(k.kind, ops(k)) for k in kernels] == [("reduction", ["sum", "div"]),
                                                   ("reduction", ["sub", "exp", "sum"])]


def test_multi_consumer_producer_joins_the_reduction_that_post_dominates_it():
    def body(g, x):
        a = call(g, "exp", x)
        d = call(g, "add", call(g, "sin", a), call(g, "cos", a))
        return call(g, "sum", d, dims=(0, 1), keepdim=False)

    gm, kernels = fused(body, X48())
    [k] = kernels
    assert k.kind == "reduction" and ops(k) == ["exp", "sin", "cos", "add", "sum"]
    assert [n.name for n in k.meta["prologue"]] == ["exp", "sin", "cos", "add"]
    assert k.meta["reduction"]["out_shape"] == ()


def test_node_read_by_two_sibling_reductions_is_computed_once_in_their_shared_pass():
    def body(g, x):
        a = call(g, "exp", call(g, "mul", x, 2.0))
        return call(g, "sum", a, **SUM1), call(g, "amax", a, **SUM1)

    gm, kernels = fused(body, X48())
    [k] = kernels
    assert (k.kind, ops(k)) == ("reduction", ["mul", "exp", "sum", "amax"])
    assert [(r["op"], r["dims"], r["out_shape"]) for r in k.meta["reductions"]] == [("sum", (1,), (4, 1)),
                                                                                   ("amax", (1,), (4, 1))]
    assert k.meta["reduction"] == k.meta["reductions"][0] and k.meta["anchor"].name == "sum_1"
    assert [n.name for n in k.meta["prologue"]] == ["mul", "exp"] and k.meta["epilogue"] == []
    assert [n.name for n in k.outputs] == ["sum_1", "amax"]  # exp stays inside: it is never written


def test_chain_backward_is_one_kernel_with_two_column_sums():
    """The shape of an elementwise layer's backward: gx (elementwise, a graph output), gw = sum(g * x) and
    gb = sum(g) over the batch, each reshaped. One pass over [4, 8] writes gx and accumulates both sums."""
    def body(g, x, gy):
        w = g.get_attr("v")
        u = call(g, "add", call(g, "mul", x, w), 1.0)
        gu = call(g, "mul", gy, call(g, "tanh", u))  # the shared prologue
        gx = call(g, "add", call(g, "mul", gu, w), gy)
        gb = call(g, "sum", gu, dims=(0,), keepdim=True)
        gw = call(g, "sum", call(g, "mul", gu, x), dims=(0,), keepdim=True)
        return gx, call(g, "reshape", gw, shape=(8,)), call(g, "reshape", gb, shape=(8,))

    gm, kernels = fused(body, X48(), X48())
    assert [(k.kind, ops(k)) for k in kernels] == [
        ("reduction", ["mul", "add", "tanh", "mul", "mul", "add", "sum", "mul", "sum"]),
        ("opaque", ["reshape"]), ("opaque", ["reshape"])]
    k = kernels[0]
    assert [r["op"] for r in k.meta["reductions"]] == ["sum", "sum"] and k.shape == (4, 8)
    assert [n.name for n in k.outputs] == ["add_1", "sum_1", "sum_2"]
    assert "add_1 is a graph output" in k.reason and "feeds the injective op reshape" in k.reason


def test_reductions_over_other_dims_keep_their_own_kernels():
    def body(g, x):
        a = call(g, "exp", x)
        return call(g, "sum", a, dims=(0,), keepdim=True), call(g, "sum", a, **SUM1), call(g, "amax", a, **SUM1)

    gm, kernels = fused(body, X48())
    # the row sums (dim 1) take exp in first (row kernels grow before the shared passes); the sum over dim 0 reads it
    assert [(k.kind, ops(k)) for k in kernels] == [("reduction", ["exp", "sum", "amax"]), ("reduction", ["sum"])]
    assert [n.name for n in kernels[0].outputs] == ["exp", "sum_2", "amax"]
    assert "exp is also read outside the reduction (sum_2, amax), so it cannot be a prologue of sum_1" \
        in kernels[0].reason


def test_a_reduction_that_reads_a_sibling_result_gets_a_pass_of_its_own_in_the_row_kernel():
    """amax and the sum t have the same signature and both read x; the sum s reads amax's result, so it takes the
    second pass over each row of the same row kernel."""
    def body(g, x):
        m = call(g, "amax", x, **SUM1)
        s = call(g, "sum", call(g, "exp", call(g, "sub", x, m)), **SUM1)
        t = call(g, "sum", call(g, "mul", x, 2.0), **SUM1)  # a true sibling of amax
        return s, t

    gm, kernels = fused(body, X48())
    [k] = kernels
    assert (k.kind, ops(k)) == ("row", ["amax", "sub", "exp", "sum", "mul", "sum"])
    from nnc.codegen.cpu import schedule
    assert schedule(k).passes == 2


def test_an_epilogue_never_reads_a_value_of_the_shared_pass():
    """Summing over a size-1 dim keeps the shape. The siblings s1 and s2 share a pass and add (s1's epilogue)
    reads q, which s2's prologue reads too: q may not join the pass (the epilogue runs after it), so q keeps its
    own kernel and the reduction kernel reads it as an input."""
    def body(g, x):
        q = call(g, "tanh", x)
        s1 = call(g, "sum", call(g, "exp", x), dims=(1,), keepdim=True)
        s2 = call(g, "sum", call(g, "mul", q, x), dims=(1,), keepdim=True)
        return call(g, "add", s1, q), s2

    gm, kernels = fused(body, torch.randn(4, 1))
    assert [(k.kind, ops(k)) for k in kernels] == [("elementwise", ["tanh"]),
                                                   ("reduction", ["exp", "sum", "mul", "sum", "add"])]
    tanh, k = kernels
    assert [n.name for n in k.meta["epilogue"]] == ["add"] and [n.name for n in k.inputs] == ["x0", "tanh"]
    assert "the epilogue node add would read the prologue value tanh" in tanh.reason


def test_epilogue_never_reads_a_prologue_value():
    """sum over a size-1 dim keeps the shape, so add(sum, p) has sum's output shape; p is a prologue value the
    epilogue may not read, so add stays out of the reduction kernel."""
    def body(g, x):
        p = call(g, "exp", x)
        s = call(g, "sum", p, dims=(1,), keepdim=True)
        return call(g, "add", s, p)

    gm, kernels = fused(body, torch.randn(4, 1))
    for k in kernels:
        if k.kind == "reduction":
            for node in k.meta["epilogue"]:
                assert not set(node.all_input_nodes) & set(k.meta["prologue"])
    assert sum(len(k.nodes) for k in kernels) == 3


def test_reductions_without_an_accumulator_are_opaque():
    def body(g, x):
        a = call(g, "exp", x)
        return call(g, "argmax", a, dim=1, keepdim=False), call(g, "any", call(g, "gt", a, 1.0), **SUM1)

    gm, kernels = fused(body, X48())
    kinds = {tuple(ops(k)): k.kind for k in kernels}
    assert kinds[("argmax",)] == "opaque"  # no OpDef.reducer
    assert kinds[("exp", "gt", "any")] == "reduction"  # any has one: its pass also writes exp (argmax reads it)
    assert "no fusable accumulator" in next(k for k in kernels if ops(k) == ["argmax"]).reason


# ---------------------------------------------------------------------------------------------------------------
# Matmul epilogues
# ---------------------------------------------------------------------------------------------------------------


def test_linear_bias_relu_is_one_matmul_kernel():
    def body(g, x):
        h = call(g, "linear", x, g.get_attr("w"))
        return call(g, "relu", call(g, "add", h, g.get_attr("b")))

    gm, kernels = fused(body, X48())
    [k] = kernels
    assert k.kind == "matmul" and ops(k) == ["linear", "add", "relu"] and k.shape == (4, 16)
    assert [n.name for n in k.inputs] == ["x0", "w", "b"] and [n.name for n in k.outputs] == ["relu"]
    assert k.meta["anchor"].name == "linear" and [n.name for n in k.meta["epilogue"]] == ["add", "relu"]
    assert [n.name for n in k.meta["broadcast_inputs"]] == ["b"]


def test_matmul_epilogue_chain_read_by_a_reduction():
    def body(g, x, y):
        h = call(g, "matmul", x, y)
        a = call(g, "sigmoid", call(g, "mul", h, 2.0))
        return h, a, call(g, "sum", a, **SUM1)  # h and a are graph outputs too

    gm, kernels = fused(body, X48(), torch.randn(8, 8))
    assert [(k.kind, ops(k)) for k in kernels] == [("matmul", ["matmul", "mul", "sigmoid"]), ("reduction", ["sum"])]
    assert [n.name for n in kernels[0].outputs] == ["matmul", "sigmoid"]
    assert "sigmoid is also read outside the reduction (the graph output), so it cannot be a prologue of sum_1" \
        in kernels[0].reason
    assert "matmul is a graph output" in kernels[0].reason


def test_a_reduction_prologue_wins_over_a_matmul_epilogue():
    """mul and sigmoid could follow the matmul or precede the sum: as the sum's prologue they are never written."""
    def body(g, x, y):
        h = call(g, "matmul", x, y)
        return call(g, "sum", call(g, "sigmoid", call(g, "mul", h, 2.0)), **SUM1)

    gm, kernels = fused(body, X48(), torch.randn(8, 8))
    assert [(k.kind, ops(k)) for k in kernels] == [("matmul", ["matmul"]), ("reduction", ["mul", "sigmoid", "sum"])]
    assert "matmul result matmul feeds the reduction" not in kernels[0].reason
    assert "feeds the reduction sum_1 but is not one of its prologue nodes" not in kernels[0].reason


def test_a_mask_read_only_by_the_epilogue_joins_the_matmul_kernel():
    """The relu backward where(h > 0, g @ w, 0): the mask is computed in the epilogue pass, not written out."""
    def body(g, grad, h):
        return call(g, "where", call(g, "gt", h, 0.0), call(g, "matmul", grad, g.get_attr("m")), 0.0)

    gm, kernels = fused(body, X48(), X48())
    (k,) = kernels
    assert k.kind == "matmul" and ops(k) == ["gt", "matmul", "where"]
    assert k.meta["anchor"].name == "matmul" and {n.name for n in k.meta["epilogue"]} == {"gt", "where"}
    assert [n.name for n in k.inputs] == ["x1", "x0", "m"] and [n.name for n in k.outputs] == ["where"]


def test_a_mask_also_read_elsewhere_stays_its_own_kernel():
    def body(g, grad, h):
        mask = call(g, "gt", h, 0.0)
        return call(g, "where", mask, call(g, "matmul", grad, g.get_attr("m")), 0.0), mask

    gm, kernels = fused(body, X48(), X48())
    assert sorted(ops(k) for k in kernels) == [["gt"], ["matmul", "where"]]


def test_epilogue_that_would_close_a_cycle_is_refused():
    """sub(h, sum(h)) has h's shape, but it also reads sum(h), which is computed after the matmul kernel."""
    def body(g, x):
        h = call(g, "linear", x, g.get_attr("w"))
        s = call(g, "sum", h, **SUM1)
        return call(g, "sub", h, s)

    gm, kernels = fused(body, X48())
    assert [(k.kind, ops(k)) for k in kernels] == [("matmul", ["linear"]), ("row", ["sum", "sub"])]
    assert "cycle" in kernels[0].reason
    assert nx.is_directed_acyclic_graph(kernel_dag(kernels))


def test_matmul_does_not_take_prologues():
    def body(g, x):
        return call(g, "linear", call(g, "tanh", x), g.get_attr("w"))

    gm, kernels = fused(body, X48())
    assert [ops(k) for k in kernels] == [["tanh"], ["linear"]]
    assert "a matmul fuses epilogues, not prologues" in kernels[0].reason


# ---------------------------------------------------------------------------------------------------------------
# Opaque nodes
# ---------------------------------------------------------------------------------------------------------------


def test_views_fold_into_kernels_but_not_into_opaque_nodes():
    """The reshape read by neg folds into neg's kernel (it reads exp's output as its base); the permute read by
    cumsum (opaque) runs as a step of its own."""
    def body(g, x):
        a = call(g, "exp", x)
        r = call(g, "reshape", a, shape=(8, 4))
        n = call(g, "neg", r)
        p = call(g, "permute", n, dims=(1, 0))
        c = call(g, "cumsum", p, dim=1)
        return call(g, "add", c, 1.0)

    gm, kernels = fused(body, X48())
    assert [(k.kind, ops(k)) for k in kernels] == [("elementwise", ["exp"]), ("elementwise", ["neg"]),
                                                   ("opaque", ["permute"]), ("opaque", ["cumsum"]),
                                                   ("elementwise", ["add"])]
    assert [n.name for n in kernels[1].inputs] == ["exp"] and list(kernels[1].meta["views"]) == [r_node(gm)]
    assert kernels[2].reason.startswith("injective: view/shape op permute runs as a step of its own")
    assert "read by cumsum" in kernels[2].reason
    assert kernels[3].reason.startswith("opaque: other op cumsum")
    assert "read through the view reshape (reshape), folded into the indexing of neg" in kernels[0].reason


def r_node(gm):
    return next(n for n in gm.graph.nodes if n.name == "reshape")


def test_opaque_node_between_same_shaped_nodes_blocks_merging():
    """exp -> gather -> add(gather, exp): merging exp and add would put gather both after and before the group."""
    def body(g, x, idx):
        a = call(g, "exp", x)
        return call(g, "add", call(g, "gather", a, idx, dim=1), a)

    gm, kernels = fused(body, X48(), torch.zeros(4, 8, dtype=torch.int64))
    assert [ops(k) for k in kernels] == [["exp"], ["gather"], ["add"]]
    assert "cycle" in kernels[0].reason


def test_cycle_through_a_kernel_whose_nodes_are_not_connected():
    """a -> gather -> c1 and c2 -> gather -> b, with c1 and c2 in one kernel (siblings of q) but no path from c1 to
    c2: merging a and b would need the {q, c1, c2} kernel both after a and before b. The check walks kernels,
    not just nodes."""
    def body(g, x, y, idx):
        a = call(g, "tanh", x)
        g1 = call(g, "gather", a, idx, dim=1)
        q = call(g, "exp", y)
        c1 = call(g, "add", g1, q)
        c2 = call(g, "sin", q)
        g2 = call(g, "gather", c2, idx, dim=1)
        return call(g, "mul", g2, a), c1

    gm, kernels = fused(body, X48(), X48(), torch.zeros(4, 8, dtype=torch.int64))
    assert [ops(k) for k in kernels] == [["tanh"], ["gather"], ["exp", "add", "sin"], ["gather"], ["mul"]]
    assert "merging tanh and mul would create a cycle" in kernels[0].reason
    assert nx.is_directed_acyclic_graph(kernel_dag(kernels))


def test_full_and_non_primitive_calls_are_opaque_and_a_cat_is_its_own_kernel():
    def body(g, x):
        c = call(g, "cat", x, x, dim=0)
        f = g.call_function(prims.full, (), dict(shape=(8, 8), value=1.0, dtype=torch.float32))
        s = call(g, "add", c, f)
        return g.call_function(torch.tanh, (s,))  # not a prim: run as is

    gm, kernels = fused(body, X48())
    assert [(k.kind, ops(k)) for k in kernels] == [("cat", ["cat"]), ("opaque", ["full"]),
                                                   ("elementwise", ["add"]), ("opaque", ["runtime.tanh"])]
    assert "not a primitive" in kernels[3].reason


def test_missing_shape_meta_is_a_clear_error():
    g = Graph()
    x = g.placeholder("x")
    g.output(g.call_function(prims.exp, (x,)))
    with pytest.raises(FusionError, match="propagate_shapes"):
        fuse(g)


def test_verify_catches_broken_kernels():
    gm, kernels = build(lambda g, x: call(g, "linear", softmax_body(g, x), g.get_attr("w")), X48())
    kernels = fuse(gm.graph)
    with pytest.raises(FusionError, match="invalid order"):
        verify(kernels[::-1], gm.graph)
    broken = [dataclasses.replace(kernels[0], nodes=kernels[0].nodes + kernels[1].nodes[:1])] + kernels[1:]
    with pytest.raises(FusionError, match="in two kernels"):
        verify(broken, gm.graph)
    with pytest.raises(FusionError, match="miss"):
        verify(kernels[:-1], gm.graph)


# ---------------------------------------------------------------------------------------------------------------
# Invariants on random graphs: every node once, valid order, acyclic kernel DAG, same values as the interpreter
# ---------------------------------------------------------------------------------------------------------------

SHAPES = [(4, 8), (4, 1), (1, 8), (8,)]  # any two broadcast together


def random_body(seed):
    rng = random.Random(seed)

    def body(g, x, idx):
        pool = [x, g.get_attr("v")]
        shapes = {x: (4, 8), pool[1]: (8,)}

        def add(node, shape):
            pool.append(node)
            shapes[node] = shape
            return node

        for _ in range(rng.randint(4, 18)):
            pick = rng.choice(pool)
            s = shapes[pick]
            choice = rng.random()
            if choice < 0.3:
                add(call(g, rng.choice(["tanh", "neg", "relu", "sin", "sigmoid", "exp"]), pick), s)
            elif choice < 0.55:
                other = rng.choice(pool)
                out = tuple(np.broadcast_shapes(s, shapes[other]))
                add(call(g, rng.choice(["add", "mul", "sub", "maximum"]), pick, other), out)
            elif choice < 0.7 and s == (4, 8):
                dim = rng.choice([0, 1])
                op = rng.choice(["sum", "amax", "amin"])
                add(call(g, op, pick, dims=(dim,), keepdim=True), (1, 8) if dim == 0 else (4, 1))
            elif choice < 0.78 and s == (4, 8):
                add(call(g, "linear", pick, g.get_attr("m")), (4, 8))
            elif choice < 0.84 and s == (4, 1):
                add(call(g, "expand", pick, shape=(4, 8)), (4, 8))
            elif choice < 0.9 and s == (8,):
                add(call(g, "reshape", pick, shape=(1, 8)), (1, 8))
            elif choice < 0.95 and s == (4, 8):
                add(call(g, "gather", pick, idx, dim=1), (4, 8))
            else:
                add(call(g, "sum", pick, dims=(0,), keepdim=False) if s == (4, 8) else call(g, "mul", pick, 0.5),
                    (8,) if s == (4, 8) else s)
        computed = [n for n in pool if n.op == "call_function"] or [add(call(g, "neg", x), (4, 8))]
        outs = rng.sample(computed, k=min(len(computed), rng.randint(1, 3)))
        return tuple(dict.fromkeys(outs + [computed[-1]]))

    return body


@pytest.mark.parametrize("seed", list(range(60)) + [94, 323, 1149, 2447])  # the last ones once found cycles
def test_random_graphs_keep_the_invariants(seed):
    idx = torch.tensor(np.random.default_rng(seed).integers(0, 8, size=(4, 8)))
    gm, kernels = fused(random_body(seed), X48(), idx)
    dag = kernel_dag(kernels)
    assert nx.is_directed_acyclic_graph(dag)
    assert all(a < b for a, b in dag.edges)  # the list order is a topological order
    for k in kernels:
        assert k.reason
        assert k.kind in ("elementwise", "reduction", "row", "matmul", "window", "gather", "take", "cat", "opaque")
        if k.kind == "row":  # reductions of one signature; values along the row or one per row
            reductions = [r["node"] for r in k.meta["reductions"]]
            out_shape = reductions[0].meta["shape"]
            assert len({(r.args[0].meta["shape"], m["dims"], r.meta["shape"])
                        for r, m in zip(reductions, k.meta["reductions"])}) == 1
            assert all(n.meta["shape"] in (k.shape, out_shape) for n in k.nodes if n not in reductions)
        if k.kind == "elementwise":
            assert {n.meta["shape"] for n in k.nodes} == {k.shape}
        if k.kind == "reduction":
            reductions = [r["node"] for r in k.meta["reductions"]]
            prologue, epilogue = set(k.meta["prologue"]), set(k.meta["epilogue"])
            assert set(k.nodes) == prologue | epilogue | set(reductions)
            assert len({(r.args[0].meta["shape"], m["dims"], r.meta["shape"])
                        for r, m in zip(reductions, k.meta["reductions"])}) == 1  # siblings
            assert all(n.meta["shape"] == k.shape for n in prologue)
            assert all(n.meta["shape"] == reductions[0].meta["shape"] for n in epilogue)
            # one pass: nothing in it reads a reduction result, and the epilogue reads no prologue value
            assert not {a for n in prologue | set(reductions) for a in n.all_input_nodes} & (set(reductions) | epilogue)
            assert not {a for n in epilogue for a in n.all_input_nodes} & prologue


def _merge_closes_a_cycle(fuser, group, other) -> bool:
    """The cycle check from its definition: the kernel DAG of the current groups, with the two merged, has a cycle."""
    import networkx as nx

    def key(node):
        owner = fuser.group_of[node]
        return id(group) if owner is other else id(owner)

    dag = nx.DiGraph()
    for node, owner in fuser.group_of.items():
        dag.add_node(key(node))
        dag.add_edges_from((key(node), key(u)) for u in node.users if u in fuser.group_of and key(u) != key(node))
    return not nx.is_directed_acyclic_graph(dag)


def block_graphs() -> list:
    """examples/models.py's transformer block at [2, 16, 32]: its forward and backward graphs, as fusion sees them."""
    from examples.models import TransformerBlock
    from nnc import pipeline

    torch.manual_seed(0)
    c = pipeline.Compilation(TransformerBlock(), {}, {"x": torch.randn(2, 16, 32)}, needs_grad=True)
    pipeline.run_stages(c, until="simplify_backward")
    return [gm for _, gm in pipeline.stage_graphs(c, "split") + pipeline.stage_graphs(c, "simplify_backward")]


def test_cycle_search_by_group_rank_changes_nothing(monkeypatch):
    """The cycle search walks only the groups ranked between the two being merged (nnc.passes.fusion._Fuser keeps
    the ranks a topological order as groups merge); checking the whole kernel DAG instead gives the same kernels,
    and after fusion the ranks still order every edge between kernels."""
    from nnc.passes import fusion

    def signature(kernels):
        return [(k.kind, [n.name for n in k.nodes]) for k in kernels]

    graphs = [build(random_body(seed), X48(), torch.zeros(4, 8, dtype=torch.int64))[0] for seed in range(40)]
    graphs += block_graphs()
    ranked = [signature(fuse(gm.graph)) for gm in graphs]
    for gm in graphs:
        fuser = fusion._Fuser(gm.graph)
        groups = fuser.run()
        for g in groups:
            assert all(g.rank < s.rank for s in g.succs) and all(p.rank < g.rank for p in g.preds)
            assert g.succs == {fuser.group_of[u] for n in g.nodes for u in n.users if u in fuser.group_of} - {g}
    monkeypatch.setattr(fusion._Fuser, "creates_cycle", _merge_closes_a_cycle)
    assert [signature(fuse(gm.graph)) for gm in graphs] == ranked


def test_expensive_nodes_are_computed_once():
    expensive = {"exp", "tanh", "sin", "sigmoid", "log", "erf"}
    for seed in range(40):
        idx = torch.zeros(4, 8, dtype=torch.int64)
        gm, _ = build(random_body(seed), X48(), idx)
        kernels = fuse(gm.graph)
        for node in gm.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, Prim) and node.target.op.name in expensive:
                assert sum(node in k.nodes for k in kernels) == 1


# ---------------------------------------------------------------------------------------------------------------
# A decomposed model
# ---------------------------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.fc2(h))
        return torch.softmax(self.fc3(h), -1)


def test_decomposed_mlp():
    from nnc.passes.decompose import decompose

    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(5, 8)
    gm = decompose(nnc.trace(model), x)
    kernels = fuse(gm.graph)
    verify(kernels, gm.graph)
    assert [(k.kind, ops(k)) for k in kernels] == [
        ("matmul", ["linear", "add", "relu"]),
        ("matmul", ["linear", "add", "relu"]),
        ("matmul", ["linear", "add"]),
        ("row", ["amax", "detach", "sub", "exp", "sum", "div"]),
    ]
    result, expected = run_kernels(gm, kernels, (x,))
    np.testing.assert_allclose(array(result), array(model(x)), rtol=1e-5, atol=1e-6)
