"""autodiff: derive the backward graph of a decomposed forward graph from the op table's derivative rules.

The rules are the ones eager autograd runs; here they are evaluated on MetaValues, so they build nodes of a
new graph. Inputs a rule only needs the shape of are never saved.

Save-or-recompute rule. Some forward values cost the backward nothing: forward placeholders and get_attr
parameters/buffers/constants (they exist whatever the backward keeps), and values already saved. When a rule reads
another forward value v:

  - If v is a cheap primitive (an elementwise prims.* call, not opaque, or a view of one tensor: reshape, permute,
    expand, basic getitem), its *cone* is what recomputing it takes: v and, recursively, the cheap inputs the
    backward does not have yet. The cone stops at free values and at *leaves* it cannot recompute (matmuls,
    reductions, opaque calls, ...), which would have to be saved. So the backward saves a view's base and
    recomputes the view, which fusion folds into the kernels reading it (a view of a parameter costs nothing).
  - v is recomputed iff the bytes (shape x itemsize) of the leaves it would save are at most the bytes of v (of
    its base, when v is a view: a saved view keeps its whole base alive). On a tie, v is saved when the forward
    writes it to memory anyway (a matmul, view, opaque call or the graph output reads it): recomputed, it would be
    a copy kernel of the backward. A view is saved on a tie only when some leaf is not written as well: saving
    that leaf would cost the forward an extra write, while recomputing a view costs nothing.
  - A value read with broadcasting (a norm's mean or rstd, one per row) is saved, and is a leaf of the cones
    above: recomputed, it would be a small kernel of the backward, since fusion merges chains of one shape only.
  - Otherwise (or when v is not cheap) v is saved by the forward: a placeholder `saved_<name>` of the backward.

So a chain of elementwise ops over inputs and parameters saves only those inputs and parameters (the backward
recomputes the whole chain, fused into its own kernels); relu(mm + b) feeding another matmul saves the relu output
(as many bytes as mm, and the forward writes it anyway), while inside gelu(mm + b) the intermediates are
recomputed from mm; a value whose recomputation needs two large intermediates nothing else saves is saved itself.
The decisions are greedy, in the order the backward asks for values (the forward graph in reverse): a leaf saved
for one value is free for the next, but a value decided earlier may have been saved for leaves that turn out to be
saved anyway. So the backward is built twice, and in the second run (the one kept) the leaves the first run saved
count as free: tanh(mm1 * mm2) then saves mm1 and mm2 (mul's rule reads them) and recomputes the tanh.
`BackwardGraph.saved` lists the saved forward nodes and `recomputed` the forward nodes recomputed in the backward
graph (both after dead code is removed).

Gradient contributions to one node are summed once all of them are in. Those of plain slices along one dim
(x[a:b] of chunk or split; `_SlicePiece`) and of int indices (x[t], read as x[t:t+1] without that dim) are laid out
by one `cat`, gaps filled with zeros (pieces of one range are added first, other overlapping slices after), rather
than written each into a zero tensor of x's shape and summed: the packed q/k/v projection of an attention gets its
weight gradient as one cat of three (or one matmul, when the cat feeds it), and an RNN's input projection, read a
step at a time, one cat of T steps (written per step and summed, its bytes grew as T squared).
"""
from __future__ import annotations

from runtime.nn import Module
from runtime.ops import Kind, apply

