"""Fusion: group a decomposed graph's primitive nodes into Kernels (elementwise chains, reduction prologues and
epilogues, matmul epilogues), deciding by op kinds on a TVM-style lattice, never by op names.

`fuse(graph) -> list[Kernel]` needs a decomposed graph (prims.* call_function nodes, plus placeholders, get_attrs,
the output and the odd opaque node) with shape meta (`propagate_shapes`). Every node other than placeholders,
get_attrs and the output lands in exactly one kernel; kernels come in a valid execution order.

The lattice (nnc.kernel): elementwise < broadcast < injective < reduction < opaque. A node's rank comes from its
OpDef's kind and its shapes:

  ELEMENTWISE  an elementwise prim whose inputs all have its output shape
  BROADCAST    an elementwise prim with an input of another (smaller) shape: that input is read with broadcasting
  INJECTIVE    a shape/view prim (`kind == "shape"` and `is_view`: reshape, permute, expand, getitem)
  REDUCTION    a reduction prim whose OpDef has a `reducer` (how code generation accumulates it: sum, prod, amax,
               amin, all, any); the others (argmax, argmin) are OPAQUE
  OPAQUE       everything else: matmul/linear (an *anchor* that takes epilogues), gather, scatter_add, index_put,
               cat (a shape op that copies), full, and nodes that are not prims at all. Some are generated
               kernels of their own, never grown (`own_kernel_kind`: windows, gathers along one dim, plain cats)

Rules, applied in this order (each step only ever assigns *whole nodes* to *one* group):

  1. Anchors. Each fusable reduction and each matmul/linear starts a group. INJECTIVE and OPAQUE nodes are groups
     of their own that never grow (kind "opaque", run as is: no code generation for indexing).
  2. Reduction prologues (post-dominator rule). An elementwise/broadcast producer p joins the group of reduction
     r as a prologue node when (a) p's output shape is r's input shape, (b) r post-dominates p: every path from p
     to the graph's output passes through r (immediate post-dominators, computed with
     `networkx.immediate_dominators` on the reversed graph from a virtual exit node), and (c) every node on those
     paths is already in the group: all users of p are prologue nodes or r itself. So p's value never leaves the
     kernel (it is not written out) and the kernel has a single exit, r. Candidates are visited consumers-first
     (reverse graph order), so a multi-consumer producer is decided after all of its consumers: it joins exactly
     when all of them did. ((c) implies (b) as the prologue grows; (b) is checked as well, as the stated rule.)
  3. Epilogues. An elementwise/broadcast consumer c joins the group of a reduction or matmul when c's output shape
     is the anchor's output shape and everything c reads from the group is the anchor or earlier epilogue nodes
     (never a prologue value); c's other inputs (a bias) are kernel inputs read with broadcasting. Prologues are
     grown first, so a node that could be a later reduction's prologue or an epilogue becomes the prologue (which
     saves writing a full-size value).
     An elementwise node of the matmul's output shape that only epilogue nodes read, and that reads nothing of
     the group, joins a matmul's epilogue too (an epilogue input, such as a backward's relu mask): the epilogue
     pass computes it from kernel inputs instead of a kernel of its own writing it out.
  4. Elementwise chains. The remaining elementwise/broadcast nodes are merged along producer -> consumer edges
     whose two ends have identical output shapes ("elementwise" kernels). An input of another shape stays a kernel
     input (read with broadcasting); a node of a group read outside it becomes a kernel output, so multi-consumer
     nodes are fine.
  5. Row kernels. A reduction whose result keeps its reduced dims (keepdim, rows longer than 1, the last dim
     reduced so that rows are contiguous) has a row signature; its group takes in, until nothing more joins, the
     neighbouring groups that work on the same rows: reduction groups of the same signature (also siblings
     reading an input of the row shape it reads), and elementwise groups of its input shape (values along the
     row) or of its reduced shape (one value per row). A later reduction, or a value along the row, may then read
     an earlier reduction result broadcast along the row: such a group becomes a "row" kernel, which code
     generation walks row by row in one pass per level of its reduction chain (softmax: max, then sum of exp,
     then exp / sum). A join that would close a cycle is refused with the reason recorded on the edges.
  6. Shared passes. A reduction kernel is one pass over its input shape; more work joins that pass. Reduction
     groups are visited in graph order of their reductions, and each takes in, until nothing more joins:
     (a) an elementwise group (from 4) of its input shape that its pass reads or that reads its prologue: the
         nodes become prologue nodes, and the ones read outside become kernel outputs, written by the pass;
     (b) a sibling reduction group: same input shape, same reduced dims, same output shape, reading a value of the
         input shape that the pass computes or also reads; its prologue, reduction and epilogue join (one
         accumulator per reduction). The backward of x * w + b is one kernel this way: gx written, gw and gb
         summed in the same sweep.
     A join is refused, with the reason recorded on the edges, when a value of the pass would read a reduction
     result or an epilogue value (it is only ready after the pass), when an epilogue node would read a prologue
     value, or when it would create a cycle.
  7. No cycles. Every merge or join is refused if some path leaves the group and comes back into it (the kernel
     DAG would get a cycle). The groups keep their DAG's edges and a topological order of it, updated on each
     merge (Pearce and Kelly's dynamic topological sort), so the check walks only the groups ranked between the
     two being merged. After grouping, the kernel DAG is built with networkx and checked to be acyclic, and
     kernels are ordered topologically (ties by graph position).

Folded views (nnc.passes.views): after grouping, a view whose chain is a strided map of a stored base and whose
readers are all elementwise, reduction, row or matmul kernels (or views with a map) belongs to no kernel: its readers
take the base as an input and record the map in meta `views`; the base's producer says so in its boundary reason.
The other views stay opaque kernels, and their reason says why (a graph output, an opaque reader, no map).

No work is ever duplicated: a node belongs to exactly one kernel (a folded view to none: it does no work) and no
kernel recomputes another's node, so transcendental or otherwise expensive nodes (exp, erf, ...) are computed once
by construction; `verify` checks it.
(Inside a row kernel over rows of symbolic length, a later pass recomputes such a value in its own loop: see
nnc.codegen.cpu_rows.)

Every kernel records why it ends in `Kernel.reason` (the boundary reasons of the edges leaving it, or why an opaque
node runs alone), and in meta: `ops` (op names), `ranks`, `bytes_moved` (bytes of inputs + outputs from shape and
dtype meta), `boundaries` ((producer, consumer, reason) per edge leaving it), `broadcast_inputs` (inputs some node
of the kernel reads at a larger shape than their own), and for reduction kernels `reductions` (one
{"op", "node", "dims", "keepdim", "out_shape"} per reduction, in graph order; `reduction` is the first and `anchor`
its node), `prologue` and `epilogue` node lists (matmul kernels: `anchor`, `epilogue`; row kernels: `anchor` and
`reductions`).
"""
from __future__ import annotations

