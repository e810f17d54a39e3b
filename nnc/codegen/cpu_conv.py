"""CPU window kernels: the sliding-window primitives of convolution and pooling (`im2col`, `col2im`, `max_pool`,
`max_pool_backward`; ops whose `OpDef.kernel_kind` is "window") as generated loops with their geometry (kernel,
stride, padding, dilation, sizes) baked in as constants.

Each kernel is one node. The loop runs over independent tasks (`WindowSchedule.tasks`), a prange when the work is
at least PARALLEL_MIN_ELEMENTS: im2col one (channel, kernel offset, sample) row of its columns a task; col2im,
max_pool and max_pool_backward one (sample, channel) plane a task, so the scatters of col2im and of the pooling
backward never race (a plane is written by one task only). Padding is never materialised: a window position outside
the input reads 0 (im2col, col2im) or is skipped (pooling).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..kernel import Kernel
from ..symbolic import has_symbols
from .cpu_elementwise import PARALLEL_MIN_ELEMENTS, Function, KernelBuilder, indent, launch_line
from .scalar import Unsupported, node_shape, op_and_attrs

WINDOW_OPS = ("im2col", "col2im", "max_pool", "max_pool_backward")


@dataclass(frozen=True)
class WindowSchedule:
    """How a window kernel runs: `tasks` independent tasks (rows of im2col's columns, or (sample, channel) planes),
    each `work` multiply-adds or loads; a prange over the tasks when tasks * work >= PARALLEL_MIN_ELEMENTS."""

    op: str
    tasks: int
    work: int
    parallel: bool

    @property
    def loop(self) -> str:
        return "prange" if self.parallel else "range"


def _geometry(kernel: Kernel):
    """(node, op name, attrs, input shape of the windows, output positions per spatial dim)."""
    if len(kernel.nodes) != 1:
        raise Unsupported("a window kernel has exactly one node")
    node = kernel.nodes[0]
    op, args, attrs = op_and_attrs(node)
    if op.name not in WINDOW_OPS:
        raise Unsupported(f"{op.name} has no window kernel")
    shapes = [node_shape(a) for a in args] + [node_shape(node)]
    if op.name == "col2im":
        in_shape = tuple(shapes[1])
    elif op.name == "max_pool_backward":
        in_shape = tuple(shapes[1])
    else:
        in_shape = tuple(shapes[0])
    if has_symbols(in_shape[1:]):  # a symbolic batch is a loop bound; the window geometry must be static
        raise Unsupported("window kernels take a symbolic batch size only (channels and spatial sizes static)")
    from runtime.ops import window_output_sizes

    out_sizes = window_output_sizes(in_shape[2:], attrs["kernel"], attrs["stride"], attrs["padding"],
                                    attrs["dilation"])
    return node, op.name, attrs, in_shape, out_sizes


def window_schedule(op: str, in_shape, kernel_sizes, out_sizes) -> WindowSchedule:
    """The schedule of window op `op` over an input (N, C, *spatial) with these window and output sizes."""
    n, c = in_shape[0], in_shape[1]
    k, positions = math.prod(kernel_sizes), math.prod(out_sizes)
    if op == "im2col":
        tasks, work = c * k * n, positions
    else:
        tasks, work = n * c, positions * k
    return WindowSchedule(op, tasks, work, tasks > 1 and tasks * work >= PARALLEL_MIN_ELEMENTS)


def window_schedule_of(kernel: Kernel) -> WindowSchedule:
    _, op, attrs, in_shape, out_sizes = _geometry(kernel)
    return window_schedule(op, in_shape, attrs["kernel"], out_sizes)


def _positions(nd, kvars, attrs, in_sizes, out_sizes, body, guard):
    """Nested loops over the output positions o0.. of one kernel offset (kvars), computing the input index i<d> of
    each dim; `body(pos, src, valid)` gives the innermost lines (pos: flat output position, src: flat input position
    within a plane, valid: the condition that the window element lies inside the input, or None). With guard the
    out-of-input rows are skipped as soon as a dim leaves the input (pooling: nothing to do there)."""
    lines, depth = [], 0
    conds = []
    for d in range(nd):
        (lo, _), s, dl = attrs["padding"][d], attrs["stride"][d], attrs["dilation"][d]
        lines += indent([f"for o{d} in range({out_sizes[d]}):",
                         f"    i{d} = o{d} * {s} + {kvars[d]} * {dl} - {lo}"], depth)
        depth += 1
        cond = f"0 <= i{d} < {in_sizes[d]}"
        if guard:
            lines += indent([f"if not ({cond}):", "    continue"], depth)
        else:
            conds.append(cond)
    pos = _flat([f"o{d}" for d in range(nd)], out_sizes)
    src = _flat([f"i{d}" for d in range(nd)], in_sizes)
    lines += indent(body(pos, src, " and ".join(conds) if conds else None), depth)
    return lines


def _flat(vars_, sizes) -> str:
    expr = vars_[0]
    for v, n in zip(vars_[1:], sizes[1:]):
        expr = f"({expr}) * {n} + {v}"
    return expr


def _kernel_offsets(nd, kernel_sizes, flat) -> list[str]:
    """Lines splitting flat kernel offset `flat` into k0.. (row-major over the window)."""
    lines = []
    rest = flat
    for d in reversed(range(nd)):
        if d == 0:
            lines.append(f"k0 = {rest}")
        else:
            lines.append(f"k{d} = {rest} % {kernel_sizes[d]}")
            lines.append(f"r{d} = {rest} // {kernel_sizes[d]}")
            rest = f"r{d}"
    return lines


def gen_window(kb: KernelBuilder) -> None:
    node, op, attrs, in_shape, out_sizes = _geometry(kb.kernel)
    sched = window_schedule(op, in_shape, attrs["kernel"], out_sizes)
    n, c = in_shape[0], in_shape[1]
    in_sizes, kernel_sizes = in_shape[2:], tuple(attrs["kernel"])
    nd = len(kernel_sizes)
    k, plane, positions = math.prod(kernel_sizes), math.prod(in_sizes), math.prod(out_sizes)
    kvars = [f"k{d}" for d in range(nd)]
    loop = sched.loop
    if op == "im2col":  # in0 (N, C, *S) -> out0 (C*K, N*L); task t = (c*K + k)*N + n
        lines = [f"for t in {loop}({sched.tasks}):", f"    n = t % {n}", f"    ck = t // {n}",
                 f"    kk = ck % {k}", f"    c = ck // {k}"]
        lines += indent(_kernel_offsets(nd, kernel_sizes, "kk"))
        lines += indent([f"src0 = (n * {c} + c) * {plane}", f"dst0 = ck * {n * positions} + n * {positions}"])

        def body(pos, src, valid):
            if valid is None:
                return [f"out0[dst0 + {pos}] = in0[src0 + {src}]"]
            return [f"if {valid}:", f"    out0[dst0 + {pos}] = in0[src0 + {src}]", "else:",
                    f"    out0[dst0 + {pos}] = 0"]
        lines += indent(_positions(nd, kvars, attrs, in_sizes, out_sizes, body, guard=False))
    elif op == "col2im":  # in0 (C*K, N*L) -> out0 (N, C, *S); task t = n*C + c owns its plane
        lines = [f"for t in {loop}({sched.tasks}):", f"    n = t // {c}", f"    c = t % {c}",
                 f"    dst0 = t * {plane}", f"    for j in range({plane}):", "        out0[dst0 + j] = 0",
                 f"    for kk in range({k}):"]
        lines += indent(_kernel_offsets(nd, kernel_sizes, "kk"), 2)
        lines += indent([f"src0 = (c * {k} + kk) * {n * positions} + n * {positions}"], 2)

        def body(pos, src, valid):
            return [f"out0[dst0 + {src}] += in0[src0 + {pos}]"]
        lines += indent(_positions(nd, kvars, attrs, in_sizes, out_sizes, body, guard=True), 2)
    else:  # max_pool: in0 (N, C, *S) -> out0 (N, C, *O); backward: in0 g (N, C, *O), in1 x -> out0 (N, C, *S)
        x = "in0" if op == "max_pool" else "in1"
        lines = [f"for t in {loop}({sched.tasks}):", f"    src0 = t * {plane}", f"    pos0 = t * {positions}"]
        if op == "max_pool_backward":
            lines += [f"    for j in range({plane}):", "        out0[src0 + j] = 0"]
        # every window holds an element of the input (padding is at most half a window): the first one found
        # starts the maximum; then the first greater one, or a nan, wins (torch's rule)
        inner = []
        for d in range(nd):
            (lo, _), s, dl = attrs["padding"][d], attrs["stride"][d], attrs["dilation"][d]
            inner += indent([f"for k{d} in range({kernel_sizes[d]}):",
                             f"    i{d} = o{d} * {s} + k{d} * {dl} - {lo}",
                             f"    if not (0 <= i{d} < {in_sizes[d]}):", "        continue"], d)
        src = _flat([f"i{d}" for d in range(nd)], in_sizes)
        inner += indent([f"v = {x}[src0 + {src}]",
                         "if found == 0 or v > best or v != v:", "    best = v", f"    arg = {src}",
                         "    found = 1"], nd)
        pos = _flat([f"o{d}" for d in range(nd)], out_sizes)
        store = [f"out0[pos0 + {pos}] = best"] if op == "max_pool" else [f"out0[src0 + arg] += in0[pos0 + {pos}]"]
        body = ["found = 0", f"best = {x}[src0]", "arg = 0"] + inner + store
        outer = []
        for d in range(nd):
            outer += indent([f"for o{d} in range({out_sizes[d]}):"], d)
        lines += indent(outer + indent(body, nd))
    f = Function(kb.name, kb.ins + kb.outs, lines, sched.parallel)
    kb.functions.append(f)
    kb.launch = [launch_line(f)]