from ..graph import Node, nodes_in
from ..graph_module import GraphModule
from ..prims import Prim
from ..symbolic import Shape
from .decompose import GraphBuilder, MetaValue, building
from .fusion import nbytes
from .views import is_view_node


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
    def __init__(self, forward: GraphModule, wrt: list[Node], saved_leaves: set):
        self.forward = forward
        self.saved_leaves = saved_leaves  # leaves a first run saved: free for recomputation (see the module doc)
        self.builder = GraphBuilder(None)
        self.position = {n: i for i, n in enumerate(forward.graph.nodes)}
        self.values: dict[Node, MetaValue] = {}
        self.saved: dict[Node, Node] = {}       # forward node -> its placeholder in the backward graph
        self.recomputed: dict[Node, Node] = {}  # forward node -> the backward node recomputing it
        self.requires = _requires_grad(forward.graph, set(wrt))

    def value(self, node: Node) -> MetaValue:
        """The forward value of `node` inside the backward graph: recomputed or saved (see the module doc)."""
        found = self.values.get(node)
        if found is None:
            cone = self._recompute_cone(node)
            if cone is None:
                found = self.values[node] = self._save(node)
            else:
                for n in cone:  # graph order: a node's cone inputs are recomputed before it
                    self.values[n] = self._recompute(n)
                found = self.values[node]
        return found

    def _available(self, node: Node) -> bool:
        """Whether the backward has node's value without recomputing or saving anything more."""
        return node in self.values or node.op in ("placeholder", "get_attr")

    def _recompute_cone(self, node: Node):
        """The nodes to recompute (in graph order) to get `node` back, or None when `node` should be saved."""
        if not _recomputable(node) or _read_with_broadcasting(node):
            return None
        cone, leaves, stack = set(), set(), [node]
        extra, size = 0, nbytes(_storage(node))
        while stack:
            n = stack.pop()
            if n in cone:
                continue
            cone.add(n)
            for a in n.all_input_nodes:
                if self._available(a) or a in cone:
                    continue
                # NOTE: a view's base is a leaf: the forward stores it anyway (its readers index it), so the
                # backward reads it too rather than recomputing it
                # NOTE: and a value read with broadcasting (a norm's mean or rstd) is a leaf: recomputed in the
                # backward it would be a small kernel of its own, since fusion merges chains of one shape only
                if _recomputable(a) and (is_view_node(a) or not is_view_node(n)) and not _read_with_broadcasting(a):
                    stack.append(a)
                elif a not in self.saved_leaves and a not in leaves:
                    leaves.add(a)
                    extra += nbytes(a)
                    # NOTE: leaves only add bytes, so saving `node` is decided (a deep cone, an RNN's history, is not
                    # walked to its end for each of its nodes); with symbolic sizes the comparison would add a guard
                    if type(extra) is int and type(size) is int and extra > size:
                        return None
        if extra > size or extra == size and _saved_on_a_tie(node, leaves):
            return None
        return sorted(cone, key=self.position.__getitem__)

    def _recompute(self, node: Node) -> MetaValue:
        args = tuple(self.value(a) if isinstance(a, Node) else a for a in node.args)
        origin, self.builder.origin = self.builder.origin, node
        try:
            result = node.target(*args, **node.kwargs)
        finally:
            self.builder.origin = origin
        self.recomputed[node] = result.node
        return result

    def _save(self, node: Node) -> MetaValue:
        placeholder = self.builder.node("placeholder", f"saved_{node.name}", name=f"saved_{node.name}",
                                        shape=node.meta["shape"], dtype=node.meta["dtype"])
        self.saved[node] = placeholder
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


def _storage(node: Node) -> Node:
    """The node whose memory a saved `node` keeps alive: a view's base (a view holds its whole base), else itself."""
    while is_view_node(node) and isinstance(node.args[0], Node) and "shape" in node.args[0].meta:
        node = node.args[0]
    return node


def _recomputable(node: Node) -> bool:
    """A cheap primitive the backward may recompute: an elementwise prims.* call that is not opaque, or a view of one
    tensor (it costs nothing where fusion folds it into the kernels reading it, nnc.passes.views)."""
    if "opaque_reason" in node.meta:
        return False
    return node.op == "call_function" and isinstance(node.target, Prim) \
        and (node.target.op.kind == Kind.ELEMENTWISE or is_view_node(node))


def _saved_on_a_tie(node: Node, leaves: set) -> bool:
    """Whether `node` is saved rather than recomputed when its leaves take as many bytes as it does.

    Saved: a value the forward writes anyway, unless it is a view (views fold into their readers, so recomputing
    one costs nothing): recomputed in the backward, it would be a kernel of its own there (a copy before a matmul).
    A view written anyway is saved only when some leaf is not written (saving that leaf would cost the forward an
    extra write)."""
    return _written(node) and (not is_view_node(node) or not all(_written(a) for a in leaves))