import math

import networkx as nx

from runtime.dtypes import INT
from runtime.ops import Kind

from ..graph import Graph, Node, target_name
from ..kernel import (BROADCAST, ELEMENTWISE, INJECTIVE, OPAQUE, RANK_NAMES, REDUCTION, Kernel, interpreted_dtype,
                      own_kernel_kind)
from ..prims import Prim
from ..symbolic import Shape, is_symbolic
from .views import fold_views, is_view_node, why_not_folded

_NON_COMPUTE = ("placeholder", "get_attr", "output")


class FusionError(RuntimeError):
    """The graph cannot be fused (missing shape meta), or a grouping broke an invariant (a bug)."""


# ---------------------------------------------------------------------------------------------------------------
# Classification
# ---------------------------------------------------------------------------------------------------------------

def op_of(node: Node):
    """The OpDef of a prims.* call_function node, else None (an opaque node)."""
    if node.op == "call_function" and isinstance(node.target, Prim):
        return node.target.op
    return None


def op_name(node: Node) -> str:
    op = op_of(node)
    return op.name if op is not None else target_name(node.target)


def rank(node: Node) -> int:
    """The node's place on the fusion lattice (see the module docstring)."""
    op = op_of(node)
    if op is None or interpreted_dtype(node) and not op.is_view:
        return OPAQUE
    if op.kind == Kind.ELEMENTWISE:
        if op.divisor is not None and _integral(node):
            return OPAQUE  # its forward raises on a zero divisor, as eager does; a kernel would give 0
        out = node.meta.get("shape")
        for arg in node.all_input_nodes:
            shape = arg.meta.get("shape")
            if shape is not None and out is not None and Shape(shape) != Shape(out):
                return BROADCAST
        return ELEMENTWISE
    if op.kind == Kind.SHAPE:
        return INJECTIVE if op.is_view else OPAQUE  # cat copies: it is not an indexing view
    if op.kind == Kind.REDUCTION:
        return REDUCTION if op.reducer is not None else OPAQUE
    return OPAQUE  # matmul (an anchor that takes epilogues, see is_matmul) and other


def _integral(node: Node) -> bool:
    dtype = node.meta.get("dtype")
    return dtype is not None and dtype.category == INT


def is_pointwise(node: Node) -> bool:
    """Elementwise or broadcast: may sit in an elementwise kernel, a prologue or an epilogue."""
    return node.op not in _NON_COMPUTE and rank(node) <= BROADCAST and _shape(node) is not None


def needs_index(node: Node) -> bool:
    """A pointwise node whose value depends on its element's index (a counter-based random draw): only the
    elementwise skeleton (elementwise kernels, matmul epilogues) gives that index, so it stays out of reductions."""
    op = op_of(node)
    return op is not None and op.needs_index


def is_matmul(node: Node) -> bool:
    op = op_of(node)
    return op is not None and op.kind == Kind.MATMUL and _shape(node) is not None and not interpreted_dtype(node)


def is_window(node: Node) -> bool:
    """A node that is a generated kernel of its own (nnc.kernel.own_kernel_kind: convolution's im2col, pooling, a
    gather or scatter along one dim): one node, one kernel."""
    return own_kernel_kind(node) is not None and _shape(node) is not None


def is_reduction(node: Node) -> bool:
    return node.op not in _NON_COMPUTE and rank(node) == REDUCTION and _shape(node) is not None \
        and _shape(node.args[0]) is not None


def _shape(value):
    if isinstance(value, Node):
        shape = value.meta.get("shape")
        return Shape(shape) if shape is not None else None
    return None


def nbytes(node: Node) -> int:
    """Bytes of a node's value from shape/dtype meta (a tuple of tensors: their sum; not a tensor: 0)."""
    metas = [node.meta] if "shape" in node.meta else node.meta.get("tensor_meta") or []
    total = 0
    for meta in metas:
        if isinstance(meta, dict) and meta.get("shape") is not None and meta.get("dtype") is not None:
            total += math.prod(meta["shape"]) * meta["dtype"].itemsize
    return total


# ---------------------------------------------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------------------------------------------

class _Group:
    """A set of nodes being grown into a kernel."""

    def __init__(self, kind: str, nodes, anchor: Node | None = None):
        self.kind = kind  # elementwise | reduction | matmul | opaque
        self.nodes: set[Node] = set(nodes)
        self.anchor = anchor  # the matmul, or the reduction the group was started from
        self.anchors: list[Node] = [anchor] if anchor is not None else []  # every reduction of a reduction group
        # the kernel DAG as the groups grow: groups this one reads from and is read by, and a place in a topological
        # order of that DAG (kept by _Fuser._absorb), which bounds the cycle search
        self.preds: set[_Group] = set()
        self.succs: set[_Group] = set()
        self.rank = -1
        self.prologue: set[Node] = set()
        self.epilogue: set[Node] = set()


