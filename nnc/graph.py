"""The graph IR (FX-shaped): Node and Graph, with users kept in sync, an editing API, lint() and a networkx view."""
from __future__ import annotations

import builtins
import contextlib
import inspect
import keyword
import operator
import re
from typing import Any, Callable

from runtime.utils import _pytree as pytree

# NOTE: generated code refers to these by name, so nodes never take them (nor builtins' names).
_CODE_NAMES = {"self", "runtime", "F", "prims", "operator", "builtins", "inf", "nan", "getattr"}
_RESERVED = _CODE_NAMES | set(dir(builtins))
OPCODES = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")
NO_DEFAULT = inspect.Parameter.empty  # a placeholder without a default value (None is a default like any other)


class GraphError(RuntimeError):
    """A graph invariant is broken (raised by lint and by invalid edits)."""


def map_arg(value, fn: Callable[["Node"], Any]):
    """Apply fn to every Node inside nested tuples, lists, dicts and slices."""
    if isinstance(value, Node):
        return fn(value)
    if isinstance(value, tuple):
        return pytree.like(value, [map_arg(v, fn) for v in value])  # a namedtuple keeps its type
    if isinstance(value, list):
        return [map_arg(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_arg(v, fn) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(map_arg(value.start, fn), map_arg(value.stop, fn), map_arg(value.step, fn))
    return value


def nodes_in(value) -> list["Node"]:
    """The Nodes found inside a nested argument structure, in order, without repeats."""
    found: dict = {}
    map_arg(value, lambda n: found.setdefault(n, None))
    return list(found)


class Node:
    """One operation: `op` is the opcode, `target` what it calls; `users` are the nodes that read it."""

    def __init__(self, graph: "Graph", name: str, op: str, target, args: tuple, kwargs: dict):
        if op not in OPCODES:
            raise GraphError(f"unknown opcode {op!r}; expected one of {OPCODES}")
        self.graph, self.name, self.op, self.target = graph, name, op, target
        self.users: dict[Node, None] = {}
        self.meta: dict[str, Any] = {}
        self._args: tuple = ()
        self._kwargs: dict = {}
        self._inputs: tuple = ()  # nodes_in((args, kwargs)), kept by _update_args: passes ask for it very often
        self._update_args(tuple(args), dict(kwargs))

    # -- arguments, kept in sync with users ---------------------------------------------------------

    @property
    def args(self) -> tuple:
        return self._args

    @args.setter
    def args(self, value) -> None:
        self._update_args(tuple(value), self._kwargs)

    @property
    def kwargs(self) -> dict:
        return self._kwargs

    @kwargs.setter
    def kwargs(self, value) -> None:
        self._update_args(self._args, dict(value))

    @property
    def all_input_nodes(self) -> list["Node"]:
        return list(self._inputs)

    def _update_args(self, args: tuple, kwargs: dict) -> None:
        new_inputs = nodes_in((args, kwargs))
        for new in new_inputs:  # checked before anything changes, so a refused edit leaves the node as it was
            if new.graph is not self.graph:
                raise GraphError(f"node {self.name} would read {new.name}, which belongs to another graph")
        for old in self._inputs:
            old.users.pop(self, None)
        self._args, self._kwargs, self._inputs = args, kwargs, tuple(new_inputs)
        for new in new_inputs:
            new.users[self] = None

    def replace_input_with(self, old: "Node", new: "Node") -> None:
        swap = lambda n: new if n is old else n  # noqa: E731
        self._update_args(map_arg(self._args, swap), map_arg(self._kwargs, swap))

    def replace_all_uses_with(self, replacement: "Node") -> list["Node"]:
        """Point every user of this node at `replacement`; returns the users changed."""
        users = list(self.users)
        for user in users:
            user.replace_input_with(self, replacement)
        return users

    # -- convenience --------------------------------------------------------------------------------

    @property
    def shape(self):
        return self.meta.get("shape")

    @property
    def dtype(self):
        return self.meta.get("dtype")

    @property
    def next(self) -> "Node | None":
        nodes = self.graph.nodes
        i = nodes.index(self)
        return nodes[i + 1] if i + 1 < len(nodes) else None

    def __repr__(self) -> str:
        return self.name


def target_name(target) -> str:
    """A readable name for a call target (a function, an op record, or a string)."""
    if isinstance(target, str):
        return target
    name = getattr(target, "nnc_name", None)
    if name:
        return name
    module = getattr(target, "__module__", "") or ""
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    if module.startswith("runtime") and "<locals>" in qualname:
        qualname = target.__name__  # NOTE: factory-made runtime functions (zeros_like) are public under their __name__
    if module.startswith("runtime.nn.functional"):
        return f"F.{qualname}"
    if module.startswith("runtime"):
        return f"runtime.{qualname}"
    if module in ("_operator", "operator"):
        return f"operator.{qualname}"
    if module == "builtins":
        return qualname
    return f"{module}.{qualname}"


class Graph:
    """An ordered list of nodes ending in one `output` node."""

    def __init__(self):
        self.nodes: list[Node] = []
        self._names: set[str] = set()
        # (base, keep_builtin_names) -> the suffix that base last got: names are never freed, so every earlier
        # suffix is still taken and the next search starts there (a graph of 4,000 nodes named mul_1, mul_2, ...)
        self._last_suffix: dict[tuple[str, bool], int] = {}
        self._insert_at: Callable[[Node], None] | None = None
        self.meta: dict[str, Any] = {}

    def __iter__(self):
        return iter(list(self.nodes))

    def __len__(self) -> int:
        return len(self.nodes)

    # -- creating nodes -----------------------------------------------------------------------------

    def unique_name(self, hint: str, keep_builtin_names: bool = False) -> str:
        """A valid, unused identifier from a hint: linear, linear_1, linear_2, ..."""
        base = re.sub(r"[^0-9a-zA-Z_]+", "_", hint).strip("_") or "node"
        if base[0].isdigit() or keyword.iskeyword(base):
            base = "_" + base
        reserved = _CODE_NAMES if keep_builtin_names else _RESERVED
        i = self._last_suffix.get((base, keep_builtin_names), 0)
        candidate = f"{base}_{i}" if i else base
        while candidate in self._names or candidate in reserved:
            i += 1
            candidate = f"{base}_{i}"
        self._names.add(candidate)
        self._last_suffix[base, keep_builtin_names] = i
        return candidate

    def create_node(self, op: str, target, args=(), kwargs=None, name: str | None = None) -> Node:
        # NOTE: placeholders keep their argument's name (even `input`) so keyword calls still work
        unique = self.unique_name(name or _name_hint(op, target), keep_builtin_names=op == "placeholder")
        node = Node(self, unique, op, target, args, kwargs or {})
        if self._insert_at is not None:
            self._insert_at(node)
        elif self.nodes and self.nodes[-1].op == "output" and op != "output":
            self.nodes.insert(len(self.nodes) - 1, node)
        else:
            self.nodes.append(node)
        return node

    def placeholder(self, name: str, default=NO_DEFAULT) -> Node:
        """An input; meta['default'] holds its default value (None included) when it has one."""
        node = self.create_node("placeholder", name, name=name)
        if default is not NO_DEFAULT:
            node.meta["default"] = default
        return node

    def get_attr(self, qualified_name: str) -> Node:
        return self.create_node("get_attr", qualified_name, name=qualified_name)

    def call_function(self, fn, args=(), kwargs=None) -> Node:
        return self.create_node("call_function", fn, args, kwargs)

    def call_method(self, method: str, args=(), kwargs=None) -> Node:
        return self.create_node("call_method", method, args, kwargs)

    def call_module(self, qualified_name: str, args=(), kwargs=None) -> Node:
        return self.create_node("call_module", qualified_name, args, kwargs)

    def output(self, value) -> Node:
        return self.create_node("output", "output", (value,))

    @contextlib.contextmanager
    def inserting_before(self, node: Node):
        previous = self._insert_at
        self._insert_at = lambda new: self.nodes.insert(self.nodes.index(node), new)
        try:
            yield
        finally:
            self._insert_at = previous

    @contextlib.contextmanager
    def inserting_after(self, node: Node):
        previous, anchor = self._insert_at, [node]

        def insert(new):
            self.nodes.insert(self.nodes.index(anchor[0]) + 1, new)
            anchor[0] = new  # several insertions stay in the order they were made

        self._insert_at = insert
        try:
            yield
        finally:
            self._insert_at = previous

    def erase_node(self, node: Node) -> None:
        if node.users:
            raise GraphError(f"cannot erase {node.name}: it is still used by {[u.name for u in node.users]}")
        node._update_args((), {})
        self.nodes.remove(node)
        node.graph = None

    def node_copy(self, node: Node, arg_transform: Callable[[Node], Node]) -> Node:
        """Copy a node (from any graph) into this one, mapping its inputs with arg_transform."""
        new = self.create_node(node.op, node.target, map_arg(node.args, arg_transform),
                               map_arg(node.kwargs, arg_transform), name=node.name)
        new.meta = dict(node.meta)
        return new

    # -- queries ------------------------------------------------------------------------------------

    @property
    def placeholders(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "placeholder"]

    @property
    def output_node(self) -> Node:
        outputs = [n for n in self.nodes if n.op == "output"]
        if len(outputs) != 1:
            raise GraphError(f"a graph has exactly one output node, this one has {len(outputs)}")
        return outputs[0]

    def find_nodes(self, *, op: str, target=None) -> list[Node]:
        return [n for n in self.nodes if n.op == op and (target is None or n.target == target)]

    def eliminate_dead_code(self, is_impure: Callable[[Node], bool] = lambda n: False) -> bool:
        """Erase nodes whose values nobody reads (placeholders, output, side effects and is_impure nodes stay)."""
        erased = set()
        for node in reversed(self.nodes):
            kept = node.op in ("placeholder", "output") or has_side_effect(node) or is_impure(node)
            if not node.users and not kept:
                node._update_args((), {})  # its inputs lose this user, and may be dead in turn
                node.graph = None
                erased.add(node)
        if erased:  # NOTE: one pass over the list: erase_node's list.remove per node made this quadratic
            self.nodes = [n for n in self.nodes if n not in erased]
        return bool(erased)

    def lint(self, root=None) -> None:
        """Check the invariants; `root` (a Module) lets attribute and submodule targets be checked too."""
        seen: set = set()
        names: set = set()
        past_placeholders = False
        for node in self.nodes:
            if node.graph is not self:
                raise GraphError(f"node {node.name} does not belong to this graph")
            if node.name in names:
                raise GraphError(f"duplicate node name {node.name}")
            names.add(node.name)
            if node.op == "placeholder" and past_placeholders:
                raise GraphError(f"placeholder {node.name} comes after non-placeholder nodes")
            past_placeholders = past_placeholders or node.op != "placeholder"
            for arg in node.all_input_nodes:
                if arg not in seen:
                    raise GraphError(f"node {node.name} reads {arg.name}, which is not defined before it")
                if node not in arg.users:
                    raise GraphError(f"{arg.name}.users is missing {node.name}")
            for user in node.users:
                if user.graph is not self or node not in user.all_input_nodes:
                    raise GraphError(f"{node.name}.users lists {user.name}, which does not read it")
            if node.op in ("get_attr", "call_module", "call_method") and not isinstance(node.target, str):
                raise GraphError(f"{node.op} node {node.name} needs a string target, got {node.target!r}")
            if node.op == "call_function" and not callable(node.target):
                raise GraphError(f"call_function node {node.name} has a target that is not callable")
            if root is not None and node.op in ("get_attr", "call_module"):
                _check_target_exists(root, node)
            seen.add(node)
        if not self.nodes or self.nodes[-1].op != "output" or self.output_node is not self.nodes[-1]:
            raise GraphError("a graph must end with its single output node")

    def to_networkx(self):
        """A networkx DiGraph of the nodes (edges from producers to users), for analyses."""
        import networkx as nx

        g = nx.DiGraph()
        for node in self.nodes:
            g.add_node(node, op=node.op, target=target_name(node.target), meta=node.meta)
        for node in self.nodes:
            for arg in node.all_input_nodes:
                g.add_edge(arg, node)
        return g

    def __repr__(self) -> str:
        from .printer import format_graph

        return format_graph(self, "text")


# Python's spellings of an in-place write as call_function targets: x[i] = v, setattr, x += v and the rest.
INPLACE_FUNCTIONS = (operator.setitem, builtins.setattr, operator.iadd, operator.isub, operator.imul,
                     operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow, operator.iand,
                     operator.ior, operator.ixor, operator.imatmul)


def has_side_effect(node: Node) -> bool:
    """Writes whose result nobody reads but which must run: x[i] = v, x += v, in-place methods, functions called
    with inplace=True or out=, attribute assignment."""
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.endswith("__")
    if node.op != "call_function":
        return False
    return (node.target in INPLACE_FUNCTIONS or node.kwargs.get("inplace") is True
            or node.kwargs.get("out") is not None)


def attr_path(target: str) -> list[str]:
    """The attribute names along a dotted get_attr/call_module target; "" is the root module itself."""
    return target.split(".") if target else []


def fetch_attr(root, target: str):
    """The object a get_attr/call_module target names, starting from `root` ("" is root itself)."""
    obj = root
    for part in attr_path(target):
        obj = getattr(obj, part)
    return obj


def _check_target_exists(root, node: Node) -> None:
    obj = root
    for part in attr_path(node.target):
        if not hasattr(obj, part):
            raise GraphError(f"{node.op} node {node.name} refers to {node.target!r}, which the module does not have")
        obj = getattr(obj, part)


def _name_hint(op: str, target) -> str:
    if op == "output":
        return "output"
    if isinstance(target, str):
        return target.split(".")[-1] if op == "call_method" else target.replace(".", "_")
    name = target_name(target).split(".")[-1]
    return name.strip("_") or "fn"
