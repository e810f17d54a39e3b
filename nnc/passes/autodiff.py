"""autodiff: derive the backward graph of a decomposed forward graph from the op table's derivative rules.

The rules are the ones eager autograd runs; here they are evaluated on MetaValues, so they build nodes of a
new graph. Save-or-recompute rule: a forward value a rule reads is recomputed in the backward graph when it
is an elementwise primitive whose own inputs are already available there (forward inputs, parameters,
constants, or values already saved); otherwise it is saved by the forward. Inputs a rule only needs the
shape of are never saved.
"""
from __future__ import annotations

from runtime.nn import Module
from runtime.ops import Kind

from ..graph import Node, nodes_in
from ..graph_module import GraphModule
from ..prims import Prim
from .decompose import MetaValue, _Builder


class AutodiffError(RuntimeError):
    """The forward graph has a node the pass cannot differentiate (an opaque call)."""


class _NeedsValue(Exception):
    """A rule read a value through a shape-only stand-in: the value must be saved after all."""


class _ShapeStandIn:
    """What a rule gets for an input it declared it does not read: shape, dtype and ndim only."""

    __slots__ = ("shape", "dtype")

    def __init__(self, node: Node):
        self.shape, self.dtype = tuple(node.meta["shape"]), node.meta["dtype"]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getattr__(self, name):
        raise _NeedsValue(name)

    @staticmethod
    def _apply_op(op, inputs, attrs):
        raise _NeedsValue(op.name)


class BackwardGraph:
    """The backward GraphModule plus how to feed it: which forward values it takes, in order."""

    def __init__(self, gm: GraphModule, saved: list[Node], grad_outputs: list[Node], wrt: list[Node],
                 recomputed: list[str]):
        self.gm = gm
        self.saved = saved            # forward nodes whose values become the backward's leading placeholders
        self.grad_outputs = grad_outputs  # forward output nodes whose gradients follow
        self.wrt = wrt                # forward nodes the backward returns gradients for, in order
        self.recomputed = recomputed  # forward node names recomputed in the backward instead of saved


class _Differentiator:
    def __init__(self, forward: GraphModule, wrt: list[Node]):
        self.forward = forward
        self.builder = _Builder(None)
        self.values: dict[Node, MetaValue] = {}
        self.saved: list[Node] = []
        self.recomputed: list[str] = []
        self.requires = _requires_grad(forward.graph, set(wrt))

    def value(self, node: Node) -> MetaValue:
        """The forward value of `node` inside the backward graph: recomputed or saved."""
        found = self.values.get(node)
        if found is None:
            found = self._recompute(node)
            if found is None:
                found = self._save(node)
            self.values[node] = found
        return found

    def _recompute(self, node: Node):
        if not (node.op == "call_function" and isinstance(node.target, Prim)
                and node.target.op.kind == Kind.ELEMENTWISE and "opaque_reason" not in node.meta):
            return None
        inputs = node.all_input_nodes
        if not all(n in self.values or n.op in ("placeholder", "get_attr") for n in inputs):
            return None
        args = tuple(self.value(a) if isinstance(a, Node) else a for a in node.args)
        result = node.target(*args, **node.kwargs)
        self.recomputed.append(node.name)
        return result

    def _save(self, node: Node) -> MetaValue:
        placeholder = self.builder.node("placeholder", f"saved_{node.name}", name=f"saved_{node.name}",
                                        shape=node.meta["shape"], dtype=node.meta["dtype"])
        self.saved.append(node)
        return MetaValue(placeholder, self.builder)

    def input_gradients(self, node: Node, grad: MetaValue) -> list:
        """[(input node, gradient)] for the differentiable inputs of one primitive node."""
        op = node.target.op
        results = []
        for i, arg in enumerate(node.args):
            if not (isinstance(arg, Node) and arg in self.requires and op.vjp_rule(i) is not None):
                continue
            gi = self._apply_rule(node, i, grad)
            if gi is not None:
                results.append((arg, _fit(gi, arg)))
        return results

    def _apply_rule(self, node: Node, i: int, grad: MetaValue):
        op = node.target.op
        rule = op.vjp_rule(i)
        try:
            return rule(grad, self._out_for(node, lazy=True), *self._inputs_for(node, lazy=True), **node.kwargs)
        except _NeedsValue:
            return rule(grad, self.value(node), *self._inputs_for(node, lazy=False), **node.kwargs)

    def _out_for(self, node: Node, lazy: bool):
        return self.value(node) if ("out" in node.target.op.saves or not lazy) else _ShapeStandIn(node)

    def _inputs_for(self, node: Node, lazy: bool):
        saves = node.target.op.saves
        values = []
        for i, arg in enumerate(node.args):
            if not isinstance(arg, Node):
                values.append(arg)
            elif lazy and i not in saves:
                values.append(_ShapeStandIn(arg))
            else:
                values.append(self.value(arg))
        return values


