"""Copies folded into the producing kernel's store: a product only copied into another layout is written there.

After fusion, a `clone` kernel that copies a permuted (or reshaped) view of a matmul's product into a C-contiguous
buffer, and a `cat` whose pieces are such products (attention's output heads merged back into (B, T, C); the q, k
and v gradients gathered into the packed projection's layout), are copies of values nobody else reads. `fold_stores`
removes them: the matmul kernel stores its product straight into the copy's buffer through the inverse of the
views in between (a `Store`: the product's place in the target's C-contiguous buffer as offset and element
strides), so the copy never runs.

A cat is folded only when every piece is such a product. Its first producer (in kernel order) holds the cat node and
allocates its buffer; the later ones list it in `meta["writes_into"]` and write their slices into that array. The
memory planner counts those writes as uses, so the buffer is never shared while a producer still writes it.

Which products qualify (`storable`, `writes_rows`): a matmul kernel with no epilogue whose batched product runs
through np.matmul (a strided `out` whose rows or columns run along unit strides, so BLAS writes it) or the batched
loop (rows anywhere); the product is read by nothing but the chain of
views (reshape, permute) to the copy, every view has one reader, and the inverse of each view is a view again (a
reshape that would need a copy, a slice or an expand is not undone). Symbolic sizes and size-0 values are left as they
are.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Graph, Node
from ..kernel import Kernel, matmul_nodes
from ..prims import Prim
from ..symbolic import has_symbols
from .views import is_view_node


@dataclass(frozen=True)
class Store:
    """`value` (computed by the kernel) lives in `target`'s C-contiguous buffer: element (i_0, ..., i_n) of it at
    target.flat[offset + sum(i_k * strides[k])]. `through` are the nodes between them that run in no kernel: the
    views and the copies (clones, the cat) the store replaces, in graph order."""

    value: Node
    target: Node
    offset: int
    shape: tuple
    strides: tuple
    through: tuple

    def view(self, array: np.ndarray) -> np.ndarray:
        """The value's place in `array` (the target's C-contiguous array) as a writeable numpy view."""
        if not array.flags.c_contiguous:
            raise ValueError(f"the store target {getattr(self.target, 'name', self.target)} must be C-contiguous")
        itemsize = array.dtype.itemsize
        return np.ndarray(self.shape, array.dtype, buffer=array, offset=self.offset * itemsize,
                          strides=tuple(s * itemsize for s in self.strides))


def fold_stores(kernels: list[Kernel], graph: Graph) -> list[Kernel]:
    """The kernels with copies folded into their producers' stores (see the module docstring), renumbered."""
    graph = getattr(graph, "graph", graph)
    outputs = set(graph.output_node.all_input_nodes)
    kernels = list(kernels)
    for copy in [k for k in kernels if _is_clone_kernel(k)]:
        _fold_clone(copy, kernels, outputs)
    for cat in [k for k in kernels if k.kind == "cat"]:
        _fold_cat(cat, kernels, outputs)
    for k, kernel in enumerate(kernels):
        kernel.name = f"k{k}_{kernel.kind}"
    return kernels


def copy_nodes(kernel: Kernel) -> set:
    """The nodes of a kernel that its stores replace (clones, a cat): members that compute nothing themselves."""
    return {n for s in kernel.meta.get("stores", {}).values() for n in s.through if not is_view_node(n)}


def _is_clone_kernel(kernel: Kernel) -> bool:
    if kernel.kind != "elementwise" or len(kernel.nodes) != 1 or len(kernel.inputs) != 1:
        return False
    node = kernel.nodes[0]
    return (isinstance(node.target, Prim) and node.target.op.name == "clone" and len(node.all_input_nodes) == 1
            and node.meta.get("dtype") == kernel.inputs[0].meta.get("dtype"))


def _producer(kernels: list[Kernel], node: Node) -> Kernel | None:
    for kernel in kernels:
        if node in kernel.outputs:
            return kernel
    return None


