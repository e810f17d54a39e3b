"""Memory planning: give the kernels' intermediate results buffers, reusing a buffer once its last value is dead.

`plan_memory(kernels, graph) -> MemoryPlan` (kernels in execution order, as `fuse` returns them).

Which values get a buffer ("planned"): every kernel output that is a single tensor, is not a graph output, and is
not a view. Not planned, each with its reason in `MemoryPlan.unplanned`:
  - graph outputs (and any value a graph output is a view of): they escape to the caller, so they get their own
    fresh allocation;
  - outputs of opaque view kernels (reshape, permute, expand, getitem, ...: `OpDef.is_view`): they alias their
    base. A view of a graph input needs nothing; a view of a planned value is recorded in `aliases` and keeps its
    base's buffer alive until the view's own last use;
  - values that are not one tensor (a tuple from an opaque call, a Python number);
  - results of opaque calls that are not primitives, which run as Python code and may return one of their inputs:
    they keep their inputs' buffers alive until their own last use, and make them escape when they do.

Lifetimes are in kernel indices: a value is defined by the kernel that writes it and last used by the last kernel
that reads it (or reads a view of it, or writes a slice of it: a cat whose pieces' producers store into it,
`Kernel.meta["writes_into"]`); a value nobody reads lives only during its own kernel. Two values share a
buffer only if the earlier one's last use is strictly before the later one's definition (a kernel never writes an
output into memory one of its inputs or other outputs occupies).

Size policy: a buffer is a raw byte arena; a value may reuse any free buffer *at least as large* as it (best fit:
the smallest such, an exact size first), and is placed at offset 0 as `arena[:nbytes].view(dtype).reshape(shape)`.
Buffers never grow, so a buffer's size is that of the value that created it (its `shape`/`dtype` are that value's).
Totals: `bytes_without_reuse` (one buffer per planned value) and `bytes_with_reuse` (sum of buffer sizes).

The executor's view: `buffer_of[node]` is the buffer index of each planned kernel output; `buffers[i]` has
`nbytes`, `shape`, `dtype`; `allocate()` makes the arenas and `view(arenas, node)` the array a kernel writes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from runtime._aligned import aligned_empty

from ..graph import Graph, Node
from ..kernel import Kernel
from ..symbolic import evaluate, hint_int, provably
from .fusion import op_of


@dataclass
class Buffer:
    """One arena: `nbytes` long; `shape`/`dtype` of the value that created it; `values` placed in it, in order."""

    index: int
    nbytes: int
    shape: tuple
    dtype: object
    values: list = field(default_factory=list)


@dataclass
class Slot:
    """A planned value: the node, its buffer, its layout and its lifetime (kernel indices, inclusive)."""

    node: Node
    buffer: int
    shape: tuple
    dtype: object
    nbytes: int
    defined: int
    last_use: int


@dataclass
class MemoryPlan:
    buffers: list[Buffer]
    slots: dict  # Node -> Slot, for every planned value
    aliases: dict  # view Node -> the planned Node whose buffer it looks into
    unplanned: dict  # Node -> why it has no planned buffer
    bytes_without_reuse: int
    bytes_with_reuse: int

    @property
    def buffer_of(self) -> dict:
        """Node -> buffer index, for every planned kernel output."""
        return {node: slot.buffer for node, slot in self.slots.items()}

    def bind(self, sizes: dict) -> "MemoryPlan":
        """This plan with symbolic sizes (nnc.symbolic) evaluated for one call's sizes."""
        buffers = [replace(b, nbytes=evaluate(b.nbytes, sizes), shape=evaluate(b.shape, sizes)) for b in self.buffers]
        slots = {node: replace(slot, shape=evaluate(slot.shape, sizes), nbytes=evaluate(slot.nbytes, sizes))
                 for node, slot in self.slots.items()}
        return replace(self, buffers=buffers, slots=slots)

    def allocate(self) -> list[np.ndarray]:
        """One uninitialised byte arena per buffer (large ones start on a cache line: `aligned_empty`)."""
        return [aligned_empty((b.nbytes,), np.uint8) for b in self.buffers]

    def view(self, arenas: list[np.ndarray], node: Node) -> np.ndarray:
        """The array (contiguous, at offset 0 of its buffer) that the kernel producing `node` writes into."""
        slot = self.slots[node]
        return arenas[slot.buffer][:slot.nbytes].view(slot.dtype.np).reshape(slot.shape)

    def summary(self) -> str:
        saved = self.bytes_without_reuse - self.bytes_with_reuse
        lines = [f"{len(self.slots)} planned values in {len(self.buffers)} buffers: "
                 f"{self.bytes_with_reuse} bytes with reuse, {self.bytes_without_reuse} without ({saved} saved)"]
        for b in self.buffers:
            lines.append(f"  buf{b.index}: {b.nbytes} bytes {list(b.shape)} {b.dtype}: "
                         + ", ".join(n.name for n in b.values))
        return "\n".join(lines)


def _single_tensor(node: Node):
    shape, dtype = node.meta.get("shape"), node.meta.get("dtype")
    if shape is None or dtype is None:
        return None
    return tuple(shape), dtype


