"""Kernel: the unit fusion produces and code generation consumes (a group of primitive nodes run as one)."""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime.ops import Kind

from .graph import Node
from .prims import Prim
from .symbolic import has_symbols

# The fusion lattice (as in TVM): a node may absorb producers of a lower or equal rank into its kernel.
ELEMENTWISE, BROADCAST, INJECTIVE, REDUCTION, OPAQUE = range(5)
RANK_NAMES = {ELEMENTWISE: "elementwise", BROADCAST: "broadcast", INJECTIVE: "injective",
              REDUCTION: "reduction", OPAQUE: "opaque"}


@dataclass
class Kernel:
    """A fused group of primitive (prims.*) call_function nodes from a decomposed graph.

    kind:
      - "elementwise": every node is elementwise with the same output shape `shape`; inputs broadcast to it.
      - "reduction": one pass over `shape` (the reductions' input shape) computes the elementwise prologue nodes
        and accumulates one or more reduction nodes (ops with an OpDef.reducer), all siblings: the same input shape, the
        same reduced dims and the same output shape, none reading another's result. Then elementwise epilogue
        nodes run on the reduced shape (they may read every reduction of the kernel, never a prologue value).
        Prologue nodes read outside the kernel are outputs, written by the pass (e.g. an input gradient written
        while the bias and weight gradients are summed).
      - "row": reductions of one signature whose results keep the reduced dims, chained: a later reduction or an
        elementwise node of `shape` (along the row) may read an earlier result broadcast along the row; elementwise
        nodes of the reduced shape run once per row. Code generation walks each row once per level of the chain
        (nnc.codegen.cpu_rows).
      - "matmul": one matmul/linear node (BLAS, or a generated loop for small-batch shapes) and elementwise
        epilogue nodes on its output shape (`shape`), e.g. bias add + activation; epilogue nodes that do not read
        the product (a relu mask only the epilogue reads) may come before it in `nodes`.
      - "window" / "gather" / "take" / "cat": a single node generated as a kernel of its own (own_kernel_kind):
        convolution's and pooling's sliding windows, a getitem/index_put along one dim by an integer index tensor,
        torch.gather or scatter_add along a dim, or a cat of static shapes and one dtype.
      - "opaque": a single node run as is (views, other indexing, ...): no code generation.
    nodes: the group's nodes in graph order.
    inputs: nodes outside the group whose values the group reads (tensors), in a fixed order.
    outputs: nodes of the group whose values are read outside it (or are graph outputs).
    reason: why the group ends here (the kernel boundary), e.g. "reduction output feeds a matmul".
    """

    name: str
    kind: str
    nodes: list[Node]
    inputs: list[Node]
    outputs: list[Node]
    shape: tuple
    reason: str = ""
    meta: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        ops = ", ".join(n.target.op.name if hasattr(n.target, "op") else str(n.target) for n in self.nodes)
        return f"Kernel({self.name}: {self.kind} [{ops}] shape={list(self.shape)} reason={self.reason!r})"


def view_node(kernel: Kernel) -> Node | None:
    """The node of an opaque kernel that is one view of one tensor, else None: a shape op whose result may alias its
    input (`is_view`) and that reads nothing but that input and attributes (reshape, permute, expand; not getitem,
    which also reads index tensors). numpy makes it a view where it can (a copy where it cannot): the executor and
    the whole-graph function run it on arrays, with no generated code."""
    if kernel.kind != "opaque" or len(kernel.nodes) != 1:
        return None
    node = kernel.nodes[0]
    if not isinstance(node.target, Prim) or not node.args or not isinstance(node.args[0], Node):
        return None
    op = node.target.op
    return node if op.kind == Kind.SHAPE and op.is_view and op.arity == 1 else None


def matmul_nodes(kernel: Kernel) -> list[Node]:
    """The matmul/linear nodes of a kernel (a "matmul" kernel has exactly one, its anchor)."""
    return [n for n in kernel.nodes if isinstance(n.target, Prim) and n.target.op.kind == Kind.MATMUL]


GATHER_OPS = ("getitem", "index_put")
_FULL_SLICE = ("slice", None, None, None)


