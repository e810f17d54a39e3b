"""Slice hoisting: a basic slice of a computed value moves above the ops that compute it, so they compute only the
slice (a GPT that returns the last position's logits computes its head, final LayerNorm and last MLP for one row).

A node X moves below its slice when every user of X is a basic getitem (slices and integers) taking the same
elements, and X's op computes each element of that slice from a matching slice of its inputs:
  - an elementwise op (broadcasting operands take the slice on their non-broadcast dims only);
  - a reduction over dims the slice keeps whole (sum, amax, ...: attrs dims and keepdim);
  - linear, and matmul, when the slice keeps the output columns whole (the rows' slice goes to the first operand,
    batch dims to both);
  - permute (the slice is permuted), a reshape that keeps the sliced leading dims (the dims after them whole),
    and a basic getitem (the two slices compose into one).
X is then recomputed on the sliced inputs and the users read it (an integer index becomes a length-1 slice and a
reshape). Each step computes no more than before, and X has no other user, so nothing is computed twice. Ops that
draw random numbers or read their element's index (Philox draws) never move: their values depend on the position.
"""
from __future__ import annotations

from runtime.ops import Kind

from ..graph import Node
from ..prims import prims
from ..symbolic import has_symbols
from .simplify import draws_random, is_pure_prim

_REDUCTION_ATTRS = ("dims", "keepdim")


def hoist_slices(gm):
    """Move basic slices above the ops computing what they slice, as far as the rules above allow."""
    graph = gm.graph
    for node in reversed(list(graph.nodes)):  # users first: a slice moved above a node meets that node's inputs
        if node.graph is graph and node.users:
            _hoist_through(graph, node)
    gm.invalidate()
    return gm


def _hoist_through(graph, node: Node) -> bool:
    """Recompute `node` on sliced inputs when all its users slice it alike; whether it did."""
    key = _common_slice(node)
    if key is None or not _movable(node):
        return False
    inputs = _sliced_inputs(node, key)
    if inputs is None:
        return False
    with graph.inserting_before(node):
        if node.target.op.name == "getitem":  # a slice of a slice: one slice of its source
            (source, source_key), = inputs.items()
            replacement = _slice_of(graph, source, source_key)
        else:
            shape = tuple(len(r) for r in key)
            args = tuple(_slice_of(graph, a, inputs[a]) if isinstance(a, Node) else a for a in node.args)
            kwargs = dict(node.kwargs, shape=shape) if node.target.op.name == "reshape" else dict(node.kwargs)
            replacement = graph.call_function(node.target, args, kwargs)
            replacement.meta.update(node.meta)
            replacement.meta["shape"] = shape
    for user in list(node.users):
        if tuple(user.meta["shape"]) == tuple(replacement.meta["shape"]):
            user.replace_all_uses_with(replacement)
        else:  # an integer index: its length-1 dim goes
            with graph.inserting_before(user):
                squeezed = graph.call_function(prims.reshape, (replacement,), {"shape": tuple(user.meta["shape"])})
            squeezed.meta.update(user.meta)
            user.replace_all_uses_with(squeezed)
        graph.erase_node(user)
    graph.erase_node(node)
    return True


def _slice_of(graph, source: Node, key: tuple) -> Node:
    """`source` sliced by `key` (ranges, one per dim): the source itself when the key takes it whole."""
    shape = tuple(source.meta["shape"])
    if all(r == range(n) for r, n in zip(key, shape)):
        return source
    encoded = tuple(("slice", r.start, r.stop, r.step) for r in key)
    # NOTE: two operands reading one input get a slice each (cse merges them after this pass)
    node = graph.call_function(prims.getitem, (source,), {"key": encoded})
    node.meta.update(shape=tuple(len(r) for r in key), dtype=source.meta["dtype"])
    for name in ("module_path", "source", "source_line"):
        if name in source.meta:
            node.meta[name] = source.meta[name]
    return node


def _is_getitem(node: Node) -> bool:
    return is_pure_prim(node) and node.target.op.name == "getitem"


def _movable(node: Node) -> bool:
    """A pure primitive of static shape whose elements do not depend on their position."""
    if not is_pure_prim(node) or draws_random(node) or getattr(node.target.op, "needs_index", False):
        return False
    if node.target.op.name == "getitem" and len(node.args) != 1:
        return False
    shapes = [node.meta.get("shape")] + [a.meta.get("shape") for a in node.all_input_nodes]
    return all(s is not None for s in shapes) and not has_symbols(shapes)


def basic_ranges(key, shape) -> tuple | None:
    """The elements a basic getitem key (slices and integers, positive steps) takes, as one range per dim of
    `shape` (an integer as a length-1 range); None for any other key or an integer out of bounds."""
    if key is None or len(key) > len(shape):
        return None
    ranges = []
    for item, n in zip(key, shape):
        if item[0] == "slice":
            step = 1 if item[3] is None else item[3]
            if not isinstance(step, int) or step <= 0 or not all(v is None or isinstance(v, int) for v in item[1:3]):
                return None
            ranges.append(range(*slice(item[1], item[2], step).indices(n)))
        elif item[0] == "int" and isinstance(item[1], int) and -n <= item[1] < n:
            i = item[1] % n
            ranges.append(range(i, i + 1))
        else:
            return None
    return tuple(ranges) + tuple(range(n) for n in shape[len(key):])


def _common_slice(node: Node) -> tuple | None:
    """The ranges every user of `node` takes, when all are basic getitems taking the same, not all of it."""
    shape = node.meta.get("shape")
    if shape is None or has_symbols(shape):
        return None
    key = None
    for user in node.users:
        if not _is_getitem(user) or len(user.args) != 1 or user.args[0] is not node:
            return None
        ranges = basic_ranges(user.kwargs.get("key"), shape)
        if ranges is None or (key is not None and ranges != key):
            return None
        key = ranges
    if key is None or all(r == range(n) for r, n in zip(key, shape)):
        return None
    return key


