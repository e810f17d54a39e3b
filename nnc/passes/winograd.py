"""Winograd convolution: rewrite a 3x3, stride-1, dilation-1 convolution's `matmul(weight, im2col(x))` into the
Winograd ops of runtime/_winograd.py, so that its product and both of its gradients' products do 2.25x (F(2x2, 3x3))
or 4x (F(4x4, 3x3)) fewer multiplies, and no im2col or col2im runs.

    matmul(W (O, C*9), im2col(x))  ->  winograd_output(matmul(winograd_filter(W'), winograd_input(x)))

with W' the (O, C, 3, 3) weight; when the product's only use is conv2d's bias add and the views to (N, O, Ho, Wo), the
output transform takes them, and a relu that is their only use: winograd_output_bias(M, bias, relu), one kernel that
stores act(A^T M A + bias) straight into the convolution's layout. The backward comes from autodiff: the three ops
are linear (winograd_output_bias affine), so their gradients are their adjoints (`*_backward`, after the relu's
mask), and the matmul's are two more batched products (dU = dM @ V^T over the tiles, dV = U^T @ dM), which replace
the weight-gradient product over the column matrix and the col2im of W^T @ dY.
Eager conv2d keeps im2col: the rewrite is a compiler choice, tested against it. It runs before autodiff, on CPU
graphs only (CUDA has no Winograd kernels), for float32 and float64 with static sizes.
"""
from __future__ import annotations

import numpy as np

from runtime import _winograd

from ..codegen.cpu_small_gemm import takes_batched_rows
from ..codegen.scalar import np_dtype
from ..graph import Node
from ..prims import Prim, prims
from ..symbolic import has_symbols

# Fewer input channels than this keep im2col: each output then sums so few products that the transforms, which
# read and write every tile's T*T values, cost more than the multiplies they save (the MNIST CNN's conv1, C = 1).
MIN_CHANNELS = 8
# A convolution whose direct product has fewer multiply-adds than MIN_DIRECT_WORK keeps im2col, unless its T*T
# small products run as the generated loop (nnc.codegen.cpu_small_gemm: short sums into short rows, a small
# batch) and it has at least MIN_LOOPED_DIRECT_WORK. As BLAS calls the T*T products lose to im2col's one product,
# which two threads share well. NOTE: MNIST CNN batch-1 inference (conv2: 10.6 M multiply-adds direct, 36
# products of 64 x 32 x 36 with F(4x4)), loaded machine, minimums: 2 threads 181-197 us with Winograd's products in
# BLAS against 164-167 us with im2col; 1 thread 195 against 260 us. At batch 64 (680 M) it wins either way. With the
# products in the loop, one thread (numba and OpenBLAS), loaded machine: 185-200 us against 263-271 us with im2col
# (tools/bench_compile.py --threads 1: 0.66-0.69x torch eager against 0.90-0.93x).
MIN_DIRECT_WORK = 2 ** 25
MIN_LOOPED_DIRECT_WORK = 2 ** 23
# F(4x4, 3x3) for outputs at least this large in both dims, else F(2x2, 3x3) (a 4x4 tile over a smaller output
# computes mostly positions that are dropped).
# NOTE: F(4x4) float32 error against a float64 convolution: 5e-6 of the output's largest value on the MNIST CNN's
# conv2 (F(2x2): 3e-7, im2col: 1e-7); float64: 1e-14.
LARGE_TILE_MIN_OUTPUT = 8


def _is(node, name: str) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and isinstance(node.target, Prim) \
        and node.target.op.name == name


def _convolution(node: Node):
    """(weight (O, C*9) node, im2col node) if `node` is the product of a 3x3, stride-1, dilation-1 convolution
    Winograd serves, else None."""
    if not _is(node, "matmul") or len(node.args) != 2:
        return None
    w, cols = node.args
    if not _is(cols, "im2col") or not isinstance(w, Node):
        return None
    attrs = cols.kwargs
    if tuple(attrs["kernel"]) != (3, 3) or tuple(attrs["stride"]) != (1, 1) or tuple(attrs["dilation"]) != (1, 1):
        return None
    x = cols.args[0]
    x_shape, w_shape = x.meta.get("shape"), w.meta.get("shape")
    if x_shape is None or w_shape is None or has_symbols((x_shape, w_shape)) or len(x_shape) != 4:
        return None
    if any(n.meta.get("dtype") is None for n in (x, w, node)):
        return None
    dtypes = {np_dtype(n.meta["dtype"]) for n in (x, w, node)}
    if len(dtypes) != 1 or dtypes.pop() not in (np.float32, np.float64):
        return None
    if len(w_shape) != 2 or w_shape[1] != x_shape[1] * 9 or x_shape[1] < MIN_CHANNELS or x_shape[0] == 0:
        return None
    direct = w_shape[0] * w_shape[1] * cols.meta["shape"][1]
    if direct < MIN_DIRECT_WORK and not (direct >= MIN_LOOPED_DIRECT_WORK and _looped(x_shape, w_shape[0], attrs)):
        return None
    return w, cols


def _looped(x_shape, out_channels: int, attrs) -> bool:
    """Whether the Winograd products of this convolution run as the generated batched loop (not BLAS)."""
    n, c, h, w = x_shape
    out_sizes = _winograd.output_sizes((h, w), tuple(tuple(p) for p in attrs["padding"]))
    tile = tile_for(out_sizes)
    tiles = n * int(np.prod(_winograd.tile_counts(out_sizes, tile)))
    return takes_batched_rows((tile + 2) ** 2, out_channels, c, tiles)


