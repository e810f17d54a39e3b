"""Interpreter: runs a Graph node by node (the executable specification, the oracle for every backend)."""
from __future__ import annotations

from .graph import Graph, Node, fetch_attr, map_arg


class Interpreter:
    """Execute a graph with the module that owns its attributes; subclass the per-opcode methods to change it."""

    def __init__(self, module, graph: Graph | None = None):
        self.module = module
        self.graph = graph if graph is not None else module.graph
        self.env: dict[Node, object] = {}

    def run(self, *args, **kwargs):
        self.env = {}
        self._args = iter(args)
        self._kwargs = kwargs
        for node in self.graph.nodes:
            self.env[node] = self.run_node(node)
            if node.op == "output":
                return self.env[node]
        raise RuntimeError("the graph has no output node")

    def run_node(self, node: Node):
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        return getattr(self, node.op)(node.target, args, kwargs)

    def fetch_args_kwargs_from_env(self, node: Node):
        lookup = self.env.__getitem__
        return map_arg(node.args, lookup), map_arg(node.kwargs, lookup)

    def fetch_attr(self, target: str):
        return fetch_attr(self.module, target)

    # -- one method per opcode ------------------------------------------------------------------------

    def placeholder(self, target, args, kwargs):
        if target in self._kwargs:
            return self._kwargs[target]
        try:
            return next(self._args)
        except StopIteration:
            node = next(n for n in self.graph.placeholders if n.target == target)
            if "default" in node.meta:
                return node.meta["default"]
            raise TypeError(f"forward() missing required argument {target!r}") from None

    def get_attr(self, target, args, kwargs):
        return self.fetch_attr(target)

    def call_function(self, target, args, kwargs):
        return target(*args, **kwargs)

    def call_method(self, target, args, kwargs):
        self_obj, *rest = args
        return getattr(self_obj, target)(*rest, **kwargs)

    def call_module(self, target, args, kwargs):
        return self.fetch_attr(target)(*args, **kwargs)

    def output(self, target, args, kwargs):
        return args[0]
