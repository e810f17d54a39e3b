"""nnc.printer: golden files lock the five views of two graphs; structural checks on json and dot.

Golden files live in tests/golden/<graph>.<format> and are compared exactly (each file ends with one
newline, added when the view does not end with one). To regenerate them after an intended format change:

    NNC_UPDATE_GOLDEN=1 python -m pytest -q tests/test_printer.py

then review the diff of tests/golden/. Only the json view prints node meta 'source' (absolute "file:line"
paths, as the tracer records them); the json golden test replaces each of those with
"test_printer.py:<line>" before comparing, so the goldens hold neither absolute paths nor line numbers
of this file.
"""
from __future__ import annotations

import json
import math
import operator
import os
import pathlib
import re

import pytest

import nnc
import runtime
import runtime.nn as nn
import runtime.nn.functional as F
from nnc.graph import Graph
from nnc.passes.shapes import propagate_shapes
from nnc.printer import FORMATS, format_graph

GOLDEN_DIR = pathlib.Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("NNC_UPDATE_GOLDEN") == "1"
THIS_FILE = os.path.abspath(__file__)


class Custom(nn.Module):
    """A call_function, a call_method, getattr/getitem on x.shape and a parameter read (get_attr)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(runtime.ones(4))

    def forward(self, x):
        batch = x.shape[0]
        y = runtime.tanh(x * self.scale)
        y = y.sum(dim=-1, keepdim=True)
        return F.relu(y + x).view(batch, -1)[..., 1:]


def mlp_module():
    gm = nnc.symbolic_trace(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    return propagate_shapes(gm, runtime.randn(3, 4, dtype=runtime.float32))


def custom_module():
    return nnc.symbolic_trace(Custom())


MODULES = {"mlp": mlp_module, "custom": custom_module}


def _without_sources(text: str, graph: Graph) -> str:
    """Replace each absolute 'source' path in a json view with this file's base name and a fixed line."""
    for node in graph.nodes:
        source = node.meta.get("source")
        if source is not None:
            path, _, line = source.rpartition(":")
            assert path == THIS_FILE and line.isdigit(), source
            text = text.replace(json.dumps(source), json.dumps("test_printer.py:<line>"))
    return text


def _check_golden(name: str, actual: str) -> None:
    path = GOLDEN_DIR / name
    content = actual if actual.endswith("\n") else actual + "\n"
    if UPDATE:
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(content)
        return
    assert path.exists(), f"{path} is missing; run with NNC_UPDATE_GOLDEN=1 to create it"
    assert content == path.read_text(), f"{name} differs from its golden file (NNC_UPDATE_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("graph_name", sorted(MODULES))
def test_golden(graph_name, fmt):
    gm = MODULES[graph_name]()
    out = format_graph(gm.graph, fmt, module=gm)
    if fmt == "json":
        out = _without_sources(out, gm.graph)
    else:
        assert "test_printer.py" not in out
    _check_golden(f"{graph_name}.{fmt}", out)


@pytest.mark.parametrize("graph_name", sorted(MODULES))
def test_json_parses_and_round_trips_names_and_users(graph_name):
    graph = MODULES[graph_name]().graph
    doc = json.loads(format_graph(graph, "json"))
    assert list(doc) == ["nodes", "meta"]
    assert [n["name"] for n in doc["nodes"]] == [n.name for n in graph.nodes]
    assert {n["name"]: n["users"] for n in doc["nodes"]} == {n.name: [u.name for u in n.users] for n in graph.nodes}
    assert [list(n) for n in doc["nodes"]] == [["name", "op", "target", "args", "kwargs", "users", "shape", "dtype",
                                                "source", "module_path"]] * len(graph)
    assert doc["meta"]["training"] is True


def test_json_renders_non_json_values():
    graph = Graph()
    x = graph.placeholder("x")
    index = graph.call_function(operator.getitem, (x, (Ellipsis, slice(x, None, 2))))
    cast = graph.call_method("to", (index,), {"dtype": runtime.float64, "fill": (math.inf, -math.inf, math.nan)})
    graph.output([cast])
    graph.meta["training"] = False
    doc = json.loads(format_graph(graph, "json"))
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert nodes["getitem"]["args"] == [{"node": "x"}, [{"ellipsis": True}, {"slice": [{"node": "x"}, None, 2]}]]
    assert nodes["to"]["kwargs"] == {"dtype": "runtime.float64",
                                     "fill": [{"float": "inf"}, {"float": "-inf"}, {"float": "nan"}]}
    assert nodes["output"]["args"] == [[{"node": "to"}]]
    assert doc["meta"] == {"training": False}


def _dot_edges(dot: str) -> list[tuple[str, str]]:
    return re.findall(r'^  "(\w+)" -> "(\w+)";$', dot, flags=re.MULTILINE)


def _assert_valid_dot(dot: str) -> None:
    """Every line is one of the statements the dot view writes, with properly escaped quoted strings."""
    quoted = r'"(?:[^"\\]|\\.)*"'
    statement = re.compile(rf'^  (?:node \[.*\]|{quoted} \[label={quoted}(?:, shape=\w+)?\]|{quoted} -> {quoted});$')
    lines = dot.split("\n")
    assert lines[0] == 'digraph "graph" {' and lines[-1] == "}"
    for line in lines[1:-1]:
        assert statement.match(line), line


@pytest.mark.parametrize("graph_name", sorted(MODULES))
def test_dot_has_one_edge_per_use(graph_name):
    graph = MODULES[graph_name]().graph
    dot = format_graph(graph, "dot")
    _assert_valid_dot(dot)
    expected = [(n.name, u.name) for n in graph.nodes for u in n.users]
    assert sorted(_dot_edges(dot)) == sorted(expected)
    assert len(re.findall(r"\[label=", dot)) == len(graph)


def test_dot_draws_a_repeated_input_once_and_escapes_labels():
    # NOTE: one edge per (producer, user) pair, as node.users and torch.fx's drawer count uses.
    graph = Graph()
    x = graph.placeholder("x")
    square = graph.call_function(operator.mul, (x, x))
    odd = graph.call_method('we"ird\\', (square,))
    graph.output(odd)
    dot = format_graph(graph, "dot")
    _assert_valid_dot(dot)
    assert _dot_edges(dot) == [("x", "mul"), ("mul", "we_ird"), ("we_ird", "output")]
    assert r'we\"ird\\' in dot


def test_unknown_format_names_the_valid_ones():
    with pytest.raises(ValueError, match="'svg'.*text, table, python, dot, json"):
        format_graph(Graph(), "svg")


def test_text_is_the_graph_repr_and_omits_what_it_does_not_know():
    mlp, custom = mlp_module(), custom_module()
    assert repr(mlp.graph) == format_graph(mlp.graph, "text")
    assert "# Linear" not in repr(mlp.graph) and "# Linear" in format_graph(mlp.graph, "text", module=mlp)
    assert " : " not in repr(custom.graph)  # no shape propagation, so no annotations
    assert repr(custom.graph).splitlines()[0] == "graph(x):"


def test_python_is_the_generated_forward():
    gm = custom_module()
    assert format_graph(gm.graph, "python") == gm.code
