"""CPU window kernels: the sliding-window primitives of convolution and pooling (`im2col`, `col2im`, `max_pool`,
`max_pool_backward`; ops whose `OpDef.kernel_kind` is "window") as generated loops with their geometry (kernel,
stride, padding, dilation, channels) baked in as constants; the batch and the image sizes may be symbolic
(nnc.symbolic): then they are loop bounds and offsets computed from the sizes each call passes.

Each kernel is one node. The loop runs over independent tasks (`WindowSchedule.tasks`), a prange when the work is
at least PARALLEL_MIN_ELEMENTS: im2col one (channel, kernel offset, sample) row of its columns a task; col2im,
max_pool and max_pool_backward one (sample, channel) plane a task, so the scatters of col2im and of the pooling
backward never race (a plane is written by one task only). Padding is never materialised: a window position outside
the input reads 0 (im2col, col2im) or is skipped (pooling). Rows and planes are read and written through slices of
the flat arguments: LLVM vectorizes loops over slices, not over the arguments indexed inside a prange.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..kernel import Kernel
from ..symbolic import has_symbols, provably
from .cpu_elementwise import PARALLEL_MIN_ELEMENTS, Function, KernelBuilder, ParallelLoop, indent, launch_line
from .scalar import Unsupported, node_shape, only_node

WINDOW_OPS = ("im2col", "col2im", "max_pool", "max_pool_backward")


@dataclass(frozen=True)
class WindowSchedule(ParallelLoop):
    """How a window kernel runs: `tasks` independent tasks (rows of im2col's columns, or (sample, channel) planes),
    each `work` multiply-adds or loads; a prange over the tasks when tasks * work >= PARALLEL_MIN_ELEMENTS."""

    op: str
    tasks: int
    work: int
    parallel: bool


class _WindowFunction(Function):
    """A window kernel's numba function: its arrays and size symbols, then `width`, the output positions along the
    last dim, an argument rather than a constant.

    NOTE: a row loop of constant length (24 on the MNIST CNN's conv2) LLVM unrolls fully and then keeps scalar: it
    cannot rule out that the row slices of the input and output overlap. Of unknown length, the loop vectorizer
    checks for overlap at run time and vectorizes it: im2col 2.0 vs 2.8 ms, col2im 0.9 vs 2.2 ms there."""

    @property
    def symbols(self) -> list[str]:
        return super().symbols + ["width"]


def _geometry(kernel: Kernel):
    """(node, op name, attrs, input shape of the windows, output positions per spatial dim)."""
    node, op, args, attrs = only_node(kernel, "window", WINDOW_OPS)
    shapes = [node_shape(a) for a in args] + [node_shape(node)]
    if op.name == "col2im":
        in_shape = tuple(shapes[1])
    elif op.name == "max_pool_backward":
        in_shape = tuple(shapes[1])
    else:
        in_shape = tuple(shapes[0])
    if has_symbols(in_shape[1:2]):  # the batch and spatial sizes may be symbolic (loop bounds, offsets)
        raise Unsupported("window kernels take static channels (a symbolic batch and spatial sizes only)")
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


def _may_leave(attrs, d, in_size, out_size) -> bool:
    """Whether some window of dim d may reach outside the input (into padding, or past its end): only such dims need
    bounds checks; a "valid" convolution's and an unpadded pooling's have none. Over a symbolic size, a dim whose
    last window stays inside for some sizes only (stride 2 over an odd or even size) is checked rather than guarded:
    one variant then serves every size."""
    (lo, _), s, dl, k = attrs["padding"][d], attrs["stride"][d], attrs["dilation"][d], attrs["kernel"][d]
    return lo > 0 or not provably((out_size - 1) * s + (k - 1) * dl - lo, "<=", in_size - 1)


def _disjoint(attrs) -> bool:
    """Whether no two windows share an element (each spans at most its stride in every dim): then the maxima of
    different windows are different elements, and a pooling backward stores each gradient instead of adding it."""
    return all(dl * (k - 1) + 1 <= s for s, dl, k in zip(attrs["stride"], attrs["dilation"], attrs["kernel"]))


def _valid_range(d, attrs, in_size, out_size) -> list[str]:
    """Lines setting a<d>, b<d>: the output positions [a, b) of dim d whose element at kernel offset k<d> lies
    inside the input (i = o * s + k * dl - lo in [0, in_size))."""
    (lo, _), s, dl = attrs["padding"][d], attrs["stride"][d], attrs["dilation"][d]
    return [f"a{d} = max(0, -((k{d} * {dl} - {lo}) // {s}))",
            f"b{d} = min({out_size}, ({in_size} - 1 - k{d} * {dl} + {lo}) // {s} + 1)",
            f"if b{d} < a{d}:", f"    b{d} = a{d}"]


def _rows(nd, attrs, in_sizes, out_sizes, body, outside):
    """Nested loops over the output positions of one kernel offset (k0..), all dims but the last, then one line
    range of the last: `body(row, src)` gives the lines for that range (row: flat output position of its first
    element, src: flat input position of the element at output position 0 of the last dim, which may lie outside
    the input). Where an outer dim's position leaves the input, `outside(start, count)` gives the lines for the
    `count` output positions from `start` under it (None: nothing to do there)."""
    lines, depth, last = [], 0, nd - 1
    for d in range(last):
        (lo, _), s, dl = attrs["padding"][d], attrs["stride"][d], attrs["dilation"][d]
        lines += indent([f"for o{d} in range({out_sizes[d]}):",
                         f"    i{d} = o{d} * {s} + k{d} * {dl} - {lo}"], depth)
        depth += 1
        if _may_leave(attrs, d, in_sizes[d], out_sizes[d]):
            block = math.prod(out_sizes[d + 1:])
            start = f"({_flat([f'o{e}' for e in range(d + 1)], out_sizes[:d + 1])}) * {block}"
            lines += indent([f"if not (0 <= i{d} < {in_sizes[d]}):"]
                            + indent(outside(start, block) if outside else []) + ["    continue"], depth)
    (lo, _), dl = attrs["padding"][last], attrs["dilation"][last]
    outer = _flat([f"i{d}" for d in range(last)], in_sizes[:last]) if last else "0"
    src = f"({outer}) * {in_sizes[last]} + k{last} * {dl} - {lo}"
    lines += indent(body(_row_start(nd, out_sizes), src), depth)
    return lines


def _row_start(nd, out_sizes) -> str:
    """The flat output position of (o0, .., o<nd-2>, 0)."""
    if nd == 1:
        return "0"
    return f"({_flat([f'o{d}' for d in range(nd - 1)], out_sizes[:-1])}) * {out_sizes[-1]}"


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
    loop = sched.loop
    last, width, step = nd - 1, out_sizes[-1], attrs["stride"][-1]
    checked = _may_leave(attrs, last, in_sizes[last], width)
    span = _valid_range(last, attrs, in_sizes[last], width) if checked else []
    o = f"o{last}"
    if op == "im2col":  # in0 (N, C, *S) -> out0 (C*K, N*L); task t = (c*K + k)*N + n
        lines = [f"for t in {loop}({sched.tasks}):", f"    n = t % {n}", f"    ck = t // {n}",
                 f"    kk = ck % {k}", f"    c = ck // {k}"]
        lines += indent(_kernel_offsets(nd, kernel_sizes, "kk"))
        lines += indent([f"src0 = (n * {c} + c) * {plane}", f"dst0 = ck * {n * positions} + n * {positions}"] + span)

        def body(row, src):
            # NOTE: read and written through row slices: indexing in0 and out0 directly inside a prange, LLVM kept
            # the copy scalar (3x slower on the MNIST CNN's conv2, and col2im's scatter-add below 4x)
            drow = f"drow = out0[dst0 + {row}:dst0 + {row} + {width}]"
            if not checked:
                return [drow, f"srow = in0[src0 + {src}:src0 + {src} + {(width - 1) * step + 1}]",
                        f"for {o} in range(width):", f"    drow[{o}] = srow[{o} * {step}]"]
            s = f"src0 + {src} + a{last} * {step}"
            return [drow, f"for {o} in range(a{last}):", f"    drow[{o}] = 0",
                    f"srow = in0[{s}:{s} + (b{last} - a{last}) * {step}]",
                    f"for {o} in range(b{last} - a{last}):", f"    drow[a{last} + {o}] = srow[{o} * {step}]",
                    f"for {o} in range(b{last}, {width}):", f"    drow[{o}] = 0"]

        def outside(start, count):
            return [f"zrow = out0[dst0 + {start}:dst0 + {start} + {count}]", f"for j in range({count}):",
                    "    zrow[j] = 0"]
        lines += indent(_rows(nd, attrs, in_sizes, out_sizes, body, outside))
    elif op == "col2im":  # in0 (C*K, N*L) -> out0 (N, C, *S); task t = c*N + n owns plane (n, c)
        # NOTE: samples inner, so that successive tasks read on along the same K rows of the columns (12% faster
        # on the MNIST CNN's conv2 than channels inner, which jump a row's length between tasks)
        lines = [f"for t in {loop}({sched.tasks}):", f"    n = t % {n}", f"    c = t // {n}",
                 f"    dst0 = (n * {c} + c) * {plane}", f"    for j in range({plane}):", "        out0[dst0 + j] = 0",
                 f"    for kk in range({k}):"]
        lines += indent(_kernel_offsets(nd, kernel_sizes, "kk"), 2)
        lines += indent([f"src0 = (c * {k} + kk) * {n * positions} + n * {positions}"] + span, 2)

        def body(row, src):
            # NOTE: through row slices (in bounds, one per array) LLVM vectorizes the scatter-add; indexing out0 and
            # in0 directly it ran scalar (it cannot rule out that they overlap): 4x slower on the MNIST CNN's conv2
            first, count = (f"a{last}", f"b{last} - a{last}") if checked else ("0", "width")
            return [f"d = dst0 + {src} + {first} * {step}", f"s = src0 + {row} + {first}",
                    f"drow = out0[d:d + ({count}) * {step}]", f"srow = in0[s:s + {count}]",
                    f"for {o} in range({count}):", f"    drow[{o} * {step}] += srow[{o}]"]
        lines += indent(_rows(nd, attrs, in_sizes, out_sizes, body, None), 2)
    else:  # max_pool: in0 (N, C, *S) -> out0 (N, C, *O); backward: in0 g (N, C, *O), in1 x -> out0 (N, C, *S)
        # this task's planes as slices (see im2col): xp of the input, yp of the pooled output or gp of its gradient,
        # dp of the input's gradient
        x = "in0" if op == "max_pool" else "in1"
        lines = [f"for t in {loop}({sched.tasks}):", f"    xp = {x}[t * {plane}:t * {plane} + {plane}]"]
        if op == "max_pool":
            lines += [f"    yp = out0[t * {positions}:t * {positions} + {positions}]"]
        else:
            lines += [f"    gp = in0[t * {positions}:t * {positions} + {positions}]",
                      f"    dp = out0[t * {plane}:t * {plane} + {plane}]"]
        if op == "max_pool_backward":
            # NOTE: zeroing the plane (vectorized) and then storing each window's gradient at its maximum beat writing
            # every element once where the windows tile the input (2x2, stride 2): 1.5 vs 2.6 ms on the MNIST CNN;
            # adding the gradient there instead of storing it took 14 ms (the loads of the next window then wait on
            # the store), so windows add only where they overlap
            lines += [f"    for j in range({plane}):", "        dp[j] = 0"]
        # every window holds an element of the input (padding is at most half a window): the first one found
        # starts the maximum; then the first greater one, or a nan, wins (torch's rule). Without bounds checks the
        # window's first element starts it, and the comparisons are selects, not branches (random data mispredicts)
        checks = [_may_leave(attrs, d, in_sizes[d], out_sizes[d]) for d in range(nd)]
        inner = []
        for d in range(nd):
            (lo, _), s, dl = attrs["padding"][d], attrs["stride"][d], attrs["dilation"][d]
            check = [f"    if not (0 <= i{d} < {in_sizes[d]}):", "        continue"] if checks[d] else []
            inner += indent([f"for k{d} in range({kernel_sizes[d]}):",
                             f"    i{d} = o{d} * {s} + k{d} * {dl} - {lo}"] + check, d)
        src = _flat([f"i{d}" for d in range(nd)], in_sizes)
        if any(checks):
            start = ["found = 0", "best = xp[0]", "arg = 0"]
            inner += indent([f"v = xp[{src}]", "if found == 0 or v > best or v != v:", "    best = v",
                             f"    arg = {src}", "    found = 1"], nd)
        else:
            first = _flat([f"o{d} * {attrs['stride'][d]}" for d in range(nd)], in_sizes)
            start = [f"arg = {first}", "best = xp[arg]"]
            inner += indent([f"j = {src}", "v = xp[j]", "better = v > best or v != v",
                             "best = v if better else best", "arg = j if better else arg"], nd)
        pos = _flat([f"o{d}" for d in range(nd)], out_sizes)
        if op == "max_pool":
            store = [f"yp[{pos}] = best"]
        elif _disjoint(attrs):
            store = [f"dp[arg] = gp[{pos}]"]
        else:  # overlapping windows may share their maximum
            store = [f"dp[arg] += gp[{pos}]"]
        body = start + inner + store
        outer = []
        for d in range(nd):
            outer += indent([f"for o{d} in range({out_sizes[d]}):"], d)
        lines += indent(outer + indent(body, nd))
    if op in ("im2col", "col2im"):
        f = _WindowFunction(kb.name, kb.ins + kb.outs, lines, sched.parallel)
        kb.launch = [f"width = {width}", launch_line(f)]
    else:
        f = Function(kb.name, kb.ins + kb.outs, lines, sched.parallel)
        kb.launch = [launch_line(f)]
    kb.functions.append(f)