def _read_with_broadcasting(node: Node) -> bool:
    """Whether an elementwise user of `node` has another shape: it reads `node` broadcast (nnc.passes.fusion)."""
    shape = Shape(node.meta["shape"])
    return any(_recomputable(u) and not is_view_node(u) and "shape" in u.meta and Shape(u.meta["shape"]) != shape
               for u in node.users)


def _written(node: Node) -> bool:
    """Whether the forward writes node's value to memory anyway: fusion keeps a value inside a kernel only when
    elementwise ops and reductions read it."""
    return any(not (u.op == "call_function" and isinstance(u.target, Prim)
                    and u.target.op.kind in (Kind.ELEMENTWISE, Kind.REDUCTION)) for u in node.users)


def _requires_grad(graph, wrt: set) -> set:
    """Forward nodes whose value depends on a node in `wrt` through differentiable, floating ops."""
    requires = set()
    for node in graph.nodes:
        if node in wrt:
            requires.add(node)
        elif node.op == "call_function" and isinstance(node.target, Prim) and node.target.op.differentiable \
                and node.meta.get("dtype") is not None and node.meta["dtype"].is_differentiable \
                and any(n in requires for n in node.all_input_nodes):
            requires.add(node)
        elif node.op in ("call_function", "call_method", "call_module") and "opaque_reason" in node.meta \
                and any(n in requires for n in node.all_input_nodes):
            raise AutodiffError(f"node {node.name} ({node.meta['opaque_reason']}) cannot be differentiated "
                                f"symbolically")
    return requires


def _fit(grad: MetaValue, node: Node) -> MetaValue:
    """Sum a gradient over broadcast dims and cast it to the input's dtype (as eager autograd does)."""
    shape, dtype = Shape(node.meta["shape"]), node.meta["dtype"]
    lead = len(grad.shape) - len(shape)
    if lead > 0 and Shape(grad.shape[lead:]) == shape:
        # NOTE: sum_to_size sums with keepdim and reshapes; summing the leading dims away gives the shape at once,
        # with no reshape to run after the fused kernel (a bias gradient).
        grad = apply("sum", grad, dims=tuple(range(lead)), keepdim=False)
    elif Shape(grad.shape) != shape:
        grad = grad.sum_to_size(shape)
    if grad.dtype is not dtype:
        grad = grad.to(dtype)
    return grad


class _SlicePiece:
    """The gradient of a plain slice x[..., start:stop, ...] along one dim, before it is placed into x's shape."""

    __slots__ = ("dim", "start", "stop", "grad")

    def __init__(self, dim: int, start: int, stop: int, grad: MetaValue):
        self.dim, self.start, self.stop, self.grad = dim, start, stop, grad


def _slice_piece(node: Node, requires: set):
    """(dim, start, stop, is_int) when `node` is a getitem of a differentiable tensor that cuts one dim of concrete
    size (the others whole) by a slice with step 1 or by an int (x[t] reads x[t:t+1] with that dim dropped), else
    None."""
    if not (isinstance(node.target, Prim) and node.target.op.name == "getitem" and len(node.args) == 1
            and node.args[0] in requires):
        return None
    shape, key = node.args[0].meta["shape"], node.kwargs["key"]
    if len(key) > len(shape) or not all(_plain_slice(item) or _int_index(item) for item in key):
        return None
    cut = [(d, item) for d, item in enumerate(key) if item[0] == "int" or item[1:3] not in ((None, None), (0, None))]
    if len(cut) > 1:
        return None
    dim, item = cut[0] if cut else (0, ("slice", None, None, None))
    size = shape[dim]
    if not isinstance(size, int):
        return None
    if item[0] == "int":
        start = item[1] + size if item[1] < 0 else item[1]
        return dim, start, start + 1, True
    start, stop, _ = slice(item[1], item[2]).indices(size)
    return dim, start, max(start, stop), False


