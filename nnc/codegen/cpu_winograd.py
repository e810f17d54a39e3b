"""CPU Winograd kernels: the transforms of runtime/_winograd.py (ops whose `OpDef.kernel_kind` is "winograd") as
generated loops, with the transform matrices' entries written into the source as typed constants (zeros skipped).

Input and output transforms run one task per channel and chunk of samples, or per group of channels when one chunk
holds every sample (small batches: the group's tiles are still one run), a prange when the work is large enough.
A task's tiles are contiguous runs of every row of the (T*T, channels, P) transformed values, so both matrix
products of a transform run as one loop along those runs (it vectorizes: each tile's values are read at constant
offsets, the first product's kept in locals); only copying pixels between the planes and the tiles is scalar:
  - winograd_input and winograd_output_backward gather: the planes' pixels copied into the task's tiles (a buffer
    of patch*patch rows, zeros outside the plane), then transformed into their rows of the result;
  - winograd_output and winograd_input_backward scatter: the rows transformed back into a buffer, and its pixels
    stored into the planes (added where tiles overlap: the input transform's adjoint);
  - winograd_output_bias adds each channel's bias in the transform loop, and a relu if asked.
The filter transforms take blocks of filters a task and run along the block's filters the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from runtime import _winograd

from ..kernel import Kernel
from .cpu_elementwise import PARALLEL_MIN_ELEMENTS, Function, KernelBuilder, ParallelLoop, indent, launch_line
from .scalar import Unsupported, ctor, node_shape, only_node

WINOGRAD_OPS = ("winograd_input", "winograd_input_backward", "winograd_filter", "winograd_filter_backward",
                "winograd_output", "winograd_output_backward", "winograd_output_bias")


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


# Filters a filter-transform task takes: its buffer (T*T rows of them, 4 or 8 bytes each) stays in L2.
# NOTE: the MNIST CNN's conv2 (2048 filters), one thread: one filter a task, scalar code, 37 us; blocks of 256 with
# row loops 11 us; one loop along the block's filters, blocks of 64 / 128 / 256 / 512 / 2048: 18.6 / 10.9 / 9.4 /
# 8.4 / 8.7 us (loaded machine, minimums)
FILTER_BLOCK = 512
# Tiles a task transforms at once: its buffers (T*T rows of them, 4 or 8 bytes each) stay in L2.
# NOTE: one output channel's tiles at a time (the MNIST CNN's conv2 output transform, 64 tasks of 2304 tiles)
# took 1.5 ms on one thread, against 6.1 ms for one task per (sample, channel) plane with loops over one tile row
CHUNK_TILES = 512
# When one chunk holds every sample (small batches and planes), a task takes several channels, up to this many
# tiles: the channels' runs of tiles are contiguous in the transformed rows, so the products run along rows of
# group * P values instead of P. NOTE: the MNIST CNN's conv2 at batch 1 (P = 36): output transform 30 -> 14 us on one
# thread with all 64 channels (2304 tiles) in one task.
GROUP_TILES = 4096


@dataclass(frozen=True)
class _Tiling:
    """How a transform's tiles lie on its planes: `channels` planes per sample, `samples` samples of `plane_hw`
    pixels (the convolution's input, or its output), tiles of `patch` x `patch` pixels every `step`, the first
    `offset` pixels before the plane (the padding; tiles reach past its end too: zeros), `tiles` (th, tw) per
    plane. `plane_at(ch, n)` is where plane (ch, n) starts in its flat array. A task takes `group` channels of a
    chunk of `chunk` samples (several channels only when the chunk holds every sample)."""

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
    def group(self) -> int:
        if self.chunks > 1:
            return 1
        return max(1, min(self.channels, GROUP_TILES // max(1, self.samples * self.per_sample)))

    @property
    def inside(self) -> bool:
        """Whether every tile's patch lies inside its plane (no padding, no partial tile)."""
        return self.offset == (0, 0) and all((t - 1) * self.step + self.patch <= size
                                             for t, size in zip(self.tiles, self.plane_hw))

    @property
    def columns(self) -> int:
        """The tiles of a task's buffers."""
        return self.group * self.chunk * self.per_sample

    @property
    def tasks(self) -> int:
        return -(-self.channels // self.group) * self.chunks


def _tiling_of(op, attrs, in_shape, out_shape):
    """(the _Tiling of a plane transform, P: its tiles in all)."""
    tile = attrs["tile"]
    if op in ("winograd_input", "winograd_input_backward"):
        n, c, h, w = in_shape if op == "winograd_input" else out_shape
        padding = attrs["padding"]
        tiles = _winograd.tile_counts(_winograd.output_sizes((h, w), padding), tile)
        tl = _Tiling(c, n, (h, w), tile + 2, tile, (padding[0][0], padding[1][0]), tiles,
                     lambda ch, s: f"(({s}) * {c} + {ch}) * {h * w}")  # x (N, C, H, W)
    elif op == "winograd_output_bias":
        size = tuple(attrs["size"])
        n, o = out_shape[:2]
        tl = _Tiling(o, n, size, tile, tile, (0, 0), _winograd.tile_counts(size, tile),
                     lambda ch, s: f"(({s}) * {o} + {ch}) * {math.prod(size)}")  # y (N, O, Ho, Wo)
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
    """The task loop's head: channels [ch0, ch0 + ng), samples [n0, n0 + ns), tiles [p0, p0 + ns * per_sample) of
    the P; q = ng * ns * per_sample columns, a run of each transformed row (ng > 1 only when ns is every sample);
    and its buffers (name, numpy constructor, rows) of a row per patch entry and a column per tile."""
    lines = [f"for t in {loop}({tl.tasks}):",
             f"    ch0 = (t // {tl.chunks}) * {tl.group}",
             f"    ng = min({tl.group}, {tl.channels} - ch0)",
             f"    n0 = (t % {tl.chunks}) * {tl.chunk}",
             f"    ns = min({tl.chunk}, {tl.samples} - n0)",
             f"    p0 = n0 * {tl.per_sample}",
             f"    q = ng * ns * {tl.per_sample}"]
    return lines + [f"    {name} = np.{fill}(({rows}, {tl.columns}), dtype={dt})" for name, fill, rows in buffers]


def _pixel_loops(tl: _Tiling, body, shared_rows: bool = False) -> list[str]:
    """Loops over the task's planes, tile rows, and patch rows i whose pixel row lies inside the plane, then over
    the tiles of the row: `body(j, bounds)` gives the lines for patch column j (with bounds, its pixel may lie
    outside the row and the lines must check). Sets g (the row's first tile) and prow (where the pixel row starts).
    With `shared_rows`, patch rows i >= step are left out except in the last tile row (see _shared_row_copies)."""
    (th, tw), (h, w), k, m = tl.tiles, tl.plane_hw, tl.patch, tl.step
    top, left = tl.offset
    # the tiles whose patch lies inside the row: tx * m - left >= 0 and tx * m - left + k <= w
    lo = min(tw, -(-left // m))
    hi = max(lo, min(tw, (w + left - k) // m + 1))
    rows = f"{k} if ty == {th - 1} else {m}" if shared_rows and k > m else f"{k}"
    lines = ["    for cn in range(ng * ns):",
             f"        plane = {tl.plane_at('(ch0 + cn // ns)', 'n0 + cn % ns')}",
             f"        for ty in range({th}):",
             f"            g = (cn * {th} + ty) * {tw}",
             f"            for i in range({rows}):",
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


def _shared_row_copies(tl: _Tiling) -> list[str]:
    """Patch rows i >= step of every tile row but the last, in the gather's buffer d: the same pixels as patch row
    i - step of the next tile row (the patches overlap), so copied from it along the tile rows instead of from the
    planes. NOTE: a third of the input transform's scalar pixel copies become vector copies."""
    (th, tw), k, m = tl.tiles, tl.patch, tl.step
    if k <= m or th < 2:
        return []
    run, cols = (th - 1) * tw, tl.columns
    return ["    for cn in range(ng * ns):",
            f"        base = cn * {tl.per_sample}",
            f"        for i in range({m}, {k}):",
            f"            for j in range({k}):",
            f"                d0 = (i * {k} + j) * {cols} + base",
            f"                s0 = ((i - {m}) * {k} + j) * {cols} + base + {tw}",
            f"                dr = df[d0:d0 + {run}]",
            f"                sr = df[s0:s0 + {run}]",
            f"                for u in range({run}):",
            "                    dr[u] = sr[u]"]


def _rows(name: str, stride: int):
    """Entry e of tile (or filter) p in rows of `name`, `stride` apart."""
    return lambda e: f"{name}[{e * stride} + p]"


def _interleaved(name: str, entries: int):
    """Entry e of filter p in `name`, the filters' entries side by side (a (filters, 3, 3) weight)."""
    return lambda e: f"{name}[p * {entries} + {e}]"


def _transform_loop(k: _Constants, mat, src, dst, bias: bool = False, relu: bool = False) -> list[str]:
    """One loop over a task's q tiles (or filters) p: Y = mat @ X @ mat^T of each, entry e of X read at src(e) and
    of Y stored at dst(e) (_rows, _interleaved); with `bias`, brow[p] added to every entry of Y, then a relu if
    `relu` (np.maximum, as the relu kernel: NaN stays NaN). The first product's values stay in locals.

    NOTE: src and dst are 1-d slices read at constant offsets: LLVM then checks each for overlap once and the loop
    runs on zmm vectors. Without FMA contraction the arithmetic and its order are those of two passes of row loops
    (contracting measured no faster: the pixel copies dominate). The MNIST CNN's conv2 at batch 1, one thread:
    output transform's products 10.5 -> 3.8 us, input's 2.5 us; it compiles in ~0.5 s (an F(4x4) transform
    written as 72 row loops took 6-14 s)."""
    rows, width = mat.shape
    used = [i for i in range(width) if mat[:, i].any()]
    body = [f"x{i}_{j} = {src(i * width + j)}" for i in used for j in used]
    for a in range(rows):
        body += [f"t{a}_{j} = {k.combination(mat[a], [f'x{i}_{j}' if i in used else '0' for i in range(width)])}"
                 for j in used]
    for a in range(rows):
        for b in range(rows):
            value = k.combination(mat[b], [f"t{a}_{j}" if j in used else "0" for j in range(width)])
            if bias:
                value = f"np.maximum({value} + brow[p], {k.ctor}(0))" if relu else f"{value} + brow[p]"
            body.append(f"{dst(a * rows + b)} = {value}")
    return ["    for p in range(q):"] + indent(body, 2)


# An L1 data cache's sets (64-byte lines, 64 sets of 12 ways in this machine's 48 KiB, as in recent x86 cores) and
# the most rows of a transform loop that may map to one of them: more, and its loads or stores evict each other.
L1_SETS, ROWS_PER_SET = 64, 12


def _conflicting(rows: int, stride: int, itemsize: int) -> bool:
    """Whether `rows` rows `stride` elements apart, read or written together, map too many of them to one L1 set.

    NOTE: the MNIST CNN's conv2 at batch 64 has its transformed rows 288 KiB apart (a multiple of 4 KiB: every row
    in one set); read or written by one loop they took the input transform from 0.50 to 1.03 ms (min, 2 threads),
    against 36 rows copied through a buffer whose rows are one line apart."""
    aligned = stride * itemsize % 64 == 0  # else the rows' lines spread over the sets
    sets = L1_SETS // math.gcd(stride * itemsize // 64 % L1_SETS, L1_SETS) if aligned else L1_SETS
    return rows > ROWS_PER_SET * sets


def _copy_rows(src: str, ss, dst: str, ds, rows: int) -> list[str]:
    """Copy q values of each of `rows` rows from src (rows ss apart) to dst (rows ds apart)."""
    return [f"    for rw in range({rows}):", f"        sr = {src}[rw * {ss}:rw * {ss} + q]",
            f"        dr = {dst}[rw * {ds}:rw * {ds} + q]", "        for p in range(q):", "            dr[p] = sr[p]"]


def _gather_lines(mat, tl: _Tiling, loop, dtype, dest, row_step: int) -> list[str]:
    """Plane tiles -> their transforms mat @ d @ mat^T, entry (a, b) of tile p written at dest(a * R + b) + p (rows
    `row_step` apart). The tiles' pixels are first copied into d (patch*patch rows, zeros outside the planes), then
    transformed in one loop along its rows."""
    r, kk = mat.shape
    k, dt = _Constants(dtype), ctor(dtype)
    # NOTE: d starts as zeros only where some patch reaches outside its plane (a 166 KB memset at the MNIST CNN's
    # conv2, batch 1, where none does)
    lines = _task_lines(tl, loop, dt, [("d", "empty" if tl.inside else "zeros", kk * kk)])
    lines += ["    df = d.reshape(-1)", f"    ov = out0[{dest(0)} + p0:]"]

    def copy(j, bounds):
        x = f"tx * {tl.step} + {j - tl.offset[1]}"
        store = [f"d[i * {kk} + {j}, g + tx] = in0[prow + {x}]"]
        return ([f"if 0 <= {x} < {tl.plane_hw[1]}:"] + indent(store)) if bounds else store
    lines += _pixel_loops(tl, copy, shared_rows=True) + _shared_row_copies(tl)
    if _conflicting(r * r, row_step, dtype.itemsize):  # through a buffer with rows one line apart
        padded = tl.columns + 64 // dtype.itemsize
        lines += [f"    ob = np.empty({r * r * padded}, dtype={dt})"]
        lines += _transform_loop(k, mat, _rows("df", tl.columns), _rows("ob", padded))
        lines += _copy_rows("ob", padded, "ov", row_step, r * r)
    else:
        lines += _transform_loop(k, mat, _rows("df", tl.columns), _rows("ov", row_step))
    return k.lines() + lines


def _scatter_lines(mat, tl: _Tiling, loop, dtype, source, row_step: int, add: bool, bias=None,
                   relu: bool = False) -> list[str]:
    """Transformed tiles (entry (a, b) of tile p at source(a * R + b) + p, rows `row_step` apart) -> mat @ X @ mat^T
    in one loop along the tiles into e, whose pixels are then stored into the planes (added where tiles overlap:
    `add`, on planes the task zeroes first). With `bias` (channel -> the expression reading its bias), each tile's
    channel's bias is added (from a row of them, brow) in that loop, then a relu if `relu`."""
    kk, r = mat.shape
    k, dt = _Constants(dtype), ctor(dtype)
    cols = tl.columns
    lines = _task_lines(tl, loop, dt, [("e", "empty", kk * kk)])
    lines += ["    ef = e.reshape(-1)", f"    iv = in0[{source(0)} + p0:]"]
    if add:
        h, w = tl.plane_hw
        lines += ["    for cn in range(ng * ns):", f"        plane = {tl.plane_at('(ch0 + cn // ns)', 'n0 + cn % ns')}",
                  f"        for x in range({h * w}):", "            out0[plane + x] = 0"]
    if bias:
        lines += [f"    brow = np.empty({cols}, dtype={dt})", "    for cn in range(ng * ns):",
                  f"        bv = {bias('ch0 + cn // ns')}", f"        for p in range({tl.per_sample}):",
                  f"            brow[cn * {tl.per_sample} + p] = bv"]
    if _conflicting(r * r, row_step, dtype.itemsize):  # through a buffer with rows one line apart
        padded = cols + 64 // dtype.itemsize
        lines += [f"    ib = np.empty({r * r * padded}, dtype={dt})"] + _copy_rows("iv", row_step, "ib", padded, r * r)
        lines += _transform_loop(k, mat, _rows("ib", padded), _rows("ef", cols), bias is not None, relu)
    else:
        lines += _transform_loop(k, mat, _rows("iv", row_step), _rows("ef", cols), bias is not None, relu)

    def store(j, bounds):
        x = f"tx * {tl.step} + {j - tl.offset[1]}"
        line = [f"out0[prow + {x}] {'+' if add else ''}= e[i * {kk} + {j}, g + tx]"]
        return ([f"if 0 <= {x} < {tl.plane_hw[1]}:"] + indent(line)) if bounds else line
    return k.lines() + lines + _pixel_loops(tl, store)


def _filter_lines(mat, oc: int, loop: str, dtype, forward: bool) -> list[str]:
    """Filters in blocks of FILTER_BLOCK, each block's filters transformed in one loop along them (_transform_loop).
    forward: w (OC, 3, 3) -> U (T*T, OC) = mat @ w @ mat^T (mat = G, T x 3), the 9 weights of a filter read side by
    side. Backward: dU (T*T, OC) -> dw (OC, 3, 3) = mat @ dU @ mat^T (mat = G^T, 3 x T). U's rows go through a
    buffer where they would map to one cache set (_conflicting: 2048 filters, 8 KiB apart, took 37 us against 8)."""
    k, dt = _Constants(dtype), ctor(dtype)
    fb = FILTER_BLOCK
    rows = mat.shape[0] ** 2 if forward else mat.shape[1] ** 2  # U's
    buffered = _conflicting(rows, oc, dtype.itemsize)
    padded = fb + 64 // dtype.itemsize
    lines = [f"for blk in {loop}({-(-oc // fb)}):",
             f"    t0 = blk * {fb}",
             f"    q = min({fb}, {oc} - t0)"]
    if forward:
        lines += ["    wv = in0[t0 * 9:]", "    uv = out0[t0:]"]
        if buffered:
            lines += [f"    ub = np.empty({rows * padded}, dtype={dt})"]
            lines += _transform_loop(k, mat, _interleaved("wv", 9), _rows("ub", padded))
            lines += _copy_rows("ub", padded, "uv", oc, rows)
        else:
            lines += _transform_loop(k, mat, _interleaved("wv", 9), _rows("uv", oc))
    else:
        lines += ["    uv = in0[t0:]", "    wv = out0[t0 * 9:]"]
        if buffered:
            lines += [f"    ub = np.empty({rows * padded}, dtype={dt})"] + _copy_rows("uv", oc, "ub", padded, rows)
        lines += _transform_loop(k, mat, _rows("ub", padded) if buffered else _rows("uv", oc), _interleaved("wv", 9))
    return k.lines() + lines


def _vector_at(a):
    """index -> the expression reading entry index of the 1-d value `a` (an argument, or a folded view of one)."""
    stride = 1 if a.strides is None else a.strides[0]
    return lambda i: f"{a.arg}[{a.offset} + {stride} * ({i})]"


def gen_winograd(kb: KernelBuilder) -> None:
    node, op, attrs, in_shape, out_shape = _geometry(kb.kernel)
    sched = _schedule(op, attrs, in_shape, out_shape)
    bt, g, at = _winograd.matrices(attrs["tile"])
    dtype = kb.outs[0].dtype
    mat = {"winograd_filter": g, "winograd_filter_backward": g.T, "winograd_input": bt,
           "winograd_input_backward": bt.T, "winograd_output": at, "winograd_output_backward": at.T,
           "winograd_output_bias": at}[op]
    if op == "winograd_filter":  # (O, C, 3, 3) -> (T*T, O, C)
        body = _filter_lines(mat, in_shape[0] * in_shape[1], sched.loop, dtype, forward=True)
    elif op == "winograd_filter_backward":  # (T*T, O, C) -> (O, C, 3, 3): dw = G^T dU G
        body = _filter_lines(mat, in_shape[1] * in_shape[2], sched.loop, dtype, forward=False)
    else:
        tl, p = _tiling_of(op, attrs, in_shape, out_shape)

        def row_at(r):  # row r of the task's first channel ch0 in the (T*T, channels, P) transformed tiles
            return f"({r} * {tl.channels} + ch0) * {p}"
        if op in ("winograd_input", "winograd_output_backward"):
            body = _gather_lines(mat, tl, sched.loop, dtype, row_at, tl.channels * p)
        else:
            body = _scatter_lines(mat, tl, sched.loop, dtype, row_at, tl.channels * p,
                                  add=op == "winograd_input_backward", relu=bool(attrs.get("relu")),
                                  bias=_vector_at(kb.read_of(node.args[1])) if op == "winograd_output_bias" else None)
    f = Function(kb.name, kb.ins + kb.outs, body, sched.parallel)
    kb.launch = [launch_line(f)]
    kb.functions.append(f)