class _Fuser:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.position = {n: i for i, n in enumerate(graph.nodes)}
        self.compute = [n for n in graph.nodes if n.op not in _NON_COMPUTE]
        for node in self.compute:
            if node.op == "call_function" and isinstance(node.target, Prim) and "shape" not in node.meta \
                    and "tensor_meta" not in node.meta:
                raise FusionError(f"node {node.name} has no shape meta: run nnc.passes.propagate_shapes first")
        self.group_of: dict[Node, _Group] = {}
        self.refused: dict[tuple[Node, Node], str] = {}  # (producer, consumer) -> why they were not merged
        self.folded: dict = {}  # view node -> ViewMap, for the views folded into their readers (set by fuse)
        self.ipdom = self._post_dominators()

    # -- analyses ---------------------------------------------------------------------------------------------

    def _post_dominators(self) -> dict:
        """Immediate post-dominators: immediate dominators of the reversed graph from a virtual exit node."""
        reverse = nx.DiGraph()
        exit_node = ("<exit>",)
        reverse.add_node(exit_node)
        for node in self.graph.nodes:
            reverse.add_node(node)
            if not node.users:  # the output node, and dead nodes
                reverse.add_edge(exit_node, node)
            reverse.add_edges_from((user, node) for user in node.users)
        ipdom = nx.immediate_dominators(reverse, exit_node)
        ipdom.pop(exit_node, None)
        return ipdom

    def post_dominates(self, d: Node, n: Node) -> bool:
        """Whether every path from n to the graph's exit passes through d."""
        while n in self.ipdom:
            parent = self.ipdom[n]
            if parent is d:
                return True
            if parent is n or not isinstance(parent, Node):
                return False
            n = parent
        return False

    def creates_cycle(self, group: _Group, other: _Group) -> bool:
        """Whether merging two groups would close a cycle in the kernel DAG: some path from one to the other passes
        through a third group. Groups run as units, so paths are over groups: a group reads every input of each of
        its nodes, even of nodes not connected to each other."""
        lo, hi = sorted((group, other), key=_by_rank)
        return self._reached_before(lo, hi) is None

    def _reached_before(self, lo: _Group, hi: _Group) -> set | None:
        """The groups ranked below `hi` that `lo` reaches through at least one other group, or None when one of them
        reads `hi` (then lo reaches hi through another group). Ranks are a topological order, so no path from lo
        to hi passes a group ranked above hi: the search stops there."""
        found: set[_Group] = set()
        stack = [g for g in lo.succs if g is not hi and g.rank < hi.rank]
        while stack:
            g = stack.pop()
            if g in found:
                continue
            found.add(g)
            for s in g.succs:
                if s is hi:
                    return None
                if s.rank < hi.rank and s not in found:
                    stack.append(s)
        return found

    def _reaching_after(self, lo: _Group, hi: _Group) -> set:
        """The groups ranked above `lo` that reach `hi` through at least one other group."""
        found: set[_Group] = set()
        stack = [g for g in hi.preds if g is not lo and g.rank > lo.rank]
        while stack:
            g = stack.pop()
            if g in found:
                continue
            found.add(g)
            stack.extend(p for p in g.preds if p.rank > lo.rank and p not in found)
        return found

    # -- grouping ---------------------------------------------------------------------------------------------

    def run(self) -> list[_Group]:
        # 1. anchors and singletons
        for node in self.compute:
            if is_reduction(node):
                self.group_of[node] = _Group("reduction", [node], anchor=node)
            elif is_matmul(node):
                self.group_of[node] = _Group("matmul", [node], anchor=node)
            elif is_pointwise(node):
                self.group_of[node] = _Group("elementwise", [node])
            elif is_window(node):  # a kernel of its own, generated (OpDef.kernel_kind), that never grows
                self.group_of[node] = _Group(own_kernel_kind(node), [node])
            else:
                self.group_of[node] = _Group("opaque", [node])
            self.group_of[node].rank = self.position[node]
        for node in self.compute:
            group = self.group_of[node]
            for user in node.users:
                reader = self.group_of.get(user)
                if reader is not None:
                    group.succs.add(reader)
                    reader.preds.add(group)
        # 2. reduction prologues, 3. epilogues, 4. elementwise chains
        for node in self.compute:
            if self.group_of[node].kind == "reduction":
                self._grow_prologue(self.group_of[node])
        for node in self.compute:
            group = self.group_of[node]
            if group.anchor is node:
                self._grow_epilogue(group)
                if group.kind == "matmul":
                    self._grow_epilogue_inputs(group)
        for node in self.compute:
            self._merge_elementwise(node)
        # 5. row kernels: reductions over the same rows, and the work between them, in one loop over rows
        for node in self.compute:
            group = self.group_of[node]
            if group.kind == "reduction" and group.anchor is node and _row_signature(node) is not None:
                self._join_rows(group)
        # 6. shared passes: elementwise kernels and sibling reductions join the other reduction kernels
        for node in self.compute:
            group = self.group_of[node]
            if group.kind == "reduction" and group.anchor is node:
                self._join_shared_pass(group)
        groups = list({id(g): g for g in self.group_of.values()}.values())
        return groups

    def _free_pointwise(self, node: Node) -> bool:
        """An elementwise node still alone in its own group (free to join another)."""
        group = self.group_of.get(node)
        return group is not None and group.kind == "elementwise" and len(group.nodes) == 1 and is_pointwise(node)

    def _grow_prologue(self, group: _Group) -> None:
        reduction = group.anchor
        in_shape = _shape(reduction.args[0])
        candidates = {a for a in reduction.all_input_nodes}
        while candidates:
            p = max(candidates, key=self.position.__getitem__)  # consumers first: users are decided before p
            candidates.discard(p)
            if p.op in _NON_COMPUTE:
                continue
            if not self._free_pointwise(p):
                continue  # an anchor, an opaque node, or already in a group: _edge_reason says why
            if needs_index(p):
                self.refused[(p, _first_user_in(p, group))] = _INDEX_REASON.format(p.name)
                continue
            if _shape(p) != in_shape:
                continue  # (cannot happen for a direct input of a pointwise prologue; kept for safety)
            outside = [u for u in p.users if u not in group.nodes]
            if outside or not self.post_dominates(reduction, p):
                readers = ", ".join("the graph output" if x.op == "output" else x.name for x in outside)
                for u in p.users:
                    if u in group.nodes:
                        self.refused[(p, u)] = (f"{p.name} is also read outside the reduction ({readers}), "
                                                f"so it cannot be a prologue of {reduction.name}")
                continue
            if self.creates_cycle(group, self.group_of[p]):
                self.refused[(p, _first_user_in(p, group))] = (
                    f"{p.name} joining {reduction.name}'s kernel as a prologue would create a cycle between kernels")
                continue
            self._absorb(group, self.group_of[p])
            group.prologue.add(p)
            candidates.update(a for a in p.all_input_nodes if a.op not in _NON_COMPUTE)

    def _grow_epilogue(self, group: _Group) -> None:
        anchor = group.anchor
        out_shape = _shape(anchor)
        producers = {anchor}
        candidates = set(anchor.users)
        while candidates:
            c = min(candidates, key=self.position.__getitem__)  # producers first
            candidates.discard(c)
            if c.op == "output" or c in group.nodes:
                continue
            inside = [a for a in c.all_input_nodes if a in group.nodes]
            p = inside[0]
            if not self._free_pointwise(c):
                continue  # an anchor, an opaque node, or already in a group: _edge_reason says why
            if group.kind == "reduction" and needs_index(c):
                self.refused[(p, c)] = _INDEX_REASON.format(c.name)
                continue
            if _shape(c) != out_shape:
                self.refused[(p, c)] = (f"{c.name} {list(_shape(c))} reads the {group.kind} output shape "
                                        f"{list(out_shape)} with broadcasting, so it cannot be an epilogue")
                continue
            bad = [a for a in inside if a not in producers]
            if bad:
                self.refused[(p, c)] = (f"{c.name} reads the prologue value {bad[0].name}; an epilogue may read only "
                                        f"the {group.kind} result and earlier epilogue nodes")
                continue
            if self.creates_cycle(group, self.group_of[c]):
                for a in inside:
                    self.refused[(a, c)] = (f"{c.name} joining {anchor.name}'s kernel as an epilogue would create a "
                                            f"cycle between kernels (it also reads a value computed from that kernel)")
                continue
            self._absorb(group, self.group_of[c])
            group.epilogue.add(c)
            producers.add(c)
            candidates.update(c.users)

    def _grow_epilogue_inputs(self, group: _Group) -> None:
        """3b. Epilogue inputs: an elementwise node of the matmul's output shape that reads nothing of the group and
        is read only by its epilogue joins it, computed in the epilogue pass from kernel inputs (the relu mask of a
        backward's `where(mask, g @ w, 0)`) instead of in a kernel of its own that writes it out."""
        out_shape = _shape(group.anchor)
        candidates = {a for c in group.epilogue for a in c.all_input_nodes}
        while candidates:
            p = max(candidates, key=self.position.__getitem__)  # consumers first: users are decided before p
            candidates.discard(p)
            if p.op in _NON_COMPUTE or not self._free_pointwise(p) or _shape(p) != out_shape:
                continue
            if any(u not in group.epilogue for u in p.users) or any(a in group.nodes for a in p.all_input_nodes):
                continue
            if self.creates_cycle(group, self.group_of[p]):
                continue
            self._absorb(group, self.group_of[p])
            group.epilogue.add(p)
            candidates.update(p.all_input_nodes)

    def _merge_elementwise(self, consumer: Node) -> None:
        group = self.group_of[consumer]
        if group.kind != "elementwise":
            return
        for p in consumer.all_input_nodes:
            if p.op in _NON_COMPUTE or self.group_of[p] is self.group_of[consumer]:
                continue
            other, mine = self.group_of[p], self.group_of[consumer]
            if other.kind != "elementwise":
                continue  # boundary reasons for anchored or opaque producers are worked out afterwards
            if _shape(p) != _shape(consumer):
                self.refused[(p, consumer)] = (f"{p.name} {list(_shape(p))} is read with broadcasting by "
                                               f"{consumer.name} {list(_shape(consumer))}")
                continue
            if self.creates_cycle(mine, other):
                self.refused[(p, consumer)] = (f"merging {p.name} and {consumer.name} would create a cycle between "
                                               f"kernels (a path from one to the other leaves both groups)")
                continue
            self._absorb(mine, other)

    def _join_shared_pass(self, group: _Group) -> None:
        """Step 5: grow a reduction kernel by the elementwise kernels of its input shape that it reads or that read
        its prologue, and by sibling reductions (same input shape, dims and output shape) that read a value of its
        pass, until nothing more joins. Refusals are recorded as boundary reasons."""
        joined = True
        while joined:
            joined = False
            for other, edges in self._pass_neighbours(group):
                why = self._join_refusal(group, other)
                if why is not None:
                    for p, c in edges:
                        if p.op not in _NON_COMPUTE:
                            self.refused[(p, c)] = why(p, c)  # the last decision about this edge
                    continue
                group.prologue |= other.nodes - other.epilogue - set(other.anchors)
                group.epilogue |= other.epilogue
                self._absorb(group, other)
                group.anchors += other.anchors
                joined = True
                break

    def _pass_neighbours(self, group: _Group) -> list:
        """[(group, edges)]: the elementwise groups of the input shape that the pass of `group` reads or that read
        its prologue, and the reduction groups with the same signature that read a value of the input shape it
        also reads or computes; edges are the (producer, consumer) pairs linking them, in graph order."""
        in_shape = _shape(group.anchor.args[0])
        signature = _signature(group.anchor)
        passed = [n for n in group.nodes if n not in group.epilogue]  # computed in the pass over the input
        found: dict[int, tuple] = {}

        def add(other, p, c):
            if other is not None and other is not group:
                found.setdefault(id(other), (other, []))[1].append((p, c))

        for n in passed:
            for a in n.all_input_nodes:
                other = self.group_of.get(a)
                if other is not None and other.kind == "elementwise" and _shape(a) == in_shape:
                    add(other, a, n)
        shared = group.prologue | {a for n in passed for a in n.all_input_nodes if _shape(a) == in_shape}
        for v in shared:
            for u in v.users:
                other = self.group_of.get(u)
                if other is None or u in group.nodes:
                    continue
                if other.kind == "elementwise" and v in group.nodes and _shape(u) == in_shape:
                    add(other, v, u)
                elif other.kind == "reduction" and u not in other.epilogue and _signature(other.anchor) == signature:
                    add(other, v, u)
        position = self.position.__getitem__
        return sorted(found.values(), key=lambda item: min(position(c) for _, c in item[1]))

    def _join_refusal(self, group: _Group, other: _Group):
        """None when `other` may join reduction group `group`'s pass, else a function (p, c) -> boundary reason.

        One pass computes the prologue values and accumulates every reduction; the epilogue runs after it. So no
        value of the pass may depend on a reduction result, and no epilogue node may read a prologue value."""
        name = group.anchor.name
        drawn = next((n for n in other.nodes if needs_index(n)), None)
        if drawn is not None:
            return lambda p, c: _INDEX_REASON.format(drawn.name)
        late = _read_from(_pass_nodes(other), _results(group)) or _read_from(_pass_nodes(group), _results(other))
        if late is not None:
            reader, value = late
            return lambda p, c: (f"{reader.name} cannot run in the pass of {name}'s kernel: it reads the reduction "
                                 f"result {value.name}")
        prologue = (_pass_nodes(group) | _pass_nodes(other)) - set(group.anchors) - set(other.anchors)
        early = _read_from(group.epilogue | other.epilogue, prologue)
        if early is not None:
            reader, value = early
            return lambda p, c: (f"{p.name} and {c.name} cannot share the pass of {name}'s kernel: the epilogue "
                                 f"node {reader.name} would read the prologue value {value.name}")
        if self.creates_cycle(group, other):
            return lambda p, c: (f"joining {p.name} and {c.name} in the pass of {name}'s kernel would create a "
                                 f"cycle between kernels")
        return None

    def _join_rows(self, group: _Group) -> None:
        """Step 6: grow a reduction kernel into a row kernel by the neighbouring groups that work on the same rows:
        reduction groups of its signature (a later reduction may read an earlier one's result broadcast along the
        row), and elementwise groups of the input shape or of the reduced shape. The row kernel walks each row in as
        many passes as its chain of reductions needs (nnc.codegen.cpu_rows), so nothing is written between them."""
        signature = _signature(group.anchor)
        joined = True
        while joined:
            joined = False
            for other, edges in self._row_neighbours(group, signature):
                drawn = next((n for n in other.nodes | group.nodes if needs_index(n)), None)
                if drawn is not None and not _trailing_rows(signature):  # no element index for random draws
                    for p, c in edges:
                        self.refused[(p, c)] = _ROW_INDEX_REASON.format(drawn.name)
                    continue
                if self.creates_cycle(group, other):
                    for p, c in edges:
                        self.refused[(p, c)] = (f"{p.name} and {c.name} cannot share the row kernel of "
                                                f"{group.anchor.name}: it would create a cycle between kernels")
                    continue
                if other.kind == "elementwise":
                    per_row = _shape(next(iter(other.nodes))) == signature[2]
                    (group.epilogue if per_row else group.prologue).update(other.nodes)
                group.prologue |= other.prologue
                group.epilogue |= other.epilogue
                self._absorb(group, other)
                group.anchors += other.anchors
                if group.kind == "row" or other.kind == "row" or _needs_row_skeleton(group):
                    group.kind = "row"
                joined = True
                break

    def _row_neighbours(self, group: _Group, signature: tuple) -> list:
        """[(group, edges)]: the groups next to `group` (reading it or read by it) that may join its row kernel, in
        graph order of their first edge."""
        found: dict[int, tuple] = {}
        for n in group.nodes:
            for p, c in [(a, n) for a in n.all_input_nodes] + [(n, u) for u in n.users]:
                other = self.group_of.get(c if p is n else p)
                if other is not None and other is not group and _fits_rows(other, signature):
                    found.setdefault(id(other), (other, []))[1].append((p, c))
        # sibling reductions reading a value along the row that this group reads too (an input they share)
        shared = {a for n in group.nodes for a in n.all_input_nodes if a not in group.nodes
                  and _shape(a) == signature[0]}
        for v in shared:
            for u in v.users:
                other = self.group_of.get(u)
                if other is not None and other is not group and other.kind in ("reduction", "row") \
                        and _fits_rows(other, signature):
                    found.setdefault(id(other), (other, []))[1].append((v, u))
        position = self.position.__getitem__
        return sorted(found.values(), key=lambda item: min(position(c) for _, c in item[1]))

    def _absorb(self, group: _Group, other: _Group) -> None:
        """Move every node of `other` into `group` (the caller has checked that this closes no cycle), and keep the
        ranks a topological order of the groups, as Pearce and Kelly's dynamic topological sort does: between the
        two groups' ranks, what reaches the merged group moves before it and what it reaches moves after it, into
        the same rank slots."""
        lo, hi = sorted((group, other), key=_by_rank)
        after = self._reached_before(lo, hi)
        if after is None:
            raise FusionError(f"merging the kernels of {_names(group)} and {_names(other)} would close a cycle")
        before = self._reaching_after(lo, hi)
        slots = sorted([g.rank for g in before | after] + [lo.rank, hi.rank])
        for g, slot in zip(sorted(before, key=_by_rank) + [group] + sorted(after, key=_by_rank), slots):
            g.rank = slot
        for node in other.nodes:
            self.group_of[node] = group
        group.nodes |= other.nodes
        other.nodes = set()
        for reader in other.succs:
            reader.preds.discard(other)
            if reader is not group:
                reader.preds.add(group)
                group.succs.add(reader)
        for producer in other.preds:
            producer.succs.discard(other)
            if producer is not group:
                producer.succs.add(group)
                group.preds.add(producer)
        other.succs, other.preds = set(), set()