def storable(kernel: Kernel) -> Node | None:
    """The product a matmul kernel can store anywhere (its one output, or the clone it already stores it into), or
    None: the kernel is one batched `matmul` node (np.matmul or the batched loop), with no epilogue."""
    from ..codegen.cpu_matmul import matmul_schedule
    from ..codegen.scalar import node_dtype, node_shape

    if kernel.kind != "matmul" or len(kernel.outputs) != 1 or kernel.meta.get("writes_into"):
        return None
    anchors = matmul_nodes(kernel)
    if len(anchors) != 1 or anchors[0].target.op.name != "matmul":
        return None
    mm = anchors[0]
    stores = kernel.meta.get("stores", {})
    if [n for n in kernel.nodes if n is not mm and n not in copy_nodes(kernel)]:
        return None  # an epilogue
    if stores and list(stores) != [mm]:
        return None
    a, b = mm.args[0], mm.args[1]
    values = (a, b, mm)
    if not all(isinstance(v, Node) and v.meta.get("shape") is not None for v in values):
        return None
    shapes = [tuple(v.meta["shape"]) for v in values]
    if has_symbols(shapes) or any(0 in s for s in shapes) or len(shapes[1]) < 3:
        return None
    form = matmul_schedule("matmul", node_shape(a), node_shape(b), node_dtype(a), node_dtype(b), node_dtype(mm)).form
    return kernel.outputs[0] if form in ("blas", "batched_small") else None


def _chain(base: Node, end: Node) -> list[Node] | None:
    """The view nodes from `base` to `end` (inclusive; [] when end is base), each the only reader of the last, in
    graph order; None when there is no such chain."""
    chain, n = [], end
    while n is not base:
        if not is_view_node(n) or len(n.users) != 1:
            return None
        chain.append(n)
        n = n.args[0]
    return chain[::-1]


def _undo(view: Node, place: np.ndarray) -> np.ndarray | None:
    """Where a view's source lies, given where the view's result lies (a stand-in array), or None when that is not
    a strided place (the view is a slice or an expand, or a reshape numpy could only undo with a copy)."""
    op = view.target.op.name
    try:
        if op == "permute":
            dims = [int(d) % place.ndim for d in view.kwargs["dims"]]
            return np.transpose(place, np.argsort(dims))
        if op == "reshape":
            return np.reshape(place, tuple(int(d) for d in view.args[0].meta["shape"]), copy=False)
    except (ValueError, TypeError, KeyError):
        return None
    return None


def _stand_in(shape) -> np.ndarray:
    """A C-contiguous layout of `shape` over one byte (element strides in bytes; no data is ever read)."""
    strides, step = [0] * len(shape), 1
    for k in reversed(range(len(shape))):
        strides[k], step = step, step * shape[k]
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), tuple(shape), tuple(strides))


def _place(target: Node, region, views: list[Node], value: Node, stand: np.ndarray | None = None) -> Store | None:
    """The Store of `value` in `target`'s buffer: `region` picks the copy's destination in the target's stand-in,
    then each of `views` (value -> the copy's source, graph order) is undone."""
    stand = _stand_in(tuple(int(d) for d in target.meta["shape"])) if stand is None else stand
    place = region(stand)
    for view in reversed(views):
        place = _undo(view, place)
        if place is None:
            return None
    shape = tuple(int(d) for d in value.meta["shape"])
    if tuple(place.shape) != shape or any(s < 0 for s in place.strides):
        return None
    if any(s == 0 and n > 1 for s, n in zip(place.strides, shape)):
        return None  # every element needs a place of its own
    offset = place.__array_interface__["data"][0] - stand.__array_interface__["data"][0]
    return Store(value, target, int(offset), shape, tuple(int(s) for s in place.strides), ())


def writes_rows(store: Store, form: str) -> bool:
    """Whether the matmul's code can write the product at the store's place: np.matmul with a unit stride along its
    last or second-last dim (BLAS then writes it directly); the batched loop anywhere (rows at strided places)."""
    if form == "batched_small":
        return True
    return len(store.shape) >= 2 and (store.strides[-1] == 1 or store.strides[-2] == 1)


def _form(kernel: Kernel) -> str:
    from ..codegen.cpu_matmul import matmul_schedule_of

    return matmul_schedule_of(kernel).form