def tile_for(out_sizes) -> int:
    """The output tile size m of F(m x m, 3x3) for an output of these sizes."""
    return 4 if min(out_sizes) >= LARGE_TILE_MIN_OUTPUT else 2


def _call(graph, name, args, meta_shape, dtype, **kwargs) -> Node:
    node = graph.call_function(prims[name], args, kwargs)
    node.meta.update(shape=tuple(meta_shape), dtype=dtype)
    return node


def _filter_of(graph, w: Node, shape: tuple, dtype) -> Node:
    """The (O, C, 3, 3) filter of the (O, C*9) product operand w: the value w reshapes (conv2d's weight), so that
    the filter transform reads the parameter itself (a reshape of a reshape runs as a step of its own), else a
    reshape of w."""
    if _is(w, "reshape") and isinstance(w.args[0], Node) and tuple(w.args[0].meta.get("shape") or ()) == shape:
        return w.args[0]
    return _call(graph, "reshape", (w,), shape, dtype, shape=shape)


def _only_user(node: Node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _epilogue(product: Node, n: int, o: int, out_sizes):
    """(bias (O,) or (O, 1) node, the (N, O, Ho, Wo) convolution node, its relu or None) when the convolution
    product's only use is conv2d's bias add, then a reshape to (O, N, Ho, Wo) and a permute to (N, O, Ho, Wo), each
    the previous one's only use; else None."""
    add = _only_user(product)
    if add is None or not _is(add, "add") or len(add.args) != 2 or add.kwargs:
        return None
    bias = add.args[1] if add.args[0] is product else add.args[0]
    if not isinstance(bias, Node) or bias is product or tuple(bias.meta.get("shape") or ()) not in ((o,), (o, 1)) \
            or bias.meta.get("dtype") != product.meta["dtype"] or add.meta.get("dtype") != product.meta["dtype"]:
        return None
    reshape = _only_user(add)
    if reshape is None or not _is(reshape, "reshape") or tuple(reshape.meta["shape"]) != (o, n) + tuple(out_sizes):
        return None
    conv = _only_user(reshape)
    if conv is None or not _is(conv, "permute") or tuple(conv.kwargs.get("dims", ())) != (1, 0, 2, 3):
        return None
    relu = _only_user(conv)
    return bias, conv, relu if relu is not None and _is(relu, "relu") else None


def _bias_vector(graph, bias: Node, o: int, dtype) -> Node:
    """The (O,) bias: the value a (O, 1) reshape reads (conv2d's bias parameter), else a reshape."""
    if tuple(bias.meta["shape"]) == (o,):
        return bias
    if _is(bias, "reshape") and isinstance(bias.args[0], Node) and tuple(bias.args[0].meta.get("shape") or ()) == (o,):
        return bias.args[0]
    return _call(graph, "reshape", (bias,), (o,), dtype, shape=(o,))


def _erase_unused(graph, nodes) -> None:
    """Erase the nodes (in order, each before the values it reads) that nothing uses any more."""
    for node in nodes:
        if isinstance(node, Node) and not node.users and node.op == "call_function":
            graph.erase_node(node)


def rewrite_winograd(gm):
    """Replace every convolution product Winograd serves (see _convolution) by the Winograd ops."""
    graph = gm.graph
    for node in list(graph.nodes):
        found = _convolution(node)
        if found is None:
            continue
        w, cols = found
        x, padding = cols.args[0], tuple(tuple(p) for p in cols.kwargs["padding"])
        n, c, h, wd = x.meta["shape"]
        o = w.meta["shape"][0]
        dtype = node.meta["dtype"]
        out_sizes = _winograd.output_sizes((h, wd), padding)
        tile = tile_for(out_sizes)
        t2 = (tile + 2) ** 2
        tiles = n * int(np.prod(_winograd.tile_counts(out_sizes, tile)))
        epilogue = _epilogue(node, n, o, out_sizes)
        with graph.inserting_before(node):
            w4 = _filter_of(graph, w, (o, c, 3, 3), dtype)
            u = _call(graph, "winograd_filter", (w4,), (t2, o, c), dtype, tile=tile)
            v = _call(graph, "winograd_input", (x,), (t2, c, tiles), dtype, tile=tile, padding=padding)
            m = _call(graph, "matmul", (u, v), (t2, o, tiles), dtype)
            if epilogue is None:
                y = _call(graph, "winograd_output", (m,), node.meta["shape"], dtype, tile=tile, size=out_sizes)
        if epilogue is None:
            node.replace_all_uses_with(y)
            graph.erase_node(node)
        else:
            bias, conv, relu = epilogue
            last = relu if relu is not None else conv
            with graph.inserting_before(last):  # after the bias, which may be computed after the product
                b = _bias_vector(graph, bias, o, dtype)
                y = _call(graph, "winograd_output_bias", (m, b), last.meta["shape"], dtype, tile=tile,
                          size=out_sizes, relu=relu is not None)
            last.replace_all_uses_with(y)
            reshape = conv.args[0]
            _erase_unused(graph, [relu, conv, reshape, reshape.args[0], node, bias])
        if not cols.users:
            graph.erase_node(cols)
    gm.invalidate()
    return gm