def _sliced_inputs(node: Node, key: tuple) -> dict | None:
    """{input node: the ranges of it the sliced node reads}, or None when the op cannot take the slice."""
    op = node.target.op
    inputs = node.all_input_nodes
    if op.kind == Kind.ELEMENTWISE:
        return _elementwise_inputs(node, key)
    if op.kind == Kind.REDUCTION and tuple(op.attr_names) == _REDUCTION_ATTRS:
        return _reduction_inputs(node, key)
    if op.name == "linear" and len(inputs) == 2 and tuple(node.args) == tuple(inputs):
        return _linear_inputs(node, key)
    if op.name == "matmul" and len(node.args) == 2:
        return _matmul_inputs(node, key)
    if op.name == "permute":
        dims = [d % len(key) for d in node.kwargs["dims"]]
        source = [None] * len(key)
        for i, d in enumerate(dims):
            source[d] = key[i]
        return {inputs[0]: tuple(source)}
    if op.name == "reshape":
        return _reshape_inputs(node, key)
    if op.name == "getitem":
        return _getitem_inputs(node, key)
    return None


def _whole(r: range, n: int) -> bool:
    return r == range(n)


def _broadcast_key(key: tuple, shape, operand_shape) -> tuple:
    """The ranges of a broadcasting operand (right-aligned to `shape`) the sliced result reads."""
    shape, operand_shape = tuple(shape), tuple(operand_shape)
    lead = len(shape) - len(operand_shape)
    return tuple(range(m) if m != shape[lead + d] else key[lead + d] for d, m in enumerate(operand_shape))


def _elementwise_inputs(node: Node, key: tuple) -> dict | None:
    """Each operand's slice; None when a sliced dim is nobody's own (every operand broadcasts along it)."""
    shape = tuple(node.meta["shape"])
    operands = {a: tuple(a.meta["shape"]) for a in node.all_input_nodes}
    for d, (r, n) in enumerate(zip(key, shape)):
        spanned = any(len(s) >= len(shape) - d and s[d - len(shape) + len(s)] == n for s in operands.values())
        if not (_whole(r, n) or spanned):
            return None
    return {a: _broadcast_key(key, shape, s) for a, s in operands.items()}


def _reduction_inputs(node: Node, key: tuple) -> dict | None:
    source = node.args[0]
    in_shape = tuple(source.meta["shape"])
    dims = {d % len(in_shape) for d in node.kwargs["dims"]}
    keep = node.kwargs.get("keepdim", False)
    out_dims = [d for d in range(len(in_shape)) if d not in dims] if not keep else list(range(len(in_shape)))
    source_key = [range(n) for n in in_shape]
    for r, d in zip(key, out_dims):
        if d in dims:
            if not _whole(r, 1):
                return None
        else:
            source_key[d] = r
    return {source: tuple(source_key)}


def _linear_inputs(node: Node, key: tuple) -> dict | None:
    a, w = node.args
    if not _whole(key[-1], node.meta["shape"][-1]):
        return None
    a_shape = tuple(a.meta["shape"])
    return {a: tuple(key[:-1]) + (range(a_shape[-1]),), w: tuple(range(n) for n in w.meta["shape"])}


def _matmul_inputs(node: Node, key: tuple) -> dict | None:
    a, b = node.args
    out_shape = tuple(node.meta["shape"])
    a_shape, b_shape = tuple(a.meta["shape"]), tuple(b.meta["shape"])
    if len(a_shape) < 2 or len(b_shape) < 2 or not _whole(key[-1], out_shape[-1]) or a is b:
        return None
    batch_key, batch_shape = key[:-2], out_shape[:-2]
    a_key = _broadcast_key(batch_key, batch_shape, a_shape[:-2]) + (key[-2], range(a_shape[-1]))
    b_key = _broadcast_key(batch_key, batch_shape, b_shape[:-2]) + (range(b_shape[-2]), range(b_shape[-1]))
    return {a: a_key, b: b_key}


def _reshape_inputs(node: Node, key: tuple) -> dict | None:
    """A reshape keeping its leading dims: the slice of those dims, when it takes every later dim whole."""
    source = node.args[0]
    in_shape, out_shape = tuple(source.meta["shape"]), tuple(node.meta["shape"])
    prefix = 0
    while prefix < min(len(in_shape), len(out_shape)) and in_shape[prefix] == out_shape[prefix]:
        prefix += 1
    if not all(_whole(r, n) for r, n in zip(key[prefix:], out_shape[prefix:])):
        return None
    return {source: tuple(key[:prefix]) + tuple(range(n) for n in in_shape[prefix:])}


def _getitem_inputs(node: Node, key: tuple) -> dict | None:
    """A basic slice of a basic slice: one slice of the source (an integer index of the inner key stays)."""
    source = node.args[0]
    in_shape = tuple(source.meta["shape"])
    inner = node.kwargs.get("key")
    if basic_ranges(inner, in_shape) is None:
        return None
    inner = tuple(inner) + (("slice", None, None, None),) * (len(in_shape) - len(inner))
    composed, k = [], 0
    for item, n in zip(inner, in_shape):
        if item[0] == "int":
            return None  # a dim an integer removed: the composed key is not a plain slice
        outer = range(*slice(item[1], item[2], 1 if item[3] is None else item[3]).indices(n))
        composed.append(outer[key[k].start:key[k].stop:key[k].step])
        k += 1
    return {source: tuple(composed)}

