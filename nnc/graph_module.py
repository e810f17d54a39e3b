"""GraphModule: a runtime Module that runs a Graph through generated Python (`.code`), sharing the original's state."""
from __future__ import annotations

import builtins
import linecache
import operator
import re

import runtime
import runtime.nn.functional as F
from runtime import dtypes as dt
from runtime.nn import Module

from .graph import Graph, Node, attr_path, target_name
from .prims import prims

_INFIX = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
          operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
          operator.and_: "&", operator.or_: "|", operator.xor: "^", operator.eq: "==", operator.ne: "!=",
          operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">="}
_PREFIX = {operator.neg: "-", operator.invert: "~", operator.pos: "+"}
# The hook registries of a module call (forward and full backward hooks), as runtime's Module names them.
_CALL_HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
               "_forward_hooks_always_called", "_backward_pre_hooks", "_backward_hooks")
_BASE_GLOBALS = {"getattr": builtins.getattr, "setattr": builtins.setattr, "runtime": runtime, "F": F, "prims": prims,
                 "operator": operator, "builtins": builtins, "inf": float("inf"), "nan": float("nan")}


class PythonCode:
    """Generated source for a graph's forward, and the globals it needs."""

    def __init__(self, graph: Graph):
        self.globals = dict(_BASE_GLOBALS)
        self._names: dict[int, str] = {}
        params = ", ".join(["self"] + [self._placeholder(n) for n in graph.placeholders])
        body = [self._line(n) for n in graph.nodes if n.op != "placeholder"]
        self.src = f"def forward({params}):\n" + "\n".join(f"    {line}" for line in body if line) + "\n"

    def _placeholder(self, node: Node) -> str:
        if "default" not in node.meta:
            return node.name
        return f"{node.name}={self._value(node.meta['default'])}"

    def _line(self, node: Node) -> str:
        if node.op == "output":
            return f"return {self._value(node.args[0])}"
        return f"{node.name} = {self._expression(node)}"

    def _expression(self, node: Node) -> str:
        args = [self._value(a) for a in node.args]
        kwargs = [f"{k}={self._value(v)}" for k, v in node.kwargs.items()]
        if node.op == "get_attr":
            return _attribute_path("self", node.target)
        if node.op == "call_module":
            return f"{_attribute_path('self', node.target)}({', '.join(args + kwargs)})"
        if node.op == "call_method":
            return f"{args[0]}.{node.target}({', '.join(args[1:] + kwargs)})"
        target = node.target
        if not kwargs:
            if target in _INFIX and len(args) == 2:
                # NOTE: ** binds tighter than unary minus: (-2.0) ** x must not print as -2.0 ** x
                left = f"({args[0]})" if target is operator.pow and args[0].startswith("-") else args[0]
                return f"{left} {_INFIX[target]} {args[1]}"
            if target in _PREFIX and len(args) == 1:
                return f"{_PREFIX[target]}{args[0]}"
            if target is operator.getitem:
                return f"{args[0]}[{_index_text(self, node.args[1])}]"
            if target is builtins.getattr and len(args) == 2 and isinstance(node.args[1], str):
                return f"{args[0]}.{node.args[1]}"
        return f"{self._function(target)}({', '.join(args + kwargs)})"

    def _function(self, fn) -> str:
        """A name that refers to fn in the generated globals (its qualified name when that resolves)."""
        name = target_name(fn)
        resolved = _resolve(name, self.globals)
        if resolved is not None and (resolved is fn or resolved is getattr(fn, "__wrapped__", None)):
            return name
        key = id(fn)
        if key not in self._names:
            self._names[key] = re.sub(r"\W", "_", f"_fn_{len(self._names)}_{getattr(fn, '__name__', 'f')}")
            self.globals[self._names[key]] = fn
        return self._names[key]

    def _value(self, value) -> str:
        if isinstance(value, Node):
            return value.name
        if isinstance(value, tuple):
            inner = ", ".join(self._value(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if isinstance(value, list):
            return "[" + ", ".join(self._value(v) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k!r}: {self._value(v)}" for k, v in value.items()) + "}"
        if isinstance(value, slice):
            return f"slice({self._value(value.start)}, {self._value(value.stop)}, {self._value(value.step)})"
        if isinstance(value, dt.dtype):
            return repr(value)
        if value is Ellipsis:
            return "..."
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return "nan" if value != value else ("inf" if value > 0 else "-inf")
        if isinstance(value, (int, float, bool, str, type(None))):
            return repr(value)
        key = id(value)
        if key not in self._names:
            self._names[key] = f"_const_{len(self._names)}"
            self.globals[self._names[key]] = value
        return self._names[key]


def _index_text(code: PythonCode, key) -> str:
    if isinstance(key, tuple) and not key:
        return "()"
    items = key if isinstance(key, tuple) else (key,)
    parts = []
    for item in items:
        if isinstance(item, slice):
            parts.append(":".join("" if v is None else code._value(v) for v in (item.start, item.stop))
                         + ("" if item.step is None else f":{code._value(item.step)}"))
        elif item is Ellipsis:
            parts.append("...")
        else:
            parts.append(code._value(item))
    text = ", ".join(parts)
    return text + "," if isinstance(key, tuple) and len(key) == 1 else text


def _attribute_path(base: str, path: str) -> str:
    out = base
    for part in attr_path(path):
        out = f"{out}.{part}" if part.isidentifier() else f"getattr({out}, {part!r})"
    return out


def _resolve(dotted: str, namespace: dict):
    head, *rest = dotted.split(".")
    obj = namespace.get(head)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj


def share_state(module: Module, root: Module) -> None:
    """Make `module` a view of root's state: the same registries (not copies), hence the same state_dict.

    NOTE: sharing the dicts (rather than registering the same tensors again) keeps a buffer rebound in forward
    (`self.mean = ...`) visible through every view, as it is on the original module.
    """
    for name in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
        object.__setattr__(module, name, getattr(root, name))


class GraphModule(Module):
    """Runs `graph`; holds the traced module's children, parameters and buffers under the same names."""

    def __init__(self, root: Module, graph: Graph, class_name: str = "GraphModule"):
        super().__init__()
        share_state(self, root)
        for name, tensor in graph.meta.get("constants", {}).items():
            object.__setattr__(self, name, tensor)  # constants are not part of the state_dict, as in torch.fx
        # NOTE: the root's own hooks wrap the call of the whole graph, so the GraphModule shares (not copies) its
        # registries: hooks fire as on the original, and ones registered or removed later on either apply to both.
        for name in _CALL_HOOKS:
            object.__setattr__(self, name, getattr(root, name))
        self.training = root.training
        object.__setattr__(self, "_class_name", class_name)
        self.graph = graph

    @property
    def graph(self) -> Graph:
        return self.__dict__["_graph"]

    @graph.setter
    def graph(self, graph: Graph) -> None:
        self.__dict__["_graph"] = graph
        self.recompile()

    def invalidate(self) -> None:
        """Mark `.code` and the forward that runs it stale after the graph changed: they are generated again when next
        used. NOTE: passes edit a graph many times before anything runs it; generating the code after each edit
        took 0.3 s of a 2-layer GPT's 2 s compile from the disk cache."""
        self.__dict__["_code"] = None
        self.__dict__["_forward_fn"] = None

    def recompile(self) -> PythonCode:
        """Regenerate `.code` and the forward that runs it from the current graph."""
        code = PythonCode(self.graph)
        filename = f"<nnc-graph-{self._class_name}-{id(self):x}>"
        linecache.cache[filename] = (len(code.src), None, code.src.splitlines(True), filename)
        namespace = dict(code.globals)
        exec(compile(code.src, filename, "exec"), namespace)
        self.__dict__["_code"] = code.src
        self.__dict__["_forward_fn"] = namespace["forward"]
        return code

    @property
    def code(self) -> str:
        if self.__dict__["_code"] is None:
            self.recompile()
        return self.__dict__["_code"]

    def forward(self, *args, **kwargs):
        run = self.__dict__["_forward_fn"]
        if run is None:
            self.recompile()
            run = self.__dict__["_forward_fn"]
        return run(self, *args, **kwargs)

    def _get_name(self) -> str:
        return self._class_name
