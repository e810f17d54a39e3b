"""Five views of a Graph (text, table, python, dot, json), shared by the `nnc` command and the tests."""
from __future__ import annotations

import json
import math
import numbers

from runtime.dtypes import dtype as DType
from runtime.tensor import Tensor

from .graph import Graph, Node, target_name
from .graph_module import PythonCode

FORMATS = ("text", "table", "python", "dot", "json")
_TABLE_COLUMNS = ("opcode", "name", "target", "args", "kwargs", "shape", "dtype")
_DOT_SHAPES = {"placeholder": "oval", "output": "oval", "get_attr": "note"}


def format_graph(graph: Graph, fmt: str, *, module=None) -> str:
    """Render `graph` as one of FORMATS.

    `module` (the traced root, e.g. the GraphModule) lets the text and dot views name the class of each
    call_module target. Only the json view carries `source` (absolute "file:line" paths, as recorded).
    """
    view = _VIEWS.get(fmt)
    if view is None:
        raise ValueError(f"unknown graph format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    return view(graph, module)


# -- shared helpers ---------------------------------------------------------------------------------


def _positions(graph: Graph) -> dict:
    return {node: i for i, node in enumerate(graph.nodes)}


def _users(node: Node, positions: dict) -> list[Node]:
    """A node's users in graph order (node.users keeps the order edits happened in)."""
    return sorted(node.users, key=lambda user: positions.get(user, len(positions)))


def _type_text(shape, dtype) -> str:
    """`float32[3, 4]`; either half alone when the other is unknown; '' when both are."""
    dims = "" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"
    return ("" if dtype is None else dtype.name) + dims


def _result(node: Node):
    """The node's result meta: {'shape', 'dtype'}, a nested list of them for tuples, or None when unknown."""
    if "tensor_meta" in node.meta:
        return node.meta["tensor_meta"]
    if node.meta.get("shape") is None and node.meta.get("dtype") is None:
        return None
    return {"shape": node.meta.get("shape"), "dtype": node.meta.get("dtype")}


def _result_text(result, render) -> str:
    """render(shape, dtype) for a tensor result; tuples of results in parentheses; '?' for non-tensors."""
    if isinstance(result, dict):
        return render(result.get("shape"), result.get("dtype"))
    if isinstance(result, list):
        inner = ", ".join(_result_text(r, render) for r in result)
        return f"({inner},)" if len(result) == 1 else f"({inner})"
    return "?"


def _annotation(node: Node) -> str:
    result = _result(node)
    return "" if result is None else _result_text(result, _type_text)


def _submodule_class(module, path: str) -> str | None:
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return None if obj is None else type(obj).__name__


def _module_class(node: Node, module) -> str | None:
    """The class name of a call_module node's module, when the root module is known."""
    if module is None or node.op != "call_module":
        return None
    return _submodule_class(module, node.target)


def _arg_text(value) -> str:
    """An argument as the text and table views show it: node references as %name."""
    if isinstance(value, Node):
        return f"%{value.name}"
    if isinstance(value, tuple):
        inner = ", ".join(_arg_text(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(_arg_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_arg_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, slice):
        return f"slice({_arg_text(value.start)}, {_arg_text(value.stop)}, {_arg_text(value.step)})"
    if value is Ellipsis:
        return "..."
    if isinstance(value, Tensor):
        return f"Tensor({_type_text(tuple(value.shape), value.dtype)})"
    return repr(value)


# -- text -------------------------------------------------------------------------------------------


def _text(graph: Graph, module) -> str:
    params = ", ".join(node.name for node in graph.placeholders)
    return "\n".join([f"graph({params}):"] + [f"    {_text_line(node, module)}" for node in graph.nodes])


def _text_line(node: Node, module) -> str:
    if node.op == "output":
        return f"return {_arg_text(node.args[0])}"
    annotation = _annotation(node)
    head = f"%{node.name} : {annotation}" if annotation else f"%{node.name}"
    line = f"{head} = {node.op}[target={target_name(node.target)}]{_call_text(node)}"
    cls = _module_class(node, module)
    return f"{line}  # {cls}" if cls else line


def _call_text(node: Node) -> str:
    if node.op == "placeholder":
        return f"(default={_arg_text(node.meta['default'])})" if "default" in node.meta else ""
    if node.op == "get_attr":
        return ""
    return f"(args = {_arg_text(node.args)}, kwargs = {_arg_text(node.kwargs)})"


# -- table ------------------------------------------------------------------------------------------


def _table(graph: Graph, module) -> str:
    rows = [_table_row(node) for node in graph.nodes]
    widths = [max(len(row[i]) for row in [_TABLE_COLUMNS, *rows]) for i in range(len(_TABLE_COLUMNS))]
    separator = tuple("-" * w for w in widths)
    return "\n".join(_table_line(row, widths) for row in [_TABLE_COLUMNS, separator, *rows])


def _table_row(node: Node) -> tuple:
    result = _result(node)
    shape = "" if result is None else _result_text(result, lambda s, d: _type_text(s, None))
    dtype = "" if result is None else _result_text(result, lambda s, d: _type_text(None, d))
    return (node.op, node.name, target_name(node.target), _arg_text(node.args), _arg_text(node.kwargs), shape, dtype)


def _table_line(row: tuple, widths: list) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()


# -- python -----------------------------------------------------------------------------------------


def _python(graph: Graph, module) -> str:
    return PythonCode(graph).src


# -- dot --------------------------------------------------------------------------------------------


def _dot(graph: Graph, module) -> str:
    positions = _positions(graph)
    lines = ['digraph "graph" {', '  node [shape=box, fontname="monospace"];']
    lines += [f"  {_dot_node(node, module)}" for node in graph.nodes]
    lines += [f"  {_dot_id(node.name)} -> {_dot_id(user.name)};"
              for node in graph.nodes for user in _users(node, positions)]
    return "\n".join(lines + ["}"])


def _dot_node(node: Node, module) -> str:
    target = target_name(node.target)
    cls = _module_class(node, module)
    lines = [node.name, node.op, f"{target} ({cls})" if cls else target, _annotation(node)]
    label = "\n".join(line for line in lines if line)
    attrs = [f"label={_dot_id(label)}"]
    if node.op in _DOT_SHAPES:
        attrs.append(f"shape={_DOT_SHAPES[node.op]}")
    return f"{_dot_id(node.name)} [{', '.join(attrs)}];"


def _dot_id(text: str) -> str:
    """A quoted DOT string; newlines become DOT's centred line breaks."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


# -- json -------------------------------------------------------------------------------------------


def _json(graph: Graph, module) -> str:
    """One node per line, so that a diff of two dumps reads node by node."""
    positions = _positions(graph)
    nodes = ",\n".join(f"    {_json_dumps(_json_node(node, positions))}" for node in graph.nodes)
    meta = _json_dumps({key: _json_value(graph.meta[key]) for key in sorted(graph.meta)})
    return f'{{\n  "nodes": [\n{nodes}\n  ],\n  "meta": {meta}\n}}'


def _json_dumps(value) -> str:
    return json.dumps(value, allow_nan=False)


def _json_node(node: Node, positions: dict) -> dict:
    shape = node.meta.get("shape")
    return {"name": node.name, "op": node.op, "target": target_name(node.target),
            "args": _json_value(node.args), "kwargs": _json_value(node.kwargs),
            "users": [user.name for user in _users(node, positions)],
            "shape": None if shape is None else [int(d) for d in shape],
            "dtype": _json_value(node.meta.get("dtype")),
            "source": node.meta.get("source"), "module_path": node.meta.get("module_path")}


def _json_value(value):
    """A JSON-safe rendering: tagged objects ({"node": name}, {"slice": [...]}, ...) for non-JSON values."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else {"float": repr(float(value))}
    if isinstance(value, Node):
        return {"node": value.name}
    if isinstance(value, (tuple, list)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, slice):
        return {"slice": [_json_value(value.start), _json_value(value.stop), _json_value(value.step)]}
    if isinstance(value, DType):
        return repr(value)
    if value is Ellipsis:
        return {"ellipsis": True}
    if isinstance(value, Tensor):
        return {"tensor": {"shape": list(value.shape), "dtype": repr(value.dtype)}}
    return {"repr": repr(value)}


_VIEWS = {"text": _text, "table": _table, "python": _python, "dot": _dot, "json": _json}
