"""Cleanup passes on decomposed graphs: no-op removal, common-subexpression and dead-code elimination, folding."""
from __future__ import annotations

from runtime.autograd import no_grad
from runtime.ops import Kind, ShapeError, broadcast_shapes
from runtime.tensor import Tensor

from ..graph import Node, map_arg
from ..prims import Prim
from ..symbolic import has_symbols


def is_pure_prim(node: Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, Prim) and "opaque_reason" not in node.meta


def draws_random(node: Node) -> bool:
    """A random_seed node: a new value on every run, so never merged with another or folded into a constant."""
    return node.op == "call_function" and isinstance(node.target, Prim) and node.target.op.draws_random


def _key(value):
    """A hashable identity for an argument structure (nodes by identity)."""
    if isinstance(value, Node):
        return ("node", id(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(_key(v) for v in value)
    if isinstance(value, dict):
        return ("dict",) + tuple(sorted((k, _key(v)) for k, v in value.items()))
    if isinstance(value, slice):
        return ("slice", _key(value.start), _key(value.stop), _key(value.step))
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return (type(value).__name__, value)


def _is_noop(node: Node) -> bool:
    """A primitive call that returns its input unchanged, by its op's no-op rule (OpDef.noop)."""
    if not is_pure_prim(node) or not node.args or not isinstance(node.args[0], Node):
        return False
    source = node.args[0]
    shapes = [tuple(n.meta["shape"]) if n.meta.get("shape") is not None else None for n in (source, node)]
    return node.target.op.is_noop(shapes[0], source.meta.get("dtype"), shapes[1], node.meta.get("dtype"), node.kwargs)


def remove_noops(gm):
    """Drop calls that return their input unchanged (reshapes and expands to the same shape, identity permutes,
    casts to the same dtype, reductions over no dims: OpDef.noop)."""
    for node in list(gm.graph.nodes):
        if _is_noop(node) and not _returns_a_new_view_of_an_input(node):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.invalidate()
    return gm


def fold_broadcasts(gm):
    """Let elementwise ops read the input of a broadcasting view (expand, OpDef.broadcasts) instead of its result:
    they broadcast their inputs themselves. An expand read only that way disappears, so fusion sees a reduction
    result read with broadcasting (a backward's expanded row sum) rather than a view kernel between two loops."""
    for node in list(gm.graph.nodes):
        if not (is_pure_prim(node) and node.target.op.broadcasts and node.args and isinstance(node.args[0], Node)):
            continue
        source = node.args[0]
        for user in list(node.users):
            if _reads_broadcast_alike(user, node, source):
                user.replace_input_with(node, source)
        if not node.users:
            gm.graph.erase_node(node)
    gm.invalidate()
    return gm


def _reads_broadcast_alike(user: Node, view: Node, source: Node) -> bool:
    """Whether the elementwise `user` computes the same value reading `source` where it reads the broadcast `view`:
    its result keeps its shape (another operand spans it) and the source's dtype is the view's."""
    if not is_pure_prim(user) or user.target.op.kind != Kind.ELEMENTWISE or "shape" not in user.meta:
        return False
    if source.meta.get("shape") is None or source.meta.get("dtype") != view.meta.get("dtype"):
        return False
    shapes = [tuple((source if a is view else a).meta.get("shape") or ()) for a in user.all_input_nodes]
    if any(a.meta.get("shape") is None for a in user.all_input_nodes):
        return False
    try:
        return tuple(broadcast_shapes(*shapes)) == tuple(user.meta["shape"])
    except ShapeError:
        return False


def _returns_a_new_view_of_an_input(node: Node) -> bool:
    """A view of an input or parameter that is a graph output: eager returns a new tensor there, never the
    parameter itself, so the node stays (it runs as a numpy view)."""
    return (node.target.op.is_view and node.args[0].op in ("placeholder", "get_attr")
            and any(user.op == "output" for user in node.users))


def cse(gm):
    """Merge primitive nodes that compute the same op on the same inputs (never two random seeds)."""
    seen: dict = {}
    for node in list(gm.graph.nodes):
        if not is_pure_prim(node) or draws_random(node):
            continue
        key = (node.target.op.name, _key(node.args), _key(node.kwargs))
        first = seen.get(key)
        if first is None:
            seen[key] = node
        else:
            node.replace_all_uses_with(first)
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code(is_impure=lambda n: "opaque_reason" in n.meta)  # opaque calls may write state
    gm.invalidate()
    return gm


def dce(gm):
    """Erase nodes nobody reads (side-effecting and opaque nodes stay)."""
    gm.graph.eliminate_dead_code(is_impure=lambda n: "opaque_reason" in n.meta)
    gm.invalidate()
    return gm


def _foldable(node: Node, constants: set) -> bool:
    """A pure primitive whose tensor inputs are all constants (not parameters or buffers, which change)."""
    if not is_pure_prim(node) or draws_random(node) or has_symbols((node.args, node.kwargs, node.meta.get("shape"))):
        return False  # (a value of symbolic size differs from call to call)
    inputs = node.all_input_nodes
    return all(n in constants for n in inputs)


def fold_constants(gm):
    """Evaluate primitives whose inputs are all constants once, at compile time."""
    graph = gm.graph
    constant_attrs = set(graph.meta.get("constants", {}))
    constants = {n for n in graph.nodes if n.op == "get_attr" and n.target in constant_attrs}
    values = {n: getattr(gm, n.target) for n in constants}
    folded = 0
    for node in list(graph.nodes):
        if not _foldable(node, constants):
            continue
        with no_grad():
            result = node.target(*map_arg(node.args, values.__getitem__), **map_arg(node.kwargs, values.__getitem__))
        if not isinstance(result, Tensor):
            continue
        name = f"_folded_constant{folded}"
        folded += 1
        object.__setattr__(gm, name, result)
        graph.meta.setdefault("constants", {})[name] = result
        with graph.inserting_before(node):
            replacement = graph.get_attr(name)
        replacement.meta.update(shape=tuple(result.shape), dtype=result.dtype, folded_from=node.name)
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        constants.add(replacement)
        values[replacement] = result
    graph.eliminate_dead_code(is_impure=lambda n: "opaque_reason" in n.meta)
    gm.invalidate()
    return gm