def _plain_slice(item) -> bool:
    return item[0] == "slice" and item[3] in (None, 1)


def _int_index(item) -> bool:
    return item[0] == "int" and isinstance(item[1], int)


def _total(parts: list, node: Node) -> MetaValue:
    """The sum of one node's gradient contributions. Slice pieces along one dim that do not overlap become one
    `cat` (gaps filled with zeros) instead of a zero tensor written per slice and added up: the gradient of
    chunk/split, such as an attention's packed q, k, v projection weight, or of an RNN's per-step reads x[t].
    Pieces of the same range (x[t] read twice) are added first."""
    pieces = _merge_repeats([p for p in parts if isinstance(p, _SlicePiece)])
    terms = _joined_products([p for p in parts if not isinstance(p, _SlicePiece)])
    for dim in dict.fromkeys(p.dim for p in pieces):
        placed, end = [], 0
        for p in sorted((p for p in pieces if p.dim == dim), key=lambda p: p.start):
            if p.start >= end:
                placed.append(p)
                end = p.stop
            else:  # overlaps a placed piece: its own zero tensor, added
                terms.append(_placed(p, [p], node))
        terms.append(_placed(placed[0], placed, node))
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _joined_products(terms: list) -> list:
    """The terms with thin products of one shape joined: a_1 @ b_1 + ... + a_T @ b_T (2-D, [M, K_t] @ [K_t, N], each
    reading fewer elements than it writes) is cat(a, 1) @ cat(b, 0), one product summing over every K_t.

    NOTE: a recurrent weight's gradient is a sum of one such product per step (h_t^T @ dgates_t, K the batch):
    T small matrix products and T - 1 additions of [M, N] become two copies of the operands and one product."""
    keys = [_thin_product(t) for t in terms]
    groups: dict[tuple, list] = {}
    for key, t in zip(keys, terms):
        if key is not None:
            groups.setdefault(key, []).append(t)
    out, joined = [], set()
    for key, t in zip(keys, terms):
        if key is None or len(groups[key]) == 1:
            out.append(t)
        elif key not in joined:  # the group's first term: the joined product stands in its place
            joined.add(key)
            out.append(_join(groups[key]))
    return out


def _thin_product(value):
    """(M, N, dtype) when `value` is a 2-D product a @ b whose operands have fewer elements than it, else None."""
    node = getattr(value, "node", None)
    if node is None or not (isinstance(node.target, Prim) and node.target.op.name == "matmul") or node.kwargs:
        return None
    a, b = node.args
    shapes = [x.meta.get("shape") for x in (a, b, node)]
    if any(shape is None or len(shape) != 2 or not all(isinstance(d, int) for d in shape) for shape in shapes):
        return None
    (m, k), (_, n) = shapes[0], shapes[1]
    return (m, n, node.meta.get("dtype")) if k * (m + n) < m * n else None


def _join(products: list) -> MetaValue:
    """One product of the concatenated operands of products a_t @ b_t (see _joined_products)."""
    builder = products[0].builder
    a = apply("cat", *(MetaValue(p.node.args[0], builder) for p in products), dim=1)
    b = apply("cat", *(MetaValue(p.node.args[1], builder) for p in products), dim=0)
    return apply("matmul", a, b)


def _merge_repeats(pieces: list) -> list:
    """The pieces with those of one (dim, start, stop) summed into one, in first-seen order."""
    merged: dict[tuple, _SlicePiece] = {}
    for p in pieces:
        key = (p.dim, p.start, p.stop)
        seen = merged.get(key)
        merged[key] = p if seen is None else _SlicePiece(*key, seen.grad + p.grad)
    return list(merged.values())