def gather_dim(node: Node) -> int | None:
    """The indexed dim when `node` is a getitem or index_put whose key is one integer index tensor among full slices
    (the form gather kernels take: x[idx], x[:, idx], x[:, [-1], :]); None otherwise."""
    if node.op != "call_function" or not isinstance(node.target, Prim) or node.target.op.name not in GATHER_OPS:
        return None
    key = node.kwargs.get("key")
    if not isinstance(key, tuple) or ("tensor", 0) not in [tuple(item) for item in key]:
        return None
    dim = [tuple(item) for item in key].index(("tensor", 0))
    if any(tuple(item) != _FULL_SLICE for k, item in enumerate(key) if k != dim):
        return None
    first = 1 if node.target.op.name == "getitem" else 2  # the index tensors follow x (and index_put's values)
    if len(node.args) != first + 1:
        return None
    index = node.args[first]
    if not isinstance(index, Node) or index.meta.get("dtype") is None:
        return None
    dtype = index.meta["dtype"]
    if getattr(dtype, "is_differentiable", True) or getattr(dtype, "name", "bool") == "bool":
        return None  # a bool index is a mask: another operation
    if node.meta.get("shape") is None or node.args[0].meta.get("shape") is None:
        return None
    return dim


def own_kernel_kind(node: Node) -> str | None:
    """The kind of kernel a node is alone in, generated but never grown: its op's `kernel_kind` ("window": the
    sliding-window ops of convolution and pooling), "gather" for a getitem/index_put of one integer index tensor
    after full slices (see gather_dim), "take" for torch.gather / scatter_add (is_take), "cat" for a plain cat
    (is_plain_cat); None for every other node."""
    if node.op != "call_function" or not isinstance(node.target, Prim) or interpreted_dtype(node):
        return None
    if node.target.op.kernel_kind is not None:
        return node.target.op.kernel_kind
    if gather_dim(node) is not None:
        return "gather"
    if is_take(node):
        return "take"
    return "cat" if is_plain_cat(node) else None


# The dtypes no code generator has arithmetic for (numba has no complex kernels here, no bfloat16 type and no float16
# arithmetic on the CPU): nodes of them run in numpy, as eager computes them.
INTERPRETED_DTYPES = ("complex64", "complex128", "float16", "bfloat16")


def interpreted_dtype(node: Node) -> str | None:
    """The name of a dtype in INTERPRETED_DTYPES that a node computes or reads, if any: numpy runs such a node (the
    interpreter), quietly, as an opaque step (an autocast cast to bfloat16 and the matmul after it)."""
    for value in (node,) + tuple(node.all_input_nodes):
        name = getattr(value.meta.get("dtype"), "name", None)
        if name in INTERPRETED_DTYPES:
            return name
    return None


def is_take(node: Node) -> bool:
    """A gather or scatter_add along one dim (torch.gather's form) with static shapes that eager would accept
    without broadcasting: the index no larger than x off the dim, a scatter's src of the index's shape and x's dtype
    (nnc.codegen.cpu_take). Others run as is."""
    if node.target.op.name not in ("gather", "scatter_add"):
        return False
    values = [node] + list(node.args)
    if not all(isinstance(v, Node) and v.meta.get("shape") is not None for v in values):
        return False
    shapes = [tuple(v.meta["shape"]) for v in values]
    if has_symbols(shapes) or len({len(s) for s in shapes}) != 1 or not shapes[0]:
        return False
    x, index = shapes[1], shapes[2]
    dim = node.kwargs["dim"] % len(x)
    if any(i > s for d, (i, s) in enumerate(zip(index, x)) if d != dim):
        return False
    if node.target.op.name == "scatter_add":
        src = node.args[2]
        return shapes[3] == index and src.meta.get("dtype") == node.args[0].meta.get("dtype") == node.meta.get("dtype")
    return True


def is_plain_cat(node: Node) -> bool:
    """A cat whose inputs and result have static shapes and one dtype: a copy loop per input (nnc.codegen.cpu_cat).
    A cat of symbolic sizes (a growing cache) or one that promotes dtypes runs as is."""
    if node.target.op.name != "cat" or node.meta.get("shape") is None:
        return False
    values = [node] + [a for a in node.args if isinstance(a, Node)]
    if len(values) != len(node.args) + 1 or any(v.meta.get("shape") is None for v in values):
        return False
    return (not has_symbols([v.meta["shape"] for v in values])
            and len({v.meta.get("dtype") for v in values}) == 1)
