"""CPU gather and scatter kernels: `getitem` with one integer index tensor after full slices (an embedding lookup,
index_select) and `index_put` of that form (their backward: the gradient's rows written or added into a tensor), as
generated loops.

x has shape A + (K,) + B (A: the sliced dims before the indexed one), the index tensor any shape I; the gathered
value has shape A + I + B. Every index is checked (numpy's wrap of -K..-1, anything else out of [-K, K) raises
IndexError) in a serial pass before any element moves. A gather copies rows of B in a loop over (a, i) tasks, a
prange when the elements moved reach PARALLEL_MIN_ELEMENTS; a scatter runs serially in index order, so repeated
indices accumulate (accumulate=True, numpy's add.at) or the last one wins, as numpy's does. A scatter's values have
the gathered shape, broadcast to it (static sizes), or are one value written everywhere (index_put's own gradient
writes zeros; a Python scalar, as index_fill_ writes, is a literal of the result's dtype). A serial kernel launched
on its own calls the same loops precompiled for every size (nnc.codegen.precompiled's gather_rows and scatter_rows)
instead of generating them, where its values are of the gathered shape or one value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..graph import Node
from ..kernel import Kernel, gather_dim
from ..symbolic import has_symbols
from .cpu_elementwise import (PARALLEL_MIN_ELEMENTS, Array, Function, KernelBuilder, ParallelLoop, indent, launch_line,
                              precompiled_call)
from .indexing import broadcast_strides, c_strides, emit_offsets, shifted
from .scalar import Unsupported, format_literal, node_dtype, node_shape


@dataclass(frozen=True)
class GatherSchedule(ParallelLoop):
    """How a gather/scatter kernel runs: `tasks` rows of `row` elements; a prange over the tasks (gathers only)."""

    op: str
    tasks: int
    row: int
    parallel: bool


def _geometry(kernel: Kernel):
    """(node, op name, dim, A size, K, I size, B size)."""
    if len(kernel.nodes) != 1:
        raise Unsupported("a gather kernel has exactly one node")
    node = kernel.nodes[0]
    dim = gather_dim(node)
    if dim is None:
        raise Unsupported(f"{node.name} is not a getitem/index_put of one integer index tensor after full slices")
    x_shape, out_shape = tuple(node_shape(node.args[0])), tuple(node_shape(node))
    op = node.target.op.name
    i_shape = tuple(node_shape(node.args[1] if op == "getitem" else node.args[2]))
    if op == "index_put" and isinstance(node.args[1], Node):
        values, gathered = tuple(node_shape(node.args[1])), _gathered_shape(node, dim)
        if values != gathered and math.prod(values) != 1:
            if has_symbols([values, gathered]):
                raise Unsupported(f"index_put values of shape {list(values)} would broadcast over symbolic sizes")
            broadcast_strides(values, gathered)  # (raises Unsupported unless they broadcast)
        if node_dtype(node.args[1]) != node_dtype(node) or node_dtype(node.args[0]) != node_dtype(node):
            raise Unsupported("index_put values and target must have the result's dtype")
    elif op == "index_put":
        if node.kwargs.get("accumulate"):
            raise Unsupported("an index_put adding a Python scalar (numpy's add.at casts it by its own rules)")
        if node_dtype(node.args[0]) != node_dtype(node):
            raise Unsupported("index_put target must have the result's dtype")
    outer, inner = math.prod(x_shape[:dim]), math.prod(x_shape[dim + 1:])
    return node, op, dim, outer, x_shape[dim], math.prod(i_shape), inner, out_shape


def _gathered_shape(node, dim: int) -> tuple:
    """A + I + B: the shape x[..., index, ...] has, which an index_put's values broadcast to."""
    x_shape, index = tuple(node_shape(node.args[0])), node.args[1 if node.target.op.name == "getitem" else 2]
    return x_shape[:dim] + tuple(node_shape(index)) + x_shape[dim + 1:]