def _by_rank(group: _Group) -> int:
    return group.rank


def _names(group: _Group) -> str:
    return ", ".join(sorted(n.name for n in group.nodes))


_INDEX_REASON = "{} draws random numbers by element index, which a reduction kernel's loops do not give"
_ROW_INDEX_REASON = ("{} draws random numbers by element index, which a row kernel's loops give only when the "
                     "reduced dims are the trailing ones")


def _trailing_rows(signature: tuple) -> bool:
    """Whether a row signature reduces the trailing dims only: element (o, r) of the row kernel's shape is then
    at flat index o * row length + r, the index random draws need (nnc.codegen.cpu_rows)."""
    in_shape, dims, _ = signature
    return dims == tuple(range(len(in_shape) - len(dims), len(in_shape)))


def _pass_nodes(group: _Group) -> set:
    """The nodes a reduction kernel computes in its pass over the input (all nodes of an elementwise group)."""
    return group.nodes - group.epilogue


def _results(group: _Group) -> set:
    """The reductions of a group and the epilogue nodes computed from them (empty for an elementwise group)."""
    return set(group.anchors) | group.epilogue


def _read_from(readers, values):
    """(reader, value) for some node of `readers` reading a node of `values` (the first in name order), else None."""
    pairs = [(n, a) for n in readers for a in n.all_input_nodes if a in values]
    return min(pairs, key=lambda pair: (pair[0].name, pair[1].name)) if pairs else None


