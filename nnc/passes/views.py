"""Folded views: chains of view nodes (reshape, permute, expand, basic getitem) as strided maps of a stored base.

A view node whose chain of views reaches a base value (a kernel's output, a graph input or a parameter, all read as
C-contiguous arrays) is the map (offset, shape, element strides) of that base: element i of the view is
base.flat[offset + sum(i_k * strides_k)], with stride 0 along broadcast dims. Fusion folds such a view into the
kernels that read it (`fold_views`): they take the base as their argument and index it with the map, so the view
never runs as a step of its own. Maps are worked out at compile time by applying the ops' numpy forwards to a
zero-copy `as_strided` stand-in of the base (no data is read); a reshape that numpy could only do with a copy (a
reshape of a permuted value), negative strides, symbolic sizes and getitem with index tensors have no map, and
such a view keeps running as a step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.ops import Kind, decode_key

from ..graph import Graph, Node
from ..prims import Prim, prims
from ..symbolic import has_symbols

# What a folded view's readers may be: the kernel kinds whose code generation indexes a strided map of an input,
# and those that read a contiguous run of a base at an offset (a reshape, a leading slice).
FOLDING_KINDS = ("elementwise", "reduction", "row", "matmul", "cat", "take")
CONTIGUOUS_FOLDING_KINDS = ("gather",)


@dataclass(frozen=True)
class ViewMap:
    """A view of `base`: element (i_0, ..., i_n) of a `shape` value is base.flat[offset + sum(i_k * strides[k])]."""

    base: Node
    offset: int
    shape: tuple
    strides: tuple  # element strides (0 along broadcast dims, never negative)

    @property
    def contiguous(self) -> bool:
        """Whether the view is the C-contiguous run base.flat[offset:offset + size] (a reshape, a leading slice)."""
        return tuple(self.strides) == _c_strides(self.shape, self.strides)

    def apply(self, array: np.ndarray) -> np.ndarray:
        """The view as a numpy array over `array` (the base's value, read in C order); read-only where it repeats
        elements (stride 0, as numpy's broadcast_to)."""
        flat = np.ascontiguousarray(array).reshape(-1)
        if 0 in self.shape:
            return np.empty(self.shape, flat.dtype)
        repeats = any(s == 0 and n > 1 for s, n in zip(self.strides, self.shape))
        return np.lib.stride_tricks.as_strided(flat[self.offset:], self.shape,
                                               tuple(s * flat.itemsize for s in self.strides), writeable=not repeats)


def _c_strides(shape, strides=None) -> tuple:
    """C-contiguous element strides of `shape`; size-1 dims take the given stride (any stride fits them)."""
    out, step = [0] * len(shape), 1
    for k in reversed(range(len(shape))):
        out[k] = strides[k] if strides is not None and shape[k] == 1 else step
        step *= shape[k]
    return tuple(out)


def is_view_node(node: Node) -> bool:
    """A prims.* view of one tensor: reshape, permute, expand, or getitem with no index tensors."""
    if node.op != "call_function" or not isinstance(node.target, Prim):
        return False
    op = node.target.op
    if op.kind != Kind.SHAPE or not op.is_view or not node.args or not isinstance(node.args[0], Node):
        return False
    return len(node.all_input_nodes) == 1 and op.name in _MAPPERS


def view_maps(graph: Graph) -> dict:
    """{view node: ViewMap} for every view node of the graph that has a map (see the module docstring)."""
    maps: dict[Node, ViewMap] = {}
    for node in graph.nodes:
        if is_view_node(node):
            found = _map_of(node, maps)
            if found is not None:
                maps[node] = found
    return maps


def _map_of(node: Node, maps: dict) -> ViewMap | None:
    source = node.args[0]
    shape, dtype = node.meta.get("shape"), node.meta.get("dtype")
    if shape is None or dtype is None or has_symbols((shape, node.args, node.kwargs)):
        return None
    if source in maps:
        outer = maps[source]
    elif is_view_node(source):
        return None  # a view of a view with no map (a copying reshape) is a copy itself: not foldable
    else:
        base_shape = source.meta.get("shape")
        if base_shape is None or has_symbols(base_shape):
            return None
        base_shape = tuple(int(d) for d in base_shape)
        outer = ViewMap(source, 0, base_shape, _c_strides(base_shape))
    stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), outer.shape, outer.strides)
    try:
        result = _MAPPERS[node.target.op.name](stand_in, node)
    except (ValueError, TypeError, IndexError):
        return None  # e.g. a reshape numpy can only do with a copy
    if tuple(result.shape) != tuple(int(d) for d in shape) or any(s < 0 for s in result.strides):
        return None
    moved = result.__array_interface__["data"][0] - stand_in.__array_interface__["data"][0]
    return ViewMap(outer.base, outer.offset + moved, tuple(result.shape), tuple(int(s) for s in result.strides))


