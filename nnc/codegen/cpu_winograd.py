"""CPU Winograd kernels: the transforms of runtime/_winograd.py (ops whose `OpDef.kernel_kind` is "winograd") as
generated loops, with the transform matrices' entries written into the source as typed constants (zeros skipped).

Input and output transforms run one task per channel and chunk of samples (a prange when the work is large enough).
A task's tiles are contiguous runs of every row of the (T*T, channels, P) transformed values, so both matrix
products of a transform run as loops along those runs (they vectorize); only copying pixels between the planes and
the tiles is scalar:
  - winograd_input and winograd_output_backward gather: the planes' pixels copied into the task's tiles (a buffer
    of patch*patch rows, zeros outside the plane), then transformed into their rows of the result;
  - winograd_output and winograd_input_backward scatter: the rows transformed back, one patch row at a time, and
    its pixels stored into the planes (added where tiles overlap: the input transform's adjoint).
The filter transforms take blocks of filters a task, with the block's filters along the rows of a buffer, so both
products run along them too (only copying the 3x3 filters in, or out, is scalar).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from runtime import _winograd

from ..kernel import Kernel
from .cpu_elementwise import PARALLEL_MIN_ELEMENTS, Function, KernelBuilder, ParallelLoop, indent, launch_line
from .scalar import Unsupported, ctor, node_shape, only_node

WINOGRAD_OPS = ("winograd_input", "winograd_input_backward", "winograd_filter", "winograd_filter_backward",
                "winograd_output", "winograd_output_backward")


@dataclass(frozen=True)
class WinogradSchedule(ParallelLoop):
    """How a Winograd transform runs: `tasks` planes (or filters), each `work` values read or written; a prange
    when tasks * work >= PARALLEL_MIN_ELEMENTS."""

    op: str
    tasks: int
    work: int
    parallel: bool


def _geometry(kernel: Kernel):
    """(node, op name, attrs, input shape, output shape) of a Winograd kernel's one node."""
    node, op, args, attrs = only_node(kernel, "winograd", WINOGRAD_OPS)
    in_shape, out_shape = tuple(node_shape(args[0])), tuple(node_shape(node))
    if any(not isinstance(s, int) for s in in_shape + out_shape):
        raise Unsupported("winograd kernels take static sizes only")
    return node, op.name, attrs, in_shape, out_shape


def winograd_schedule_of(kernel: Kernel) -> WinogradSchedule:
    _, op, attrs, in_shape, out_shape = _geometry(kernel)
    return _schedule(op, attrs, in_shape, out_shape)