def _signature(reduction: Node) -> tuple:
    """What sibling reductions share: input shape, reduced dims (non-negative, sorted) and output shape."""
    in_shape = _shape(reduction.args[0])
    ndim = len(in_shape)
    dims = tuple(sorted({d % ndim if ndim else 0 for d in reduction.kwargs.get("dims", ())}))
    return in_shape, dims, _shape(reduction)


def _row_signature(reduction: Node):
    """The reduction's signature when its result is a row value: kept dims (keepdim), at least one reduced position
    per row beyond the first (a reduced size of 1 changes nothing), so a value of the input shape reads it
    broadcast along the row, and the last dim reduced (a row is contiguous). Else None.
    NOTE: a row kernel walks each row on its own; with the last dim kept that is a strided walk down a column,
    4x slower than the column reduction skeleton's sweeps for BatchNorm1d's training step at [8192, 256]."""
    in_shape, dims, out_shape = _signature(reduction)
    if not dims or len(out_shape) != len(in_shape) or len(in_shape) - 1 not in dims:
        return None
    if any(out_shape[d] != (1 if d in dims else in_shape[d]) for d in range(len(in_shape))):
        return None
    if all(not is_symbolic(in_shape[d]) and in_shape[d] == 1 for d in dims):
        return None
    return in_shape, dims, out_shape