def gather_schedule_of(kernel: Kernel) -> GatherSchedule:
    _, op, _, outer, _, n, inner, _ = _geometry(kernel)
    tasks = outer * n
    parallel = (op == "getitem" and not has_symbols([tasks, inner]) and tasks > 1
                and tasks * inner >= PARALLEL_MIN_ELEMENTS)
    return GatherSchedule(op, tasks, inner, parallel)


def _at(a: Array, expr: str) -> str:
    """Element `expr` of the value `a` reads: its argument at the (folded, contiguous) view's offset."""
    return f"{a.arg}[{shifted(expr, a.offset)}]"


def _out_of_range(k: str, dim: int) -> str:
    """The statement raising IndexError (torch's message) for an index outside [-k, k)."""
    where = f"[-{k}, {k}) for dim {dim} of size {k}" if k.isdigit() else f"the range of dim {dim}"
    return f"raise IndexError('index out of range in self: an index tensor holds a value outside {where}')"


def _check_indices(index: Array, n, k: str, dim: int) -> list[str]:
    """Lines raising IndexError unless every index lies in [-k, k)."""
    return [f"for i in range({n}):", f"    j = {_at(index, 'i')}", f"    if j < -{k} or j >= {k}:",
            f"        {_out_of_range(k, dim)}"]


def _wrapped(index: Array, k: int) -> list[str]:
    return [f"j = {_at(index, 'i')}", "if j < 0:", f"    j += {k}"]


def _reads(kb: KernelBuilder, node) -> list[Array | None]:
    """The Array each tensor argument of `node` is read through, in argument order (None for a Python scalar: an
    index_put's value); a folded view must be a contiguous run of its base (nnc.passes.views folds no other view
    into a gather kernel)."""
    arrays = []
    for arg in node.args:
        if not isinstance(arg, Node):
            arrays.append(None)
            continue
        a = kb.read_of(arg)
        if a.strides is not None and not _contiguous_run(a):
            raise Unsupported(f"{arg.name} is a strided view; a gather kernel reads contiguous runs only")
        arrays.append(a)
    return arrays


def _contiguous_run(a: Array) -> bool:
    """Whether a folded view reads its base's elements offset, offset + 1, ... in C order: its strides are the
    C-contiguous ones except along size-1 dims, where any stride reads the same element (the views pass folds such
    a permute of a [1, C, H, W] value)."""
    return all(n == 1 or s == c for n, s, c in zip(a.shape, a.strides, c_strides(a.shape)))


def _size(value) -> str:
    """A size as a generated expression: a number, or a symbolic polynomial in parentheses."""
    text = str(value)
    return text if text.isdigit() else f"({text})"


def _one_value(node, dim: int) -> bool:
    """Whether an index_put writes one value everywhere (index_put's own gradient writes zeros) rather than values
    of the gathered shape (when that shape has one element, its one value is read either way)."""
    return math.prod(node_shape(node.args[1])) == 1 and math.prod(_gathered_shape(node, dim)) != 1


def _scalar_literal(node) -> str:
    """An index_put's Python scalar value (index_fill_, `x[:, idx] = 0.0`) as a literal of the result's dtype,
    converted as numpy's assignment converts it (1.5 into int64 is 1); a value numpy refuses is left to the
    interpreter, which raises numpy's error."""
    d = node_dtype(node)
    cell = np.empty(1, dtype=d)
    try:
        cell[0] = node.args[1]
    except (TypeError, ValueError, OverflowError) as error:
        raise Unsupported(f"the value {node.args[1]!r} does not convert to {d}: {error}") from None
    return format_literal(cell[0].item(), d)


def _values_whole(node, dim: int) -> bool:
    """Whether an index_put's values are an array of the gathered shape or one value (what precompiled scatter_rows
    reads), not a Python scalar or values that broadcast."""
    return isinstance(node.args[1], Node) and (_one_value(node, dim)
                                               or tuple(node_shape(node.args[1])) == _gathered_shape(node, dim))