def _schedule(op, attrs, in_shape, out_shape) -> WinogradSchedule:
    if op in ("winograd_filter", "winograd_filter_backward"):
        o, c = (in_shape[0], in_shape[1]) if op == "winograd_filter" else (in_shape[1], in_shape[2])
        tasks = -(-o * c // FILTER_BLOCK)
    else:
        tasks = _tiling_of(op, attrs, in_shape, out_shape)[0].tasks
    work = (math.prod(in_shape) + math.prod(out_shape)) // max(tasks, 1)
    return WinogradSchedule(op, tasks, work, tasks > 1 and tasks * work >= PARALLEL_MIN_ELEMENTS)


# Filters a filter-transform task takes: the block's rows (T*T + 18 of them, 4 or 8 bytes each) stay in L1/L2.
# NOTE: one filter a task, scalar code, took 37 us on one thread for the MNIST CNN's conv2 (2048 filters)
FILTER_BLOCK = 256
# Tiles a task transforms at once: its buffers (T*T rows of them, 4 or 8 bytes each) stay in L2.
# NOTE: one output channel's tiles at a time (the MNIST CNN's conv2 output transform, 64 tasks of 2304 tiles)
# took 1.5 ms on one thread, against 6.1 ms for one task per (sample, channel) plane with loops over one tile row
CHUNK_TILES = 512


@dataclass(frozen=True)
class _Tiling:
    """How a transform's tiles lie on its planes: `channels` planes per sample, `samples` samples of `plane_hw`
    pixels (the convolution's input, or its output), tiles of `patch` x `patch` pixels every `step`, the first
    `offset` pixels before the plane (the padding; tiles reach past its end too: zeros), `tiles` (th, tw) per
    plane. `plane_at(ch, n)` is where plane (ch, n) starts in its flat array. A task takes one channel of a chunk
    of `chunk` samples."""

    channels: int
    samples: int
    plane_hw: tuple
    patch: int
    step: int
    offset: tuple
    tiles: tuple
    plane_at: object

    @property
    def per_sample(self) -> int:
        return self.tiles[0] * self.tiles[1]

    @property
    def chunk(self) -> int:
        return max(1, min(self.samples, CHUNK_TILES // self.per_sample))

    @property
    def chunks(self) -> int:
        return -(-self.samples // self.chunk)

    @property
    def tasks(self) -> int:
        return self.channels * self.chunks


def _tiling_of(op, attrs, in_shape, out_shape):
    """(the _Tiling of a plane transform, P: its tiles in all)."""
    tile = attrs["tile"]
    if op in ("winograd_input", "winograd_input_backward"):
        n, c, h, w = in_shape if op == "winograd_input" else out_shape
        padding = attrs["padding"]
        tiles = _winograd.tile_counts(_winograd.output_sizes((h, w), padding), tile)
        tl = _Tiling(c, n, (h, w), tile + 2, tile, (padding[0][0], padding[1][0]), tiles,
                     lambda ch, s: f"(({s}) * {c} + {ch}) * {h * w}")  # x (N, C, H, W)
    else:
        size = tuple(attrs["size"])
        o, nl = out_shape if op == "winograd_output" else in_shape
        n = nl // math.prod(size)
        tiles = _winograd.tile_counts(size, tile)
        tl = _Tiling(o, n, size, tile, tile, (0, 0), tiles,
                     lambda ch, s: f"({ch} * {n} + ({s})) * {math.prod(size)}")  # y (O, N * Ho * Wo)
    return tl, tl.samples * tl.per_sample


class _Constants:
    """The transform entries as typed constants of the function (a float64 literal would promote float32 math)."""

    def __init__(self, dtype):
        self.ctor, self.names = ctor(dtype), {}

    def term(self, coef: float, value: str) -> str | None:
        if coef == 0:
            return None
        if coef == 1:
            return f"+ {value}"
        if coef == -1:
            return f"- {value}"
        if abs(coef) not in self.names:
            self.names[abs(coef)] = f"c{len(self.names)}"
        return f"{'+' if coef > 0 else '-'} {self.names[abs(coef)]} * {value}"

    def combination(self, coefs, values) -> str:
        terms = [t for t in (self.term(float(k), v) for k, v in zip(coefs, values)) if t is not None]
        if not terms:
            return "0"
        expr = " ".join(terms)
        return expr[2:] if expr.startswith("+ ") else "-" + expr[2:]

    def lines(self) -> list[str]:
        return [f"{name} = {self.ctor}({value!r})" for value, name in self.names.items()]


def _task_lines(tl: _Tiling, loop: str, dt: str, buffers) -> list[str]:
    """The task loop's head: channel ch, samples [n0, n0 + ns), tiles [p0, p0 + q) of the P, and its buffers
    (name, numpy constructor, rows) of a row per patch entry and a column per tile."""
    lines = [f"for t in {loop}({tl.tasks}):",
             f"    ch = t // {tl.chunks}",
             f"    n0 = (t % {tl.chunks}) * {tl.chunk}",
             f"    ns = min({tl.chunk}, {tl.samples} - n0)",
             f"    p0 = n0 * {tl.per_sample}",
             f"    q = ns * {tl.per_sample}"]
    return lines + [f"    {name} = np.{fill}(({rows}, {tl.chunk * tl.per_sample}), dtype={dt})"
                    for name, fill, rows in buffers]


def _pixel_loops(tl: _Tiling, body) -> list[str]:
    """Loops over the task's samples, tile rows, and patch rows i whose pixel row lies inside the plane, then over
    the tiles of the row: `body(j, bounds)` gives the lines for patch column j (with bounds, its pixel may lie
    outside the row and the lines must check). Sets g (the row's first tile) and prow (where the pixel row
    starts)."""
    (th, tw), (h, w), k, m = tl.tiles, tl.plane_hw, tl.patch, tl.step
    top, left = tl.offset
    # the tiles whose patch lies inside the row: tx * m - left >= 0 and tx * m - left + k <= w
    lo = min(tw, -(-left // m))
    hi = max(lo, min(tw, (w + left - k) // m + 1))
    lines = ["    for n in range(ns):",
             f"        plane = {tl.plane_at('ch', 'n0 + n')}",
             f"        for ty in range({th}):",
             f"            g = (n * {th} + ty) * {tw}",
             f"            for i in range({k}):",
             f"                y = ty * {m} + i - {top}",
             f"                if y < 0 or y >= {h}:",
             "                    continue",
             f"                prow = plane + y * {w}"]
    for first, last, bounds in ((0, lo, True), (lo, hi, False), (hi, tw, True)):
        if first < last:
            lines.append(f"                for tx in range({first}, {last}):")
            for j in range(k):
                lines += indent(body(j, bounds), 5)
    return lines


def _gather_lines(k: _Constants, mat, tl: _Tiling, loop, dt, dest) -> list[str]:
    """Plane tiles -> their transforms mat @ d @ mat^T, entry (a, b) of tile p written at dest(a * R + b) + p.
    The tiles' pixels are first copied into d (patch*patch rows, zeros outside the planes), then both products run
    along its rows."""
    r, kk = mat.shape
    lines = _task_lines(tl, loop, dt, [("d", "zeros", kk * kk), ("s", "empty", kk)])

    def copy(j, bounds):
        x = f"tx * {tl.step} + {j - tl.offset[1]}"
        store = [f"d[i * {kk} + {j}, g + tx] = in0[prow + {x}]"]
        return ([f"if 0 <= {x} < {tl.plane_hw[1]}:"] + indent(store)) if bounds else store
    lines += _pixel_loops(tl, copy)
    # NOTE: every run read and written through a 1-d slice: indexing the 2-d buffers or the flat arguments inside
    # the prange, LLVM kept these loops scalar (7.0 against 1.5 ms for the MNIST CNN's conv2 output transform)
    for a in range(r):  # s[j] = sum_i mat[a, i] d[i, j]; then out[a * R + b] = sum_j mat[b, j] s[j]
        for j in range(kk):
            lines += [f"    r{i} = d[{i * kk + j}]" for i in range(kk)]
            lines += [f"    sj = s[{j}]", "    for p in range(q):",
                      f"        sj[p] = {k.combination(mat[a], [f'r{i}[p]' for i in range(kk)])}"]
        lines += [f"    s{j} = s[{j}]" for j in range(kk)]
        for b in range(r):
            lines += [f"    o = {dest(a * r + b)} + p0", "    dst = out0[o:o + q]", "    for p in range(q):",
                      f"        dst[p] = {k.combination(mat[b], [f's{j}[p]' for j in range(kk)])}"]
    return lines


def _scatter_lines(k: _Constants, mat, tl: _Tiling, loop, dt, source, add: bool) -> list[str]:
    """Transformed tiles (entry (a, b) of tile p at source(a * R + b) + p) -> mat @ X @ mat^T, stored into the
    planes (added where tiles overlap: `add`, on planes the task zeroes first). Per patch row i: both products
    along the tiles, then that row's pixels stored."""
    kk, r = mat.shape
    lines = _task_lines(tl, loop, dt, [("s", "empty", r), ("e", "empty", kk * kk)])
    if add:
        h, w = tl.plane_hw
        lines += ["    for n in range(ns):", f"        plane = {tl.plane_at('ch', 'n0 + n')}",
                  f"        for x in range({h * w}):", "            out0[plane + x] = 0"]
    for i in range(kk):  # s[b] = sum_a mat[i, a] X[a, b]; then e[i, j] = sum_b mat[j, b] s[b] (1-d slices: see
        for b in range(r):  # _gather_lines)
            lines += [f"    x{a} = in0[{source(a * r + b)} + p0:{source(a * r + b)} + p0 + q]" for a in range(r)]
            lines += [f"    sb = s[{b}]", "    for p in range(q):",
                      f"        sb[p] = {k.combination(mat[i], [f'x{a}[p]' for a in range(r)])}"]
        lines += [f"    s{b} = s[{b}]" for b in range(r)]
        for j in range(kk):
            lines += [f"    ej = e[{i * kk + j}]", "    for p in range(q):",
                      f"        ej[p] = {k.combination(mat[j], [f's{b}[p]' for b in range(r)])}"]

    def store(j, bounds):
        x = f"tx * {tl.step} + {j - tl.offset[1]}"
        line = [f"out0[prow + {x}] {'+' if add else ''}= e[i * {kk} + {j}, g + tx]"]
        return ([f"if 0 <= {x} < {tl.plane_hw[1]}:"] + indent(line)) if bounds else line
    return lines + _pixel_loops(tl, store)


def _filter_lines(k: _Constants, mat, oc: int, loop: str, dt: str, forward: bool) -> list[str]:
    """Filters in blocks of FILTER_BLOCK, each product along the block's filters (contiguous runs, which vectorize).
    forward: w (OC, 3, 3) -> U (T*T, OC) = mat @ w @ mat^T (mat = G, T x 3): the block's weights copied into 9 rows
    first. Backward: dU (T*T, OC) -> dw (OC, 3, 3) = mat @ dU @ mat^T (mat = G^T, 3 x T), the 9 result rows copied
    out to the filters last."""
    r, kk = mat.shape
    blocks = -(-oc // FILTER_BLOCK)
    lines = [f"for blk in {loop}({blocks}):",
             f"    t0 = blk * {FILTER_BLOCK}",
             f"    nt = min({FILTER_BLOCK}, {oc} - t0)",
             f"    g = np.empty(({r * kk}, {FILTER_BLOCK}), dtype={dt})"]
    if forward:  # f[i * 3 + j, u] = w[t0 + u, i, j]
        lines += [f"    f = np.empty((9, {FILTER_BLOCK}), dtype={dt})", "    for ij in range(9):", "        fr = f[ij]",
                  "        for u in range(nt):", "            fr[u] = in0[(t0 + u) * 9 + ij]"]
        lines += [f"    f{i} = f[{i}]" for i in range(kk * kk)]

        def source(i, j):
            return f"f{i * kk + j}[u]"
    else:  # rows of dU: in0[row * OC + t0 + u]
        lines += [f"    f{i} = in0[{i * oc} + t0:{i * oc} + t0 + nt]" for i in range(kk * kk)]

        def source(i, j):
            return f"f{i * kk + j}[u]"
    for a in range(r):  # g[a * kk + j] = sum_i mat[a, i] f[i, j]
        for j in range(kk):
            lines += [f"    ga = g[{a * kk + j}]", "    for u in range(nt):",
                      f"        ga[u] = {k.combination(mat[a], [source(i, j) for i in range(kk)])}"]
    lines += [f"    g{q} = g[{q}]" for q in range(r * kk)]
    if not forward:
        lines.append(f"    e = np.empty(({r * r}, {FILTER_BLOCK}), dtype={dt})")
    for a in range(r):  # out[a, b] = sum_j mat[b, j] g[a, j]
        for b in range(r):
            dst = f"out0[{(a * r + b) * oc} + t0:{(a * r + b) * oc} + t0 + nt]" if forward else f"e[{a * r + b}]"
            lines += [f"    dst = {dst}", "    for u in range(nt):",
                      f"        dst[u] = {k.combination(mat[b], [f'g{a * kk + j}[u]' for j in range(kk)])}"]
    if not forward:  # dw[t0 + u, a, b] = e[a * 3 + b, u]
        lines += ["    for ab in range(9):", "        er = e[ab]", "        for u in range(nt):",
                  "            out0[(t0 + u) * 9 + ab] = er[u]"]
    return lines


def gen_winograd(kb: KernelBuilder) -> None:
    node, op, attrs, in_shape, out_shape = _geometry(kb.kernel)
    sched = _schedule(op, attrs, in_shape, out_shape)
    tile = attrs["tile"]
    bt, g, at = _winograd.matrices(tile)
    dt = ctor(kb.outs[0].dtype)
    k = _Constants(kb.outs[0].dtype)
    if op == "winograd_filter":  # (O, C, 3, 3) -> (T*T, O, C)
        body = _filter_lines(k, g, in_shape[0] * in_shape[1], sched.loop, dt, forward=True)
    elif op == "winograd_filter_backward":  # (T*T, O, C) -> (O, C, 3, 3): dw = G^T dU G
        body = _filter_lines(k, g.T, in_shape[1] * in_shape[2], sched.loop, dt, forward=False)
    else:
        tl, p = _tiling_of(op, attrs, in_shape, out_shape)

        def row_at(r):  # row r of channel ch in the (T*T, channels, P) transformed tiles
            return f"({r} * {tl.channels} + ch) * {p}"
        if op == "winograd_input":
            body = _gather_lines(k, bt, tl, sched.loop, dt, row_at)
        elif op == "winograd_input_backward":
            body = _scatter_lines(k, bt.T, tl, sched.loop, dt, row_at, add=True)
        elif op == "winograd_output":
            body = _scatter_lines(k, at, tl, sched.loop, dt, row_at, add=False)
        else:
            body = _gather_lines(k, at.T, tl, sched.loop, dt, row_at)
    f = Function(kb.name, kb.ins + kb.outs, k.lines() + body, sched.parallel)
    kb.launch = [launch_line(f)]
    kb.functions.append(f)
