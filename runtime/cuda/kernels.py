"""CUDA kernels for eager ops, generated as Python source for numba.cuda.jit and cached per (op, dtypes, rank).

Three skeletons around the op table's scalar templates (runtime/cuda/templates.py):
- elementwise: a grid-stride loop over the output's elements; every operand is a view broadcast to the output's
  shape (stride 0 where it broadcasts), so one kernel per (op, dtypes, rank) serves every broadcast;
- reduction: one block per output row of a (rows, columns) view, each thread folding a strided slice of the row,
  then a tree reduction in shared memory (the Reducer's combine template); arg-reductions carry the index along;
- matmul: (batch, M, K) @ (batch, K, N), tiled through shared memory, one block per output tile, the batch on
  the grid's z axis.
`sources()` returns every kernel generated so far, for reading.
"""
from __future__ import annotations

import math
import types
import warnings

import numpy as np
from numba import cuda

from . import memory, templates
from .templates import literal

# NOTE: the simulator runs every CUDA thread as a Python thread, so it gets small blocks and grids; the kernels are
# the same source with other sizes (TILE is a constant of the matmul source), and every size works on a GPU too.
THREADS = 16 if memory.SIMULATOR else 256
MAX_BLOCKS = 4 if memory.SIMULATOR else 65535
REDUCE_THREADS = 8 if memory.SIMULATOR else 256
TILE = 4 if memory.SIMULATOR else 16


def _simulated_math():
    """math's functions as numpy's (nan and inf where Python's math raises), for kernels run by the simulator."""
    names = {"exp": np.exp, "log": np.log, "log1p": np.log1p, "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos,
             "tanh": np.tanh, "floor": np.floor}

    def erf(x):
        from .._special import erf as special_erf

        return x.dtype.type(special_erf(np.asarray(x)))

    return types.SimpleNamespace(nan=math.nan, inf=math.inf, erf=erf, **names)


KERNEL_GLOBALS = {"cuda": cuda, "np": np, "math": _simulated_math() if memory.SIMULATOR else math,
                  "__name__": "runtime.cuda.generated"}
if memory.SIMULATOR:
    # the simulator computes with numpy scalars, which warn where a GPU silently gives inf or nan
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="runtime.cuda.generated")
_CACHE: dict = {}


def _compile(key, name: str, source: str):
    """The jitted kernel for a cache key, compiling its source on first use."""
    entry = _CACHE.get(key)
    if entry is None:
        scope = dict(KERNEL_GLOBALS)
        exec(compile(source, f"<runtime.cuda kernel {name}>", "exec"), scope)
        entry = _CACHE[key] = (cuda.jit(scope[name]), source)
    return entry[0]


def sources() -> dict:
    """{cache key: generated source} of every kernel compiled so far in this process."""
    return {key: source for key, (_, source) in _CACHE.items()}