def _requires_grad(graph, wrt: set) -> set:
    """Forward nodes whose value depends on a node in `wrt` through differentiable, floating ops."""
    requires = set()
    for node in graph.nodes:
        if node in wrt:
            requires.add(node)
        elif node.op == "call_function" and isinstance(node.target, Prim) and node.target.op.differentiable \
                and node.meta.get("dtype") is not None and node.meta["dtype"].is_floating_point \
                and any(n in requires for n in node.all_input_nodes):
            requires.add(node)
        elif node.op in ("call_function", "call_method", "call_module") and "opaque_reason" in node.meta \
                and any(n in requires for n in node.all_input_nodes):
            raise AutodiffError(f"node {node.name} ({node.meta['opaque_reason']}) cannot be differentiated "
                                f"symbolically")
    return requires


def _fit(grad: MetaValue, node: Node) -> MetaValue:
    """Sum a gradient over broadcast dims and cast it to the input's dtype (as eager autograd does)."""
    shape, dtype = tuple(node.meta["shape"]), node.meta["dtype"]
    if tuple(grad.shape) != shape:
        grad = grad.sum_to_size(shape)
    if grad.dtype is not dtype:
        grad = grad.to(dtype)
    return grad


def build_backward(forward: GraphModule, wrt: list[Node]) -> BackwardGraph:
    """The backward of `forward` (a decomposed GraphModule with shape meta) for the nodes in `wrt`."""
    diff = _Differentiator(forward, wrt)
    builder = diff.builder
    previous, _Builder.current = _Builder.current, builder
    try:
        outputs = [n for n in nodes_in(forward.graph.output_node.args[0]) if n in diff.requires]
        grads: dict[Node, MetaValue] = {}
        for out in outputs:
            placeholder = builder.node("placeholder", f"grad_{out.name}", name=f"grad_{out.name}",
                                       shape=out.meta["shape"], dtype=out.meta["dtype"])
            grads[out] = MetaValue(placeholder, builder)
        for node in reversed(forward.graph.nodes):
            grad = grads.get(node)
            if grad is None or node.op != "call_function" or node in wrt and node.op == "placeholder":
                continue
            builder.origin = node
            for arg, gi in diff.input_gradients(node, grad):
                grads[arg] = gi if arg not in grads else grads[arg] + gi
        builder.origin = None
        results = tuple(builder.graph_arg(grads[n]) if n in grads else None for n in wrt)
        builder.node("output", "output", (results,))
    finally:
        _Builder.current = previous
    _move_placeholders_first(builder.graph)
    gm = GraphModule(Module(), builder.graph, class_name="Backward")
    gm.graph.eliminate_dead_code()
    gm.recompile()
    gm.graph.lint(gm)
    return BackwardGraph(gm, diff.saved, outputs, list(wrt), diff.recomputed)


def _move_placeholders_first(graph) -> None:
    """Saved-value placeholders appear while rules run; a graph lists its placeholders first."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    grads = [n for n in placeholders if n.name.startswith("grad_")]
    saved = [n for n in placeholders if not n.name.startswith("grad_")]
    rest = [n for n in graph.nodes if n.op != "placeholder"]
    graph.nodes[:] = saved + grads + rest