def _value_read(node, values: Array | None, dim: int) -> tuple[list[str], str]:
    """(lines, expression): the value an index_put writes at element `src + b` of the gathered shape, read from
    its values as they are, broadcast, one value for all, or a Python scalar (values None)."""
    if values is None:
        return [], _scalar_literal(node)
    if _one_value(node, dim):
        return [], _at(values, "0")
    shape, gathered = tuple(node_shape(node.args[1])), _gathered_shape(node, dim)
    if shape == gathered:
        return [], _at(values, "src + b")
    lines, (offset,) = emit_offsets(gathered, [broadcast_strides(shape, gathered)], "g", "v")
    return ["g = src + b", *lines], _at(values, offset)


def _precompiled_launch(kb: KernelBuilder, node, op: str, dim: int, arrays: list[Array], sizes) -> list[str]:
    """A serial gather or scatter as a call of nnc.codegen.precompiled's gather_rows or scatter_rows (compiled once
    for every shape), raising IndexError when it reports an index out of range."""
    outer, k, n, inner = sizes
    (out,) = kb.outs
    if op == "getitem":
        x, index = arrays
        call = precompiled_call(kb, "gather_rows", [x, x.offset, index, index.offset, out, outer, k, n, inner])
    else:
        x, values, index = arrays
        call = precompiled_call(kb, "scatter_rows", [x, x.offset, values, values.offset, index, index.offset, out,
                                                     outer, k, n, inner, int(bool(node.kwargs.get("accumulate"))),
                                                     int(_one_value(node, dim))])
    return [f"if not {call}:", f"    {_out_of_range(str(k), dim)}"]


def gen_gather(kb: KernelBuilder) -> None:
    node, op, dim, outer, k, n, inner, _ = _geometry(kb.kernel)
    sched = gather_schedule_of(kb.kernel)
    arrays = _reads(kb, node)
    whole = op == "getitem" or _values_whole(node, dim)
    if (kb.standalone and not sched.parallel and not has_symbols([outer, k, n, inner]) and len(kb.outs) == 1
            and whole):
        kb.launch = _precompiled_launch(kb, node, op, dim, arrays, (outer, k, n, inner))
        return
    value_lines, value = _value_read(node, arrays[1], dim) if op == "index_put" else ([], "")
    outer, k, n, inner, tasks, total = (_size(v) for v in (outer, k, n, inner, sched.tasks, outer * k * inner))
    if op == "getitem":  # x, index -> out0
        x, index = arrays
        lines = _check_indices(index, n, k, dim)
        lines += [f"for t in {sched.loop}({tasks}):", f"    a = t // {n}", f"    i = t % {n}"]
        lines += indent(_wrapped(index, k))
        lines += indent([f"src = (a * {k} + j) * {inner}", f"dst = t * {inner}",
                         f"for b in range({inner}):", f"    out0[dst + b] = {_at(x, 'src + b')}"])
    else:  # x, values, index -> out0 = x with values written (or added) at the indexed rows
        x, _, index = arrays
        store = "+=" if node.kwargs.get("accumulate") else "="
        lines = _check_indices(index, n, k, dim)
        lines += [f"for e in range({total}):", f"    out0[e] = {_at(x, 'e')}",
                  f"for t in range({tasks}):", f"    a = t // {n}", f"    i = t % {n}"]
        lines += indent(_wrapped(index, k))
        lines += indent([f"dst = (a * {k} + j) * {inner}", f"src = t * {inner}",
                         f"for b in range({inner}):", *indent(value_lines), f"    out0[dst + b] {store} {value}"])
    f = Function(kb.name, kb.arguments([a for a in arrays if a is not None] + kb.outs), lines, sched.parallel)
    kb.functions.append(f)
    kb.launch = [launch_line(f)]