def _fold_clone(copy: Kernel, kernels: list[Kernel], outputs: set) -> None:
    clone = copy.nodes[0]
    source = clone.args[0]
    views = copy.meta.get("views", {})
    base = views[source].base if source in views else source
    producer = _producer(kernels, base)
    if producer is None or storable(producer) is not base or base in outputs or producer.meta.get("stores"):
        return
    chain = _chain(base, source) if source is not base else []
    if chain is None or len(base.users) != 1:
        return
    store = _place(clone, lambda s: s, chain, base)
    if store is None or not writes_rows(store, _form(producer)):
        return
    store = Store(base, clone, store.offset, store.shape, store.strides, tuple(chain) + (clone,))
    producer.nodes.append(clone)
    producer.outputs = [clone]
    producer.meta["stores"] = {base: store}
    producer.meta["ops"] = producer.meta.get("ops", []) + ["clone"]
    producer.meta["boundaries"] = copy.meta.get("boundaries", [])
    through = ", ".join(v.name for v in chain) or "no view"
    producer.reason = (f"{base.name} is stored straight into {clone.name}'s layout (through {through}: the copy "
                       f"runs in no kernel of its own); " + copy.reason)
    kernels.remove(copy)


def _fold_cat(cat_kernel: Kernel, kernels: list[Kernel], outputs: set) -> None:
    cat = cat_kernel.nodes[0]
    dim = int(cat.kwargs["dim"]) % len(cat.meta["shape"])
    views = cat_kernel.meta.get("views", {})
    stand = _stand_in(tuple(int(d) for d in cat.meta["shape"]))
    plans, start = [], 0
    for arg in cat.args:
        size = int(arg.meta["shape"][dim])
        region = (lambda lo, hi: lambda s: s[(slice(None),) * dim + (slice(lo, hi),)])(start, start + size)
        start += size
        plan = _cat_piece(arg, views, cat, region, stand, kernels, outputs)
        if plan is None:
            return
        plans.append(plan)
    order = {id(k): i for i, k in enumerate(kernels)}
    producers = [p for p, _ in plans]
    if len({id(p) for p in producers}) != len(producers):
        return  # a kernel writes one place
    first = min(producers, key=lambda k: order[id(k)])
    first_value = next(store.value for producer, store in plans if producer is first)
    for producer, store in plans:
        producer.meta["stores"] = {store.value: store}  # a clone it wrote before is now a step on the way
        if producer is first:
            producer.nodes.append(cat)
            producer.outputs = [cat]
            producer.meta["ops"] = producer.meta["ops"] + ["cat"]
            producer.meta["boundaries"] = cat_kernel.meta.get("boundaries", [])
            readers = [r for p, _, r in cat_kernel.meta.get("boundaries", []) if p == cat.name]
            producer.reason = (f"{store.value.name} is stored straight into its slice of {cat.name} (the cat runs "
                               f"in no kernel of its own: each piece's producer writes its slice)"
                               + "".join(f"; {r}" for r in dict.fromkeys(readers)))
        else:
            producer.outputs = []
            producer.meta["writes_into"] = [cat]
            producer.meta["boundaries"] = []
            producer.reason = (f"{store.value.name} is stored straight into its slice of {cat.name}, which the "
                               f"kernel storing {first_value.name} allocates")
    kernels.remove(cat_kernel)


def _cat_piece(arg: Node, views: dict, cat: Node, region, stand, kernels, outputs):
    """(the producer, its Store in the cat's buffer) for one piece of a cat, or None when it cannot be stored."""
    if not isinstance(arg, Node) or list(cat.args).count(arg) != 1:
        return None
    base = views[arg].base if arg in views else arg
    producer = _producer(kernels, base)
    if producer is None or storable(producer) is not base or base in outputs or len(base.users) != 1:
        return None
    chain = _chain(base, arg) if arg is not base else []
    if chain is None:
        return None
    old = producer.meta.get("stores", {})
    if old:  # base is a clone the producer already stores its product into: go on through that clone's views
        (prior,) = old.values()
        value, views_to_cat = prior.value, list(prior.through[:-1]) + chain
        through = tuple(prior.through) + tuple(chain) + (cat,)
    else:
        value, views_to_cat, through = base, chain, tuple(chain) + (cat,)
    placed = _place(cat, region, views_to_cat, value, stand)
    if placed is None or not writes_rows(placed, _form(producer)):
        return None
    return producer, Store(value, cat, placed.offset, placed.shape, placed.strides, through)