def _placed(first: _SlicePiece, pieces: list, node: Node) -> MetaValue:
    """The pieces (sorted, disjoint, along one dim) laid into zeros of node's shape: a `cat` with zero gaps."""
    shape, dim = list(node.meta["shape"]), first.dim
    if len(pieces) == 1 and (first.start, first.stop) == (0, shape[dim]):
        return first.grad
    chunks, at = [], 0
    for p in pieces + [_SlicePiece(dim, shape[dim], shape[dim], None)]:
        if p.start > at:
            gap = shape[:dim] + [p.start - at] + shape[dim + 1:]
            chunks.append(first.grad.new_zeros(tuple(gap)))
        if p.grad is not None:
            # NOTE: an empty piece stays in: the gradient then still depends on the output's gradient, which
            # decides whether it is None (nothing reached it) or zeros, as in eager autograd
            chunks.append(p.grad)
        at = p.stop
    return chunks[0] if len(chunks) == 1 else apply("cat", *chunks, dim=dim)


def build_backward(forward: GraphModule, wrt: list[Node]) -> BackwardGraph:
    """The backward of `forward` (a decomposed GraphModule with shape meta) for the nodes in `wrt`.

    Built twice: the second run knows which leaves the first one saved (see the module doc)."""
    first = _build(forward, wrt, saved_leaves=set())
    return _build(forward, wrt, saved_leaves={n for n in first.saved if not _recomputable(n)})


def _build(forward: GraphModule, wrt: list[Node], saved_leaves: set) -> BackwardGraph:
    diff = _Differentiator(forward, wrt, saved_leaves)
    builder = diff.builder
    with building(builder):
        outputs = [n for n in nodes_in(forward.graph.output_node.args[0]) if n in diff.requires]
        parts: dict[Node, list] = {}  # node -> its gradient contributions, summed once all are in
        for out in outputs:
            placeholder = builder.node("placeholder", f"grad_{out.name}", name=f"grad_{out.name}",
                                       shape=out.meta["shape"], dtype=out.meta["dtype"])
            parts[out] = [MetaValue(placeholder, builder)]
        for node in reversed(forward.graph.nodes):
            if node not in parts or node.op != "call_function" or node in wrt and node.op == "placeholder":
                continue
            builder.origin = node
            grad = parts[node] = [_total(parts[node], node)]
            piece = _slice_piece(node, diff.requires)
            if piece is not None:
                dim, start, stop, is_int = piece
                g = grad[0].unsqueeze(dim) if is_int else grad[0]
                parts.setdefault(node.args[0], []).append(_SlicePiece(dim, start, stop, g))
                continue
            for arg, gi in diff.input_gradients(node, grad[0]):
                parts.setdefault(arg, []).append(gi)
        results = []
        for n in wrt:
            builder.origin = n
            results.append(builder.graph_arg(_total(parts[n], n)) if n in parts else None)
        builder.origin = None
        results = tuple(results)
        builder.node("output", "output", (results,))
    _move_placeholders_first(builder.graph)
    gm = GraphModule(Module(), builder.graph, class_name="Backward")
    gm.graph.eliminate_dead_code()
    saved = _drop_unread_saved(gm.graph, diff.saved)
    recomputed = [n.name for n, new in diff.recomputed.items() if new.graph is gm.graph]
    gm.invalidate()
    gm.graph.lint(gm)
    return BackwardGraph(gm, saved, outputs, list(wrt), recomputed)


def _drop_unread_saved(graph, saved: dict) -> list[Node]:
    """The saved forward nodes the backward still reads; placeholders of the others are erased.

    NOTE: a rule retried with values (_NeedsValue) asks for every input, and some of what it built is dead."""
    kept = []
    for node, placeholder in saved.items():
        if placeholder.users:
            kept.append(node)
        else:
            graph.erase_node(placeholder)
    return kept


def _move_placeholders_first(graph) -> None:
    """Saved-value placeholders appear while rules run; a graph lists its placeholders first."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    grads = [n for n in placeholders if n.name.startswith("grad_")]
    saved = [n for n in placeholders if not n.name.startswith("grad_")]
    rest = [n for n in graph.nodes if n.op != "placeholder"]
    graph.nodes[:] = saved + grads + rest