def _fits_rows(group: _Group, signature: tuple) -> bool:
    """Whether a group may join a row kernel of this signature: a reduction group of the same signature, or an
    elementwise group of the input shape (values along the row) or of the reduced shape (one value per row)."""
    if group.kind in ("reduction", "row"):
        return all(_row_signature(r) == signature for r in group.anchors)
    if group.kind == "elementwise":
        shapes = {_shape(n) for n in group.nodes}
        return len(shapes) == 1 and shapes <= {signature[0], signature[2]}
    return False


def _needs_row_skeleton(group: _Group) -> bool:
    """Whether a reduction group that grew in step 6 needs the row skeleton rather than one pass and an epilogue:
    a value of the input shape or a reduction reads a reduction result (directly or through values per row), or
    a value per row reads no reduction (it is computed before the pass)."""
    reductions = set(group.anchors)
    in_shape = _shape(group.anchor.args[0])
    late = set(reductions)  # the values ready only after a pass
    changed = True
    while changed:
        changed = False
        for n in group.nodes:
            if n not in late and any(a in late for a in n.all_input_nodes):
                late.add(n)
                changed = True
    for n in group.nodes:
        if n in reductions:
            if n.args[0] in late:
                return True
        elif (n in late) == (_shape(n) == in_shape):  # a late value along the row, or an early value per row
            return True
    return False


def _first_user_in(p: Node, group: _Group) -> Node:
    for u in p.users:
        if u in group.nodes:
            return u
    return group.anchor


# ---------------------------------------------------------------------------------------------------------------
# Boundary reasons
# ---------------------------------------------------------------------------------------------------------------