def _reshape(a, node):
    return np.reshape(a, tuple(int(d) for d in node.meta["shape"]), copy=False)


def _permute(a, node):
    return np.transpose(a, tuple(int(d) for d in node.kwargs["dims"]))


def _expand(a, node):
    return np.broadcast_to(a, tuple(int(d) for d in node.meta["shape"]))


def _getitem(a, node):
    index = decode_key(node.kwargs["key"], ())
    out = a[index]
    return out if isinstance(out, np.ndarray) else a[index + (Ellipsis,)]


# How each view op moves a stand-in array (numpy's own view rules; none of them reads the data).
_MAPPERS = {"reshape": _reshape, "permute": _permute, "expand": _expand, "getitem": _getitem}


def fold_views(graph: Graph, kind_of) -> dict:
    """{view node: ViewMap} for the view nodes to fold: each has a map, is not a graph output, and every reader is
    a view with a map (folded, or a step that makes itself from the base) or a node of a kernel whose kind
    (`kind_of(node)`) indexes strided inputs (FOLDING_KINDS). Views read by anything else (an opaque node, a
    convolution) keep running as steps, and so do the views they read when those have no map."""
    maps = view_maps(graph)
    outputs = set(graph.output_node.all_input_nodes)
    folded: dict[Node, ViewMap] = {}
    for node in reversed(list(graph.nodes)):
        if node not in maps or node in outputs or not node.users:
            continue
        if all(u in maps or (u.op != "output" and not is_view_node(u) and _folds_into(kind_of(u), maps[node]))
               for u in node.users):
            folded[node] = maps[node]
    return folded


def _folds_into(kind: str, view: ViewMap) -> bool:
    return kind in FOLDING_KINDS or kind in CONTIGUOUS_FOLDING_KINDS and view.contiguous


def why_not_folded(node: Node, graph: Graph, folded: dict) -> str:
    """Why a view node runs as a step of its own (it is not in `folded`)."""
    if node in set(graph.output_node.all_input_nodes):
        return "it is a graph output (returned as a numpy view)"
    if not view_maps_one(node):
        return "its chain of views is not one strided map of a stored value (a copying reshape, or symbolic sizes)"
    if not node.users:
        return "its result is never read"
    readers = [u.name for u in node.users if u not in folded]
    return (f"it is read by {', '.join(readers)}, which cannot index a strided input (an opaque node or a view "
            f"with no map)")


def view_maps_one(node: Node) -> bool:
    """Whether a view node has a map (its chain of views is strided over a stored base)."""
    maps: dict = {}
    chain = []
    n = node
    while is_view_node(n):
        chain.append(n)
        n = n.args[0]
    for v in reversed(chain):
        found = _map_of(v, maps)
        if found is None:
            return False
        maps[v] = found
    return True


def copy_strided_reshapes(gm):
    """A reshape numpy could only do with a copy (of a permuted view) reads a `clone` of its source instead: the
    clone is an elementwise kernel reading the view strided and writing it C-contiguous, and the reshape of that is
    a view folded like any other. So the copy is a kernel, never a step of its own."""
    graph = gm.graph
    maps = view_maps(graph)
    for node in list(graph.nodes):
        if is_view_node(node) and node.target.op.name == "reshape" and node not in maps and node.args[0] in maps:
            source = node.args[0]
            with graph.inserting_before(node):
                copy = graph.call_function(prims.clone, (source,))
            copy.meta.update(shape=source.meta["shape"], dtype=source.meta["dtype"])
            node.replace_input_with(source, copy)
    gm.invalidate()
    return gm
