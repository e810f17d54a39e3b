"""nnc.graph: the Graph API passes are written with (creating and editing nodes, users kept in sync, lint, dead
code, copying, the networkx view, naming) and an Interpreter subclass."""
from __future__ import annotations

import ast
import operator

import networkx as nx
import numpy as np
import pytest

import nnc
import runtime as torch
import runtime.nn.functional as F
from nnc.graph import Graph, GraphError
from runtime import nn


def names(graph) -> list[str]:
    return [n.name for n in graph.nodes]


def small_graph():
    """x -> relu -> (relu + 1) * relu -> output: a diamond with one input."""
    g = Graph()
    x = g.placeholder("x")
    relu = g.call_function(F.relu, (x,))
    add = g.call_function(operator.add, (relu, 1))
    mul = g.call_function(operator.mul, (add, relu))
    g.output(mul)
    return g, x, relu, add, mul


class Holder(nn.Module):
    """A module for hand-built graphs to refer to: a parameter and a leaf layer."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([2.0, 3.0]))
        self.fc = nn.Linear(2, 2)


def graph_module(graph, root=None):
    return nnc.GraphModule(root if root is not None else Holder(), graph)


# ---------------------------------------------------------------------------------------------------------------
# Creating nodes
# ---------------------------------------------------------------------------------------------------------------


def test_create_every_kind_of_node_and_run_it():
    g = Graph()
    x = g.placeholder("x")
    scale = g.get_attr("scale")
    scaled = g.call_function(operator.mul, (x, scale))
    fc = g.call_module("fc", (scaled,))
    summed = g.call_method("sum", (fc,), {"dim": -1})
    g.output(summed)
    assert [n.op for n in g.nodes] == ["placeholder", "get_attr", "call_function", "call_module", "call_method",
                                       "output"]
    assert x.users == {scaled: None} and scale.users == {scaled: None} and fc.all_input_nodes == [scaled]
    m = Holder()
    gm = graph_module(g, m)
    g.lint(gm)
    ast.parse(gm.code)
    assert "summed" not in gm.code and "sum_1 = fc.sum(dim=-1)" in gm.code
    inp = torch.randn(4, 2)
    expected = m.fc(inp * m.scale).sum(dim=-1)
    np.testing.assert_array_equal(gm(inp).detach().numpy(), expected.detach().numpy())
    np.testing.assert_array_equal(nnc.Interpreter(gm).run(inp).detach().numpy(), expected.detach().numpy())


def test_nodes_created_after_the_output_go_before_it():
    g, x, relu, add, mul = small_graph()
    extra = g.call_function(torch.tanh, (mul,))
    assert g.nodes[-1].op == "output" and g.nodes[-2] is extra
    g.lint()


def test_unknown_opcode_is_refused():
    with pytest.raises(GraphError, match="unknown opcode"):
        Graph().create_node("call_everything", print)


def test_unique_names():
    g = Graph()
    x = g.placeholder("x")
    linears = [g.call_function(F.linear, (x, x)) for _ in range(3)]
    assert [n.name for n in linears] == ["linear", "linear_1", "linear_2"]
    assert g.call_method("sum", (x,)).name == "sum_1"  # never a builtin's name
    assert g.call_module("layers.0", (x,)).name == "layers_0"
    assert g.call_function(operator.getitem, (x, 0)).name == "getitem"
    assert g.call_method("float", (x,)).name == "float_1"
    assert g.create_node("call_function", operator.add, (x, 1), name="class").name == "_class"
    assert g.create_node("call_function", operator.add, (x, 1), name="0 weird-name").name == "_0_weird_name"
    assert g.create_node("call_function", operator.add, (x, 1), name="self").name == "self_1"
    assert g.placeholder("input").name == "input"  # an argument keeps its name, so keyword calls work
    assert len(set(names(g))) == len(g.nodes)


def test_unique_names_skip_taken_suffixes_in_any_order():
    """Suffixes continue from the last one a hint got, past names another hint already took."""
    g = Graph()
    x = g.placeholder("x")
    assert g.create_node("call_function", operator.add, (x, 1), name="add_2").name == "add_2"
    adds = [g.create_node("call_function", operator.add, (x, 1), name="add").name for _ in range(4)]
    assert adds == ["add", "add_1", "add_3", "add_4"]
    assert g.create_node("call_function", operator.add, (x, 1), name="add_4").name == "add_4_1"
    assert g.create_node("call_function", operator.add, (x, 1), name="input").name == "input_1"  # a builtin
    assert g.placeholder("input").name == "input"  # free for an argument: the two searches are kept apart
    assert g.placeholder("input").name == "input_2"


# ---------------------------------------------------------------------------------------------------------------
# Inserting, replacing, erasing
# ---------------------------------------------------------------------------------------------------------------


def test_inserting_before_keeps_the_order_of_several_insertions():
    g, x, relu, add, mul = small_graph()
    with g.inserting_before(add):
        a = g.call_function(torch.sin, (relu,))
        b = g.call_function(torch.cos, (a,))
        c = g.call_function(torch.exp, (b,))
    assert names(g) == ["x", "relu", "sin", "cos", "exp", "add", "mul", "output"]
    assert [a, b, c] == g.nodes[2:5]
    g.lint()
    # outside the block, new nodes go before the output again
    assert g.call_function(torch.tanh, (mul,)) is g.nodes[-2]


def test_inserting_after_keeps_the_order_of_several_insertions():
    g, x, relu, add, mul = small_graph()
    with g.inserting_after(x):
        a = g.call_function(torch.sin, (x,))
        b = g.call_function(torch.cos, (a,))
        with g.inserting_after(mul):
            d = g.call_function(torch.neg, (mul,))
        c = g.call_function(torch.exp, (b,))
    assert names(g) == ["x", "sin", "cos", "exp", "relu", "add", "mul", "neg", "output"]
    assert [a, b, c, d] == [g.nodes[1], g.nodes[2], g.nodes[3], g.nodes[7]]
    g.lint()


def test_replace_all_uses_with():
    g, x, relu, add, mul = small_graph()
    with g.inserting_after(relu):
        sig = g.call_function(torch.sigmoid, (x,))
    changed = relu.replace_all_uses_with(sig)
    assert changed == [add, mul]
    assert relu.users == {} and sig.users == {add: None, mul: None}
    assert add.args == (sig, 1) and mul.args == (add, sig)
    g.lint()
    g.erase_node(relu)
    assert "relu" not in names(g) and x.users == {sig: None}
    g.lint()


def test_replace_input_with_changes_one_user_only():
    g, x, relu, add, mul = small_graph()
    mul.replace_input_with(relu, x)
    assert mul.args == (add, x)
    assert relu.users == {add: None} and mul in x.users
    g.lint()


def test_replace_input_with_reaches_nested_arguments():
    g = Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    cat = g.call_function(torch.cat, ([x, x],), {"dim": 0})
    picked = g.call_function(operator.getitem, (cat, slice(x, None)))
    g.output((cat, {"p": picked}))
    cat.replace_input_with(x, y)
    picked.replace_input_with(x, y)
    assert cat.args == ([y, y],) and picked.args[1] == slice(y, None, None)
    assert x.users == {} and y.users == {cat: None, picked: None}
    assert g.output_node.all_input_nodes == [cat, picked]
    g.lint()


def test_erase_node_refuses_while_used():
    g, x, relu, add, mul = small_graph()
    with pytest.raises(GraphError, match="still used by") as info:
        g.erase_node(relu)
    assert "add" in str(info.value) and "mul" in str(info.value)
    assert relu in g.nodes and relu.users == {add: None, mul: None}
    g.lint()


def test_erase_node_unlinks_its_inputs():
    g, x, relu, add, mul = small_graph()
    g.output_node.args = (add,)
    g.erase_node(mul)
    assert mul not in g.nodes and mul.graph is None
    assert relu.users == {add: None} and add.users == {g.output_node: None}
    g.lint()


def test_users_follow_args_and_kwargs_assignment():
    g, x, relu, add, mul = small_graph()
    add.args = (x, relu)
    assert add in x.users and add in relu.users
    add.args = (x, 2)
    assert add not in relu.users and relu.users == {mul: None}
    add.kwargs = {"other": relu}
    assert add in relu.users
    add.kwargs = {}
    assert add not in relu.users
    g.lint()


def test_a_refused_edit_leaves_the_node_unchanged():
    g, x, relu, add, mul = small_graph()
    other = Graph()
    stranger = other.placeholder("stranger")
    with pytest.raises(GraphError, match="another graph"):
        add.args = (stranger, relu)
    assert add.args == (relu, 1) and add in relu.users and stranger.users == {}
    g.lint()


# ---------------------------------------------------------------------------------------------------------------
# lint
# ---------------------------------------------------------------------------------------------------------------


def test_lint_passes_on_a_good_graph():
    g, *_ = small_graph()
    g.lint()


def test_lint_catches_use_before_definition():
    g, x, relu, add, mul = small_graph()
    g.nodes.remove(add)
    g.nodes.insert(g.nodes.index(relu), add)
    with pytest.raises(GraphError, match="add reads relu, which is not defined before it"):
        g.lint()


def test_lint_catches_a_stale_user():
    g, x, relu, add, mul = small_graph()
    x.users[mul] = None  # mul does not read x
    with pytest.raises(GraphError, match="x.users lists mul"):
        g.lint()


def test_lint_catches_a_missing_user():
    g, x, relu, add, mul = small_graph()
    del relu.users[mul]
    with pytest.raises(GraphError, match="relu.users is missing mul"):
        g.lint()


def test_lint_catches_a_user_that_was_erased():
    g, x, relu, add, mul = small_graph()
    ghost = g.call_function(torch.neg, (relu,))
    g.nodes.remove(ghost)
    ghost.graph = None
    with pytest.raises(GraphError, match="relu.users lists neg"):
        g.lint()


def test_lint_catches_duplicate_names():
    g, x, relu, add, mul = small_graph()
    mul.name = "add"
    with pytest.raises(GraphError, match="duplicate node name add"):
        g.lint()


def test_lint_catches_a_missing_output():
    g, x, relu, add, mul = small_graph()
    g.erase_node(g.output_node)
    with pytest.raises(GraphError, match="output"):
        g.lint()


def test_lint_catches_two_outputs_and_an_output_that_is_not_last():
    g, x, relu, add, mul = small_graph()
    g.create_node("output", "output", (relu,))  # lands after the first output
    with pytest.raises(GraphError, match="exactly one output"):
        g.lint()
    g, x, relu, add, mul = small_graph()
    out = g.output_node
    g.nodes.remove(out)
    g.nodes.insert(g.nodes.index(mul), out)
    with pytest.raises(GraphError):
        g.lint()


def test_lint_catches_a_get_attr_target_the_module_lacks():
    g = Graph()
    x = g.placeholder("x")
    w = g.get_attr("fc.weights")  # the module has fc.weight
    g.output(g.call_function(operator.mul, (x, w)))
    g.lint()  # without the module nothing says the target is wrong
    with pytest.raises(GraphError, match="'fc.weights', which the module does not have"):
        g.lint(Holder())


def test_lint_catches_a_call_module_target_the_module_lacks():
    g = Graph()
    g.output(g.call_module("fc2", (g.placeholder("x"),)))
    with pytest.raises(GraphError, match="fc2"):
        g.lint(Holder())


def test_lint_catches_placeholders_after_other_nodes_and_bad_targets():
    g, x, relu, add, mul = small_graph()
    late = g.placeholder("late")
    g.nodes.remove(late)
    g.nodes.insert(3, late)
    with pytest.raises(GraphError, match="placeholder late comes after"):
        g.lint()
    g, x, relu, add, mul = small_graph()
    relu.target = "relu"
    with pytest.raises(GraphError, match="not callable"):
        g.lint()
    g, x, relu, add, mul = small_graph()
    g.call_method(torch.sum, (x,))
    with pytest.raises(GraphError, match="string target"):
        g.lint()


# ---------------------------------------------------------------------------------------------------------------
# Dead code, copying, networkx
# ---------------------------------------------------------------------------------------------------------------


def test_eliminate_dead_code():
    g, x, relu, add, mul = small_graph()
    with g.inserting_after(x):
        unused_input = g.placeholder("unused")
    dead = g.call_function(torch.exp, (relu,))
    dead_too = g.call_method("sum", (dead,))
    assert g.eliminate_dead_code() is True
    assert dead not in g.nodes and dead_too not in g.nodes and unused_input in g.nodes
    assert relu.users == {add: None, mul: None}
    assert g.eliminate_dead_code() is False
    g.lint()


def test_eliminate_dead_code_keeps_writes_and_what_is_impure_says():
    g, x, relu, add, mul = small_graph()
    setitem = g.call_function(operator.setitem, (relu, 0, 1.0))
    inplace = g.call_method("add_", (add, 1.0))
    dunder = g.call_method("__neg__", (add,))
    kept = g.call_function(print, (mul,))
    g.eliminate_dead_code(is_impure=lambda n: n.target is print)
    assert setitem in g.nodes and inplace in g.nodes and kept in g.nodes and dunder not in g.nodes
    g.lint()


def test_node_copy_into_another_graph():
    g, x, relu, add, mul = small_graph()
    relu.meta["shape"] = (2, 3)
    copied = Graph()
    env = {}
    for n in g.nodes:
        if n.op == "output":
            copied.output(env[n.args[0]])
        else:
            env[n] = copied.node_copy(n, lambda arg: env[arg])
    assert names(copied) == names(g)
    assert all(env[n].graph is copied for n in env)
    assert env[mul].args == (env[add], env[relu]) and env[relu].users == {env[add]: None, env[mul]: None}
    assert relu.users == {add: None, mul: None}  # the original is untouched
    assert env[relu].meta == {"shape": (2, 3)} and env[relu].meta is not relu.meta
    copied.lint()
    gm = graph_module(copied)
    inp = torch.randn(4)
    expected = (F.relu(inp) + 1) * F.relu(inp)
    np.testing.assert_array_equal(gm(inp).numpy(), expected.numpy())


def test_node_copy_without_mapping_refuses_nodes_of_another_graph():
    g, x, relu, add, mul = small_graph()
    with pytest.raises(GraphError, match="another graph"):
        Graph().node_copy(relu, lambda arg: arg)


def test_to_networkx_topological_order_and_dominators():
    g, x, relu, add, mul = small_graph()
    dg = g.to_networkx()
    assert nx.is_directed_acyclic_graph(dg)
    assert list(dg.nodes) == g.nodes
    assert set(dg.edges) == {(x, relu), (relu, add), (relu, mul), (add, mul), (mul, g.output_node)}
    position = {n: i for i, n in enumerate(g.nodes)}
    assert all(position[a] < position[b] for a, b in dg.edges)
    assert list(nx.lexicographical_topological_sort(dg, key=position.__getitem__)) == g.nodes
    idom = nx.immediate_dominators(dg, x)
    assert idom[relu] is x and idom[add] is relu and idom[mul] is relu and idom[g.output_node] is mul
    assert dg.nodes[relu]["op"] == "call_function" and dg.nodes[relu]["target"] == "F.relu"


def test_to_networkx_of_a_traced_model():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            h = self.fc1(x)
            return h + self.fc2(torch.tanh(h))

    gm = nnc.symbolic_trace(Block())
    dg = gm.graph.to_networkx()
    assert nx.is_directed_acyclic_graph(dg)
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    assert list(nx.lexicographical_topological_sort(dg, key=position.__getitem__)) == gm.graph.nodes
    fc1 = next(n for n in gm.graph.nodes if n.target == "fc1")
    add = next(n for n in gm.graph.nodes if n.target is operator.add)
    assert nx.immediate_dominators(dg, gm.graph.placeholders[0])[add] is fc1


# ---------------------------------------------------------------------------------------------------------------
# GraphModule code for hand-made targets, and the Interpreter as a base class
# ---------------------------------------------------------------------------------------------------------------


def test_code_refers_to_functions_that_have_no_importable_name():
    def local_double(v):
        return v * 2

    g = Graph()
    x = g.placeholder("x")
    g.output(g.call_function(lambda v: v + 1, (g.call_function(local_double, (x,)),)))
    gm = graph_module(g)
    ast.parse(gm.code)
    assert gm(3) == 7 and nnc.Interpreter(gm).run(3) == 7


def test_interpreter_subclass_counts_calls():
    class Counting(nnc.Interpreter):
        def __init__(self, module):
            super().__init__(module)
            self.counts = {}

        def call_function(self, target, args, kwargs):
            name = getattr(target, "__name__", str(target))
            self.counts[name] = self.counts.get(name, 0) + 1
            return super().call_function(target, args, kwargs)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            x = F.relu(self.fc(x))
            return F.relu(x + 1) * 2

    m = M()
    interpreter = Counting(nnc.symbolic_trace(m))
    x = torch.randn(2, 3)
    out = interpreter.run(x)
    assert interpreter.counts == {"relu": 2, "add": 1, "mul": 1}
    np.testing.assert_array_equal(out.detach().numpy(), m(x).detach().numpy())
    interpreter.run(x)
    assert interpreter.counts["relu"] == 4


def test_interpreter_subclass_can_change_what_runs():
    class ReluToTanh(nnc.Interpreter):
        def call_function(self, target, args, kwargs):
            return super().call_function(torch.tanh if target is F.relu else target, args, kwargs)

    g, x, relu, add, mul = small_graph()
    inp = torch.randn(5)
    out = ReluToTanh(graph_module(g)).run(inp)
    np.testing.assert_array_equal(out.numpy(), ((torch.tanh(inp) + 1) * torch.tanh(inp)).numpy())


def test_interpreter_takes_keywords_and_defaults():
    g = Graph()
    x = g.placeholder("x")
    y = g.placeholder("y", default=None)
    g.output((x, y))
    gm = graph_module(g)
    assert "def forward(self, x, y=None):" in gm.code
    assert nnc.Interpreter(gm).run(1) == (1, None) == gm(1)
    assert nnc.Interpreter(gm).run(1, y=2) == (1, 2) == gm(1, y=2)
    with pytest.raises(TypeError, match="'x'"):
        nnc.Interpreter(gm).run()