def _edge_reason(p: Node, c: Node, fuser: _Fuser) -> str:
    """Why producer p and consumer c ended up in different kernels (c reads p across a kernel boundary)."""
    if c.op == "output":
        return f"{p.name} is a graph output"
    if c in fuser.folded:
        return _folded_view_reason(p, c, fuser.folded)
    pg, cg = fuser.group_of[p], fuser.group_of[c]
    if pg.kind == "opaque":
        return f"{p.name} is {RANK_NAMES[rank(p)]} and runs alone"
    if is_window(p) or is_window(c):
        w = p if is_window(p) else c
        return f"{w.name} ({op_name(w)}) is a {own_kernel_kind(w)} kernel of its own"
    if op_of(c) is None:
        return f"{p.name} is read by {c.name}, which is not a primitive (opaque)"
    if is_matmul(c):
        return f"{p.name} feeds the matmul {c.name} (a matmul fuses epilogues, not prologues)"
    if cg.kind == "opaque":
        return f"{p.name} feeds the {RANK_NAMES[rank(c)]} op {c.name}, which runs alone"
    if cg.kind == "row" and pg.kind == "matmul" and c in cg.anchors:  # (a prologue refusal here is stale)
        return (f"matmul result {p.name} feeds the row kernel of {cg.anchor.name}, which walks its rows in passes "
                f"of its own")
    if (p, c) in fuser.refused:
        return fuser.refused[(p, c)]
    anchored = p in pg.anchors or p in pg.epilogue
    if c in cg.anchors:  # c is a reduction
        if anchored:
            return f"{pg.kind} result {p.name} feeds the reduction {c.name}, which needs a pass of its own"
        return f"{p.name} feeds the reduction {c.name} but is not one of its prologue nodes"
    if _shape(p) != _shape(c):
        return f"{p.name} {list(_shape(p) or ())} is read with broadcasting by {c.name} {list(_shape(c) or ())}"
    if anchored and cg.anchor is not None:
        return (f"{pg.kind} result {p.name} feeds {c.name} in the {cg.kind} kernel of {cg.anchor.name}, which "
                f"needs a pass of its own")
    if cg.anchor is not None and c in cg.prologue:
        return f"{p.name} is also read outside {cg.anchor.name}'s reduction, so it cannot be a prologue"
    if cg.anchor is not None:
        return f"{c.name} is an epilogue of {cg.anchor.name} and reads {p.name} from another kernel"
    if anchored:
        return f"{c.name} already belongs to another kernel"
    return f"{p.name} and {c.name} were not merged"


def _folded_view_reason(p: Node, view: Node, folded: dict) -> str:
    """Why p is stored although its reader is a view: the view is folded into the indexing of the kernels that
    read it, which read p's memory."""
    readers, stack = [], [view]
    while stack:
        for u in stack.pop().users:
            if u in folded:
                stack.append(u)
            elif u not in readers:
                readers.append(u)
    return (f"{p.name} is read through the view {view.name} ({op_name(view)}), folded into the indexing of "
            f"{', '.join(u.name for u in readers)}")


def _opaque_reason(node: Node, graph: Graph, folded: dict) -> str:
    r = rank(node)
    op = op_of(node)
    if op is None:
        return f"opaque: {node.op} {target_name(node.target)} is not a primitive; run as is"
    if r == INJECTIVE:
        return (f"injective: view/shape op {op.name} runs as a step of its own (not folded into its readers: "
                f"{why_not_folded(node, graph, folded)})")
    if interpreted_dtype(node) and not op.is_view:
        return (f"opaque: {op.name} of {interpreted_dtype(node)} values runs in numpy (no code generator has "
                f"{interpreted_dtype(node)} arithmetic)")
    if op.kind == Kind.REDUCTION:
        return f"opaque: reduction {op.name} has no fusable accumulator (OpDef.reducer); run as is"
    return f"opaque: {op.kind} op {op.name} runs as is"


# ---------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------

def fuse(graph: Graph, fold: bool = True) -> list[Kernel]:
    """Group a decomposed, shape-annotated graph's nodes into kernels, in a valid execution order. `fold`: fold
    views into the kernels that read them (False: every view stays a step of its own)."""
    graph = getattr(graph, "graph", graph)  # a GraphModule is accepted too
    fuser = _Fuser(graph)
    groups = fuser.run()
    position = fuser.position
    graph_outputs = set(graph.output_node.all_input_nodes)
    # views read only by kernels that index strided inputs are folded into them (nnc.passes.views): no kernel
    kind_of = lambda n: fuser.group_of[n].kind if n in fuser.group_of else ""  # noqa: E731
    folded = fuser.folded = fold_views(graph, kind_of) if fold else {}
    groups = [g for g in groups if not (g.nodes & folded.keys())]
    stored = lambda arg: folded[arg].base if arg in folded else arg  # noqa: E731  (what a kernel reads)

    # the kernel DAG: it must stay acyclic
    dag = nx.DiGraph()
    for i, group in enumerate(groups):
        dag.add_node(i)
    index = {id(g): i for i, g in enumerate(groups)}
    for i, group in enumerate(groups):
        for node in group.nodes:
            for arg in map(stored, node.all_input_nodes):
                if arg.op not in _NON_COMPUTE and fuser.group_of[arg] is not group:
                    dag.add_edge(index[id(fuser.group_of[arg])], i)
    if not nx.is_directed_acyclic_graph(dag):
        cycle = nx.find_cycle(dag)
        raise FusionError(f"fusion produced a cycle between kernels: {cycle}")  # a bug in the rules
    first = {i: min(position[n] for n in g.nodes) for i, g in enumerate(groups)}
    order = list(nx.lexicographical_topological_sort(dag, key=first.__getitem__))

    kernels = []
    for k, i in enumerate(order):
        group = groups[i]
        nodes = sorted(group.nodes, key=position.__getitem__)
        inputs: dict[Node, None] = {}
        views = {}  # folded views the kernel reads: it takes their bases as inputs
        for node in nodes:
            for arg in node.all_input_nodes:
                if arg in folded:
                    views[arg] = folded[arg]
                if arg not in group.nodes:
                    inputs.setdefault(stored(arg), None)
        outputs = [n for n in nodes if n in graph_outputs or any(u not in group.nodes for u in n.users)]
        boundaries = [(n, u, _edge_reason(n, u, fuser)) for n in outputs for u in n.users if u not in group.nodes]
        if group.kind == "opaque":
            reason = _opaque_reason(nodes[0], graph, folded)
        elif boundaries:
            reason = "; ".join(dict.fromkeys(r for _, _, r in boundaries))
        else:
            reason = "its result is never read (dead code)"
        if group.kind == "elementwise":
            shape = _shape(nodes[0])
        elif group.kind in ("reduction", "row"):
            shape = _shape(group.anchor.args[0])  # every reduction of the group has this input shape
        else:
            shape = _shape(nodes[0]) if _shape(nodes[0]) is not None else ()
        kind = group.kind
        name = f"k{k}_{kind}"
        meta = {
            "ops": [op_name(n) for n in nodes],
            "ranks": [RANK_NAMES[rank(n)] for n in nodes],
            "bytes_moved": sum(nbytes(n) for n in inputs) + sum(nbytes(n) for n in outputs),
            "boundaries": [(p.name, c.name, r) for p, c, r in boundaries],
            "broadcast_inputs": [n for n in inputs if kind in _POINTWISE_KINDS and _read_with_broadcasting(group, n)],
            "views": views,
        }
        if kind in ("reduction", "matmul"):
            meta["anchor"] = min(group.anchors, key=position.__getitem__)
            meta["prologue"] = [n for n in nodes if n in group.prologue]
            meta["epilogue"] = [n for n in nodes if n in group.epilogue]
        if kind == "row":
            meta["anchor"] = min(group.anchors, key=position.__getitem__)
        if kind in ("reduction", "row"):
            meta["reductions"] = [_reduction_meta(r) for r in sorted(group.anchors, key=position.__getitem__)]
            meta["reduction"] = meta["reductions"][0]
        kernels.append(Kernel(name, kind, nodes, list(inputs), outputs, tuple(shape), reason, meta))
    return kernels