def _is_alias(node: Node, kernel: Kernel) -> bool:
    """An opaque view kernel's result looks into its input 0's memory (no buffer of its own)."""
    op = op_of(node)
    return kernel.kind == "opaque" and op is not None and op.is_view and bool(node.args) \
        and isinstance(node.args[0], Node)


def plan_memory(kernels: list[Kernel], graph: Graph) -> MemoryPlan:
    """Assign buffers to intermediate kernel outputs, reusing buffers whose values are dead (see module doc)."""
    graph = getattr(graph, "graph", graph)
    kernel_of = {n: i for i, k in enumerate(kernels) for n in k.nodes}
    graph_outputs = set(graph.output_node.all_input_nodes)

    # alias roots: a view of a view of x is a view of x (and a view of a folded view reads that view's base)
    folded = {view: m.base for k in kernels for view, m in k.meta.get("views", {}).items()}
    root: dict[Node, Node] = {}
    for i, k in enumerate(kernels):
        for node in k.outputs:
            if _is_alias(node, k):
                base = folded.get(node.args[0], node.args[0])
                root[node] = root.get(base, base)

    # NOTE: an opaque call that is not a primitive runs as Python code (the executor's InterpretedStep): its result is
    # whatever the call returns, never a planned buffer, and it may be one of its inputs or a view of one
    # (Tensor.type to the dtype it has returns self), so it keeps their buffers alive, and escapes with them
    may_alias = {node: [root.get(a, a) for a in k.inputs] for k in kernels if k.kind == "opaque"
                 for node in k.outputs if node not in root and op_of(node) is None}

    # values that escape: graph outputs and the bases of views that are graph outputs (or of opaque results)
    escaping = set(graph_outputs) | {root[n] for n in graph_outputs if n in root}
    for k in reversed(kernels):
        for node in k.outputs:
            if node in escaping:
                escaping.update(may_alias.get(node, ()))

    unplanned: dict[Node, str] = {}
    aliases: dict[Node, Node] = {}
    candidates: list[tuple[int, Node]] = []
    for i, k in enumerate(kernels):
        for node in k.outputs:
            if node in root:
                base = root[node]
                if base.op in ("placeholder", "get_attr"):
                    unplanned[node] = "view of a graph input"
                elif node in graph_outputs:
                    unplanned[node] = "graph output (a view)"
                else:
                    aliases[node] = base
            elif node in escaping:
                unplanned[node] = "graph output" if node in graph_outputs else "a graph output is a view of it"
            elif node in may_alias:
                unplanned[node] = "an opaque call's result (it may be one of its inputs)"
            elif _single_tensor(node) is None:
                unplanned[node] = "not a single tensor"
            else:
                candidates.append((i, node))
    # a view of a value that is not planned (escaping, or not a tensor) is not planned either
    for view, base in list(aliases.items()):
        if base in unplanned or base not in kernel_of:
            unplanned[view] = f"view of {base.name}, which has no planned buffer"
            del aliases[view]

    # lifetimes: the last kernel reading the value or any view of it (or an opaque result that may be it)
    last_use: dict[Node, int] = {node: i for i, node in candidates}
    read_until: dict[Node, int] = {node: i for i, k in enumerate(kernels) for node in k.outputs}
    for j, k in enumerate(kernels):
        # a kernel writing its product into a value another kernel allocated (a cat's slice, passes/stores.py) uses
        # that buffer as much as a reader does: it must stay that value's until the last writer has run
        for arg in (*k.inputs, *k.meta.get("writes_into", ())):
            value = root.get(arg, arg)
            read_until[value] = max(read_until.get(value, j), j)
    for k in reversed(kernels):
        for node in k.outputs:
            for base in may_alias.get(node, ()):
                read_until[base] = max(read_until.get(base, 0), read_until[node])
    for node in last_use:
        last_use[node] = max(last_use[node], read_until.get(node, 0))

    buffers: list[Buffer] = []
    slots: dict[Node, Slot] = {}
    free: list[int] = []
    live: list[tuple[int, int]] = []  # (last use, buffer index)
    for i, node in candidates:  # in kernel order
        for end, b in list(live):
            if end < i:
                live.remove((end, b))
                free.append(b)
        shape, dtype = _single_tensor(node)
        size = math.prod(shape) * dtype.itemsize
        # NOTE: with symbolic sizes (nnc.symbolic) a buffer fits only where it does for every size: a guess from the
        # compiled sizes would be a guard that later sizes break
        fitting = [b for b in free if provably(buffers[b].nbytes, ">=", size)]
        if fitting:
            b = min(fitting, key=lambda b: (not provably(buffers[b].nbytes, "==", size), hint_int(buffers[b].nbytes),
                                            b))
            free.remove(b)
        else:
            b = len(buffers)
            buffers.append(Buffer(b, size, shape, dtype))
        buffers[b].values.append(node)
        slots[node] = Slot(node, b, shape, dtype, size, i, last_use[node])
        live.append((last_use[node], b))

    return MemoryPlan(buffers, slots, aliases, unplanned,
                      bytes_without_reuse=sum(s.nbytes for s in slots.values()),
                      bytes_with_reuse=sum(b.nbytes for b in buffers))