def launch_1d(n: int) -> tuple:
    """(blocks, threads) for a grid-stride loop over n elements."""
    return min(max(-(-n // THREADS), 1), MAX_BLOCKS), THREADS


def _index(names: list[str]) -> str:
    return ", ".join(names) if names else "0"


def _unravel(rank: int, indent: str, over: str = "out") -> list[str]:
    """Lines turning flat index i into j0..j{rank-1} over the shape of array `over` (the last dim fastest)."""
    lines = [f"{indent}r = i"]
    for d in range(rank - 1, 0, -1):
        lines.append(f"{indent}j{d} = r % {over}.shape[{d}]")
        lines.append(f"{indent}r = r // {over}.shape[{d}]")
    lines.append(f"{indent}j0 = r")
    return lines


# ---------------------------------------------------------------------------------------------------------------
# elementwise
# ---------------------------------------------------------------------------------------------------------------

def elementwise_source(name: str, op, operand_dtypes: list, compute, out_dtype, rank: int, attrs: dict) -> str:
    """The kernel of one elementwise op: out[j] = template(operands[j]); an operand dtype None is a scalar argument
    (already in its final dtype), a numpy dtype an array broadcast to out's shape."""
    params = ["out"] + [f"a{k}" if d is not None else f"s{k}" for k, d in enumerate(operand_dtypes)]
    if op.name == "clamp":
        params += ["lo", "hi"]
    index = _index([f"j{d}" for d in range(rank)])
    lines = [f"def {name}({', '.join(params)}, n):",
             "    i = cuda.grid(1)",
             "    step = cuda.gridsize(1)",
             "    while i < n:"]
    lines += _unravel(rank, " " * 8)
    operands = []
    # NOTE: an op whose dtype rule gives no compute dtype computes in its result's (logical_xor's operands are
    # truthiness, as numpy's logical ops read them), as nnc's code generators do
    work = np.dtype(compute if compute is not None else out_dtype)
    for k, d in enumerate(operand_dtypes):
        is_cast = op.cast_inputs is None or k in op.cast_inputs
        if d is None:
            operands.append(f"s{k}")
            continue
        load = f"a{k}[{index}]"
        if is_cast and np.dtype(d) != work:
            load = templates.cast(load, work)
        lines.append(f"        x{k} = {load}")
        operands.append(f"x{k}")
    expr = templates.render(op.template, operands, attrs, work, f"{op.name}")
    lines.append(f"        out[{index}] = {templates.cast(expr, out_dtype)}")
    lines.append("        i += step")
    return "\n".join(lines) + "\n"


def elementwise(op, operand_dtypes: tuple, compute, out_dtype, rank: int, attrs: dict):
    """The compiled elementwise kernel for op on operands of these dtypes (None: a scalar) and rank."""
    clamp = (attrs.get("min") is not None, attrs.get("max") is not None) if op.name == "clamp" else None
    cast_to = attrs["dtype"].name if op.name == "cast" else None
    key = ("elementwise", op.name, operand_dtypes, compute, np.dtype(out_dtype), rank, clamp, cast_to)
    entry = _CACHE.get(key)
    if entry is not None:
        return entry[0]
    name = f"{op.name}_r{rank}"
    return _compile(key, name, elementwise_source(name, op, list(operand_dtypes), compute, out_dtype, rank, attrs))


# ---------------------------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------------------------

def _shared_dtype(d: np.dtype) -> np.dtype:
    return np.dtype(np.uint8) if d.kind == "b" else d


def reduction_source(name: str, reducer, in_dtype, acc_dtype, out_dtype, threads: int) -> str:
    """One block per row of a (rows, cols) array: strided per-thread folds, then a shared-memory tree."""
    acc, store = np.dtype(acc_dtype), _shared_dtype(np.dtype(acc_dtype))
    combine = lambda a, b: templates.render(reducer.combine, [a, b], {}, acc, "reducer")  # noqa: E731
    load = templates.cast("a[row, c]", acc) if np.dtype(in_dtype) != acc else "a[row, c]"
    shared_load = lambda expr: templates.cast(expr, acc) if store != acc else expr  # noqa: E731
    to_store = lambda expr: templates.cast(expr, store) if store != acc else expr  # noqa: E731
    identity = literal(reducer.identity(acc), acc)
    lines = [
        f"def {name}(out, a):",
        f"    shared = cuda.shared.array({threads}, np.{store.name})",
        "    t = cuda.threadIdx.x",
        "    row = cuda.blockIdx.x",
        "    while row < a.shape[0]:",
        f"        acc = {identity}",
        "        c = t",
        "        while c < a.shape[1]:",
        f"            acc = {combine('acc', load)}",
        f"            c += {threads}",
        f"        shared[t] = {to_store('acc')}",
        "        cuda.syncthreads()",
        f"        s = {threads // 2}",
        "        while s > 0:",
        "            if t < s:",
        f"                shared[t] = {to_store(combine(shared_load('shared[t]'), shared_load('shared[t + s]')))}",
        "            cuda.syncthreads()",
        "            s = s // 2",
        "        if t == 0:",
        f"            out[row] = {templates.cast(shared_load('shared[0]'), out_dtype)}",
        "        cuda.syncthreads()",
        "        row += cuda.gridDim.x",
    ]
    return "\n".join(lines) + "\n"


def reduction(op, in_dtype, acc_dtype, out_dtype):
    threads = REDUCE_THREADS
    key = ("reduction", op.name, np.dtype(in_dtype), np.dtype(acc_dtype), np.dtype(out_dtype), threads)
    entry = _CACHE.get(key)
    if entry is not None:
        return entry[0], threads
    name = f"reduce_{op.name}"
    return _compile(key, name, reduction_source(name, op.reducer, in_dtype, acc_dtype, out_dtype, threads)), threads


def arg_reduction_source(name: str, largest: bool, threads: int) -> str:
    """argmax/argmin per row: the first index of the extreme value; a nan is extreme (numpy's rule)."""
    better = ">" if largest else "<"
    # (v, i) replaces (w, k): a valid candidate that is more extreme, the first nan, or as extreme and earlier
    wins = (f"k < 0 or (i >= 0 and (v {better} w or (v != v and w == w) or "
            f"((v == w or (v != v and w != w)) and i < k)))")
    lines = [
        f"def {name}(out, a, sv):",
        f"    si = cuda.shared.array({threads}, np.int64)",
        "    t = cuda.threadIdx.x",
        "    row = cuda.blockIdx.x",
        "    while row < a.shape[0]:",
        "        k = -1",
        "        w = a[row, 0]",
        "        c = t",
        "        while c < a.shape[1]:",
        "            v = a[row, c]",
        "            i = c",
        f"            if {wins}:",
        "                w = v",
        "                k = i",
        f"            c += {threads}",
        "        sv[row, t] = w",
        "        si[t] = k",
        "        cuda.syncthreads()",
        f"        s = {threads // 2}",
        "        while s > 0:",
        "            if t < s:",
        "                v = sv[row, t + s]",
        "                i = si[t + s]",
        "                w = sv[row, t]",
        "                k = si[t]",
        f"                if {wins}:",
        "                    sv[row, t] = v",
        "                    si[t] = i",
        "            cuda.syncthreads()",
        "            s = s // 2",
        "        if t == 0:",
        "            out[row] = si[0]",
        "        cuda.syncthreads()",
        "        row += cuda.gridDim.x",
    ]
    return "\n".join(lines) + "\n"


def arg_reduction(op, in_dtype):
    threads = REDUCE_THREADS
    key = ("arg_reduction", op.name, np.dtype(in_dtype), threads)
    entry = _CACHE.get(key)
    if entry is not None:
        return entry[0], threads
    name = f"reduce_{op.name}"
    return _compile(key, name, arg_reduction_source(name, op.name == "argmax", threads)), threads


# ---------------------------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------------------------

def matmul_source(name: str, acc_dtype, out_dtype, tile: int) -> str:
    """out[b] = a[b] @ c[b] with a (B, M, K), c (B, K, N): tiles of both through shared memory."""
    acc = np.dtype(acc_dtype)
    zero = literal(0, acc)
    load = lambda expr: templates.cast(expr, acc)  # noqa: E731
    lines = [
        f"def {name}(out, a, c):",
        f"    sa = cuda.shared.array(({tile}, {tile}), np.{acc.name})",
        f"    sc = cuda.shared.array(({tile}, {tile}), np.{acc.name})",
        "    tx = cuda.threadIdx.x",
        "    ty = cuda.threadIdx.y",
        "    b = cuda.blockIdx.z",
        f"    row = cuda.blockIdx.y * {tile} + ty",
        f"    col = cuda.blockIdx.x * {tile} + tx",
        "    m = a.shape[1]",
        "    k = a.shape[2]",
        "    n = c.shape[2]",
        f"    acc = {zero}",
        "    for k0 in range(0, k, " + str(tile) + "):",
        f"        sa[ty, tx] = {load('a[b, row, k0 + tx]')} if row < m and k0 + tx < k else {zero}",
        f"        sc[ty, tx] = {load('c[b, k0 + ty, col]')} if k0 + ty < k and col < n else {zero}",
        "        cuda.syncthreads()",
        f"        for q in range({tile}):",
        "            acc += sa[ty, q] * sc[q, tx]",
        "        cuda.syncthreads()",
        "    if row < m and col < n:",
        f"        out[b, row, col] = {templates.cast('acc', out_dtype)}",
    ]
    return "\n".join(lines) + "\n"


def matmul(acc_dtype, out_dtype):
    key = ("matmul", np.dtype(acc_dtype), np.dtype(out_dtype), TILE)
    entry = _CACHE.get(key)
    if entry is not None:
        return entry[0], TILE
    name = "matmul_tiled"
    return _compile(key, name, matmul_source(name, acc_dtype, out_dtype, TILE)), TILE


# ---------------------------------------------------------------------------------------------------------------
# gather and scatter_add along one dim
# ---------------------------------------------------------------------------------------------------------------

def gather_source(name: str, rank: int, dim: int, scatter: bool) -> str:
    """gather: out[j] = x[j with j[dim] = index[j]]; scatter_add: out[j with j[dim] = index[j]] += src[j], with
    atomic adds (indices may repeat). One element of index per loop step."""
    own = _index([f"j{d}" for d in range(rank)])
    picked = _index([f"j{d}" if d != dim else "k" for d in range(rank)])
    params = "out, src, index, n" if scatter else "out, x, index, n"
    lines = [f"def {name}({params}):",
             "    i = cuda.grid(1)",
             "    step = cuda.gridsize(1)",
             "    while i < n:"]
    lines += _unravel(rank, " " * 8, over="index")
    lines.append(f"        k = index[{own}]")
    if scatter:
        lines.append(f"        cuda.atomic.add(out, ({picked},), src[{own}])")
    else:
        lines.append(f"        out[{own}] = x[{picked}]")
    lines.append("        i += step")
    return "\n".join(lines) + "\n"


def gather(rank: int, dim: int, dtype, scatter: bool):
    key = ("scatter_add" if scatter else "gather", rank, dim, np.dtype(dtype))
    entry = _CACHE.get(key)
    if entry is not None:
        return entry[0]
    name = f"{key[0]}_r{rank}_d{dim}"
    return _compile(key, name, gather_source(name, rank, dim, scatter))


# ---------------------------------------------------------------------------------------------------------------
# indexing one dim with an integer tensor: x[:, idx] and its writes
# ---------------------------------------------------------------------------------------------------------------

def take_source(name: str, mode: str) -> str:
    """On (pre, n, post) views: take: out[a, i, b] = x[a, idx[i], b]; put: out[a, idx[i], b] = v[a, i, b]; put_add:
    the same with atomic adds (repeated indices add up). Negative indices count from the end, as numpy's."""
    source = "v" if mode != "take" else "x"
    over = "out" if mode == "take" else "v"
    lines = [f"def {name}(out, {source}, idx, size, n):",
             "    i = cuda.grid(1)",
             "    step = cuda.gridsize(1)",
             "    while i < n:"]
    lines += _unravel(3, " " * 8, over=over)
    lines += ["        k = idx[j1]",
              "        if k < 0:",
              "            k += size"]
    if mode == "take":
        lines.append("        out[j0, j1, j2] = x[j0, k, j2]")
    elif mode == "put":
        lines.append("        out[j0, k, j2] = v[j0, j1, j2]")
    else:
        lines.append("        cuda.atomic.add(out, (j0, k, j2), v[j0, j1, j2])")
    lines.append("        i += step")
    return "\n".join(lines) + "\n"


def take(mode: str, dtype, index_dtype):
    key = ("take", mode, np.dtype(dtype), np.dtype(index_dtype))
    entry = _CACHE.get(key)
    if entry is not None:
        return entry[0]
    name = f"{mode}_dim"
    return _compile(key, name, take_source(name, mode))


# ---------------------------------------------------------------------------------------------------------------
# sliding windows: im2col, col2im, max_pool and its backward (runtime.ops' window ops; attributes per spatial dim)
# ---------------------------------------------------------------------------------------------------------------

def _window_position(lines, indent, spatial, out_sizes_var, attrs, kernel_var="k", out_var="l"):
    """Lines unravelling kernel offset `k` and output position `l`, then the input position p{d} they read, and
    `inside` (whether it lies in the unpadded input)."""
    kernel, stride, padding, dilation = attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"]
    lines.append(f"{indent}rk = {kernel_var}")
    lines.append(f"{indent}rl = {out_var}")
    for d in range(spatial - 1, -1, -1):
        lines.append(f"{indent}k{d} = rk % {kernel[d]}")
        lines.append(f"{indent}rk = rk // {kernel[d]}")
        lines.append(f"{indent}o{d} = rl % {out_sizes_var}[{d}]")
        lines.append(f"{indent}rl = rl // {out_sizes_var}[{d}]")
    checks = []
    for d in range(spatial):
        lines.append(f"{indent}p{d} = o{d} * {stride[d]} + k{d} * {dilation[d]} - {padding[d][0]}")
        checks.append(f"0 <= p{d} < x.shape[{d + 2}]")
    lines.append(f"{indent}inside = {' and '.join(checks)}")


def im2col_source(name: str, spatial: int, attrs: dict) -> str:
    """cols[c * K + k, n * L + l] = the padded input at window l's kernel offset k (0 in the padding)."""
    ksize = math.prod(attrs["kernel"])
    pos = ", ".join(f"p{d}" for d in range(spatial))
    lines = [f"def {name}(out, x, out_sizes, n_out, count):",
             "    i = cuda.grid(1)",
             "    step = cuda.gridsize(1)",
             "    while i < count:",
             "        row = i // out.shape[1]",
             "        col = i % out.shape[1]",
             f"        c = row // {ksize}",
             f"        k = row % {ksize}",
             "        n = col // n_out",
             "        l = col % n_out"]
    _window_position(lines, " " * 8, spatial, "out_sizes", attrs)
    lines += [f"        out[row, col] = x[n, c, {pos}] if inside else 0",
              "        i += step"]
    return "\n".join(lines) + "\n"


def col2im_source(name: str, spatial: int, attrs: dict) -> str:
    """out[n, c, p] = the sum of the columns' entries that im2col took from position p (its adjoint), gathered
    per input position: for each kernel offset, the window that reads p there, if any."""
    kernel, stride, padding, dilation = attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"]
    ksize = math.prod(kernel)
    lines = [f"def {name}(out, cols, out_sizes, n_out, count):",
             "    i = cuda.grid(1)",
             "    step = cuda.gridsize(1)",
             "    while i < count:",
             "        r = i"]
    for d in range(spatial + 1, -1, -1):
        lines.append(f"        q{d} = r % out.shape[{d}]")
        lines.append(f"        r = r // out.shape[{d}]")
    lines += ["        total = cols[0, 0] * 0",
              f"        for k in range({ksize}):",
              "            rk = k",
              "            ok = True",
              "            l = 0"]
    for d in range(spatial - 1, -1, -1):
        lines += [f"            k{d} = rk % {kernel[d]}",
                  f"            rk = rk // {kernel[d]}"]
    for d in range(spatial):
        lines += [f"            t{d} = q{d + 2} + {padding[d][0]} - k{d} * {dilation[d]}",
                  f"            if t{d} < 0 or t{d} % {stride[d]} != 0 or t{d} // {stride[d]} >= out_sizes[{d}]:",
                  "                ok = False",
                  f"            l = l * out_sizes[{d}] + t{d} // {stride[d]}"]
    lines += ["            if ok:",
              f"                total += cols[q1 * {ksize} + k, q0 * n_out + l]",
              "        out[" + ", ".join(f"q{d}" for d in range(spatial + 2)) + "] = total",
              "        i += step"]
    return "\n".join(lines) + "\n"


def max_pool_source(name: str, spatial: int, attrs: dict, backward: bool, pick: bool = False) -> str:
    """Forward: out[n, c, o] = the window's maximum (padding never wins; a nan wins). Backward: g[n, c, o] added
    (atomically: windows overlap) at the window's first maximum, the last nan where there are nans (numpy's rule
    in runtime.ops). Pick (the backward's adjoint): out[n, c, o] = g (x's shape) at the window's maximum."""
    ksize = math.prod(attrs["kernel"])
    pos = ", ".join(f"p{d}" for d in range(spatial))
    own = ", ".join(f"q{d}" for d in range(spatial + 2))
    params = "out, g, x, out_sizes, count" if backward or pick else "out, x, out_sizes, count"
    over = "g" if backward else "out"
    lines = [f"def {name}({params}):",
             "    i = cuda.grid(1)",
             "    step = cuda.gridsize(1)",
             "    while i < count:",
             "        r = i"]
    for d in range(spatial + 1, -1, -1):
        lines.append(f"        q{d} = r % {over}.shape[{d}]")
        lines.append(f"        r = r // {over}.shape[{d}]")
    lines += ["        n = q0",
              "        c = q1",
              "        l = " + " + ".join(f"q{d + 2} * " + " * ".join([str(1)] + [f"out_sizes[{e}]" for e in
                                                                            range(d + 1, spatial)])
                                        for d in range(spatial)),
              "        found = False",
              "        best = x[n, c, " + ", ".join("0" for _ in range(spatial)) + "]",
              "        where = 0",
              f"        for k in range({ksize}):"]
    _window_position(lines, " " * 12, spatial, "out_sizes", attrs, kernel_var="k", out_var="l")
    lines += ["            if inside:",
              f"                v = x[n, c, {pos}]",
              "                if not found or v > best or v != v:",
              "                    best = v",
              "                    where = k",
              "                    found = True"]
    if backward or pick:
        lines += ["        rk = where"]
        kernel, stride, padding, dilation = attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"]
        for d in range(spatial - 1, -1, -1):
            lines += [f"        k{d} = rk % {kernel[d]}", f"        rk = rk // {kernel[d]}"]
        target = ", ".join(f"q{d + 2} * {stride[d]} + k{d} * {dilation[d]} - {padding[d][0]}" for d in range(spatial))
        lines += [f"        out[{own}] = g[n, c, {target}]" if pick else
                  f"        cuda.atomic.add(out, (n, c, {target}), g[{own}])"]
    else:
        lines += [f"        out[{own}] = best"]
    lines.append("        i += step")
    return "\n".join(lines) + "\n"


def window(op_name: str, spatial: int, attrs: dict, dtype):
    key = ("window", op_name, spatial, np.dtype(dtype), tuple(sorted((k, attrs[k]) for k in
                                                                    ("kernel", "stride", "padding", "dilation"))))
    entry = _CACHE.get(key)
    if entry is not None:
        return entry[0]
    name = f"{op_name}_{spatial}d"
    if op_name == "im2col":
        source = im2col_source(name, spatial, attrs)
    elif op_name == "col2im":
        source = col2im_source(name, spatial, attrs)
    else:
        source = max_pool_source(name, spatial, attrs, backward=op_name == "max_pool_backward",
                                 pick=op_name == "max_pool_pick")
    return _compile(key, name, source)


# ---------------------------------------------------------------------------------------------------------------
# scans along one dim (cumsum, cumprod)
# ---------------------------------------------------------------------------------------------------------------

def scan_source(name: str, combine: str, out_dtype) -> str:
    """One thread per row of (rows, n) views, folding the row in order in the result's dtype (numpy's cumsum and
    cumprod round the same way, element after element)."""
    load = templates.cast("a[row, c]", out_dtype)
    lines = [f"def {name}(out, a):",
             "    row = cuda.grid(1)",
             "    step = cuda.gridsize(1)",
             "    while row < a.shape[0]:",
             f"        acc = {load.replace('c]', '0]')}",
             "        out[row, 0] = acc",
             "        for c in range(1, a.shape[1]):",
             f"            acc = {templates.render(combine, ['acc', load], {}, np.dtype(out_dtype), 'scan')}",
             "            out[row, c] = acc",
             "        row += step"]
    return "\n".join(lines) + "\n"


def scan(op_name: str, combine: str, in_dtype, out_dtype):
    key = ("scan", op_name, np.dtype(in_dtype), np.dtype(out_dtype))
    entry = _CACHE.get(key)
    if entry is not None:
        return entry[0]
    name = f"scan_{op_name}"
    return _compile(key, name, scan_source(name, combine, out_dtype))