def _reduction_meta(r: Node) -> dict:
    return {"op": op_of(r).name, "node": r, "dims": tuple(r.kwargs.get("dims", ())),
            "keepdim": bool(r.kwargs.get("keepdim", False)), "out_shape": _shape(r)}


# The kernel kinds whose pointwise nodes may read an input broadcast (window and gather kernels index theirs).
_POINTWISE_KINDS = ("elementwise", "reduction", "matmul")


def _read_with_broadcasting(group: _Group, value: Node) -> bool:
    """Whether some pointwise node of the group reads `value` at a shape other than its own (the anchor of a
    reduction or matmul reads its inputs whole)."""
    shape = _shape(value)
    return shape is not None and any(
        node not in group.anchors and value in node.all_input_nodes and _shape(node) != shape for node in group.nodes)


# ---------------------------------------------------------------------------------------------------------------
# Checks (used by tests and by nnc.explain)
# ---------------------------------------------------------------------------------------------------------------

def kernel_dag(kernels: list[Kernel]) -> nx.DiGraph:
    """The kernels as a networkx DiGraph (kernel index -> kernel index, along values read across kernels)."""
    owner = {n: i for i, k in enumerate(kernels) for n in k.nodes}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(kernels)))
    for i, k in enumerate(kernels):
        for node in k.inputs:
            if node in owner:
                dag.add_edge(owner[node], i)
    return dag


def verify(kernels: list[Kernel], graph: Graph) -> None:
    """Raise FusionError unless the kernels cover every compute node exactly once, run in a valid order (each
    kernel's inputs come from earlier kernels, placeholders or get_attrs), form an acyclic DAG, and list the right
    inputs and outputs."""
    graph = getattr(graph, "graph", graph)
    folded = {v: m for k in kernels for v, m in k.meta.get("views", {}).items()}
    # copies folded into their producers' stores (nnc.passes.stores): the views between run in no kernel, and the
    # copy nodes read nothing (their producer holds them)
    stores = [s for k in kernels for s in k.meta.get("stores", {}).values()]
    through = {n for s in stores for n in s.through}
    chained = set(folded) | {n for n in through if is_view_node(n)}  # and the views only folded views read
    for n in reversed(list(graph.nodes)):
        if n.users and all(u in chained for u in n.users) and is_view_node(n):
            chained.add(n)
    compute = [n for n in graph.nodes if n.op not in _NON_COMPUTE and n not in chained]
    seen: dict[Node, str] = {}
    for k in kernels:
        for n in k.nodes:
            if n in seen:
                raise FusionError(f"{n.name} is in two kernels: {seen[n]} and {k.name} (duplicated work)")
            seen[n] = k.name
    missing = [n.name for n in compute if n not in seen]
    extra = [n.name for n in seen if n not in set(compute)]
    if missing or extra:
        raise FusionError(f"kernels miss nodes {missing} / hold non-compute nodes {extra}")
    available = {n for n in graph.nodes if n.op in ("placeholder", "get_attr")}
    outputs = set(graph.output_node.all_input_nodes)
    position = {id(k): i for i, k in enumerate(kernels)}
    for k in kernels:
        members = set(k.nodes)
        reads = {folded[a].base if a in folded else a
                 for n in k.nodes if n not in through for a in n.all_input_nodes if a not in members}
        if set(k.inputs) != reads or len(k.inputs) != len(reads):
            raise FusionError(f"{k.name}: inputs {k.inputs} should be {sorted(reads, key=str)}")
        late = [a.name for a in k.inputs if a not in available]
        late += [a.name for a in k.inputs if any(a in w.meta.get("writes_into", ()) for w in kernels[position[id(k)]:])]
        late += [a.name for a in k.meta.get("writes_into", ()) if a not in available]  # written before allocated
        if late:
            raise FusionError(f"{k.name} reads {late} before a kernel produces them (invalid order)")
        expected = [n for n in k.nodes if n in outputs or any(u not in members and u not in through for u in n.users)]
        if k.outputs != expected:
            raise FusionError(f"{k.name}: outputs {k.outputs} should be {expected}")
        available |= members
    if not nx.is_directed_acyclic_graph(kernel_dag(kernels)):
        raise FusionError("the kernel DAG has a cycle")
