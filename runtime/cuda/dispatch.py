"""Eager ops on CUDA tensors: runs one primitive of the op table on device arrays (kernels from kernels.py, views
without copies) and returns the result's device array. Called by Tensor._apply_op when an input is on the device.

What runs: every elementwise op with a template, the reductions (sum, prod, amax, amin, all, any, argmax,
argmin), matmul and linear, the view ops (reshape, permute, expand, getitem with basic keys), cat, getitem and
index_put with basic keys or one integer index tensor on one dim, gather, scatter_add, cumsum, cumprod, the window
ops (im2col, col2im, max_pool, max_pool_backward, max_pool_pick), full and arange, and the fused ops that have a
decomposition (log_softmax, nll_loss and their backwards, constant_pad) through it. Anything else raises NoLowering
naming the op: nothing is ever computed on the host.
"""
from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..ops import Kind
from . import kernels, memory
from .templates import NoLowering


def device_error(devices) -> RuntimeError:
    names = sorted(set(devices), key=lambda d: d != "cuda:0")
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"{names[0]} and {names[1]}!")


def run(op, inputs, arrays, attrs, compute, out_dtype):
    """(result device array, whether it is a view of input 0's memory) of op on inputs, some on the device.

    `arrays` are the inputs' arrays (device or host) or scalars; `compute` and `out_dtype` come from the op's dtype
    rule (runtime dtypes; compute may be None). A fused op with no lowering of its own but a decomposition runs as
    that (the result is then a Tensor with its own autograd history)."""
    if op.decomposition is not None:
        return op.decomposition(*inputs, **attrs), False
    arrays = _operands(op, arrays)
    out_np = out_dtype.np
    compute_np = compute.np if compute is not None else None
    if op.name not in _VIEWS and op.name != "detach":
        _check_no_float16(op, arrays, out_np)
    if op.kind == Kind.ELEMENTWISE and op.template is not None:
        if op.name == "detach":
            return arrays[0], True
        if op.divisor is not None and compute_np is not None and compute_np.kind in "iu":
            _check_divisor(arrays[op.divisor])
        return elementwise(op, arrays, attrs, compute_np, out_np), False
    if op.kind == Kind.REDUCTION:
        return reduce(op, arrays[0], attrs, out_np), False
    if op.name == "matmul":
        return matmul(arrays[0], arrays[1], out_np), False
    if op.name == "linear":
        return linear(arrays[0], arrays[1], out_np), False
    if op.name in _VIEWS:
        return _VIEWS[op.name](op, arrays, attrs)
    if op.name == "cat":
        return cat(arrays, attrs["dim"], out_np), False
    if op.name == "index_put":
        return index_put(arrays, attrs, out_np), False
    if op.name == "full":
        return full(attrs["shape"], attrs["value"], out_np), False
    if op.name == "arange":  # a factory: its values depend on no tensor, so they are made on the host and copied
        return memory.to_device(op.forward(**attrs)), False
    if op.name in _SCANS:
        return scan(op.name, arrays[0], attrs["dim"], out_np), False
    if op.kernel_kind == "window" or op.name == "max_pool_pick":
        return window(op.name, arrays, attrs, out_np), False
    if op.name == "gather":
        return gather(arrays[0], arrays[1], attrs["dim"], out_np), False
    if op.name == "scatter_add":
        return scatter_add(arrays[0], arrays[1], arrays[2], attrs["dim"], out_np), False
    raise NoLowering(f"op {op.name!r} has no CUDA lowering in runtime's eager CUDA backend; "
                     f"run it on the CPU (tensor.cpu()) or add a lowering in runtime/cuda/dispatch.py")


def _check_no_float16(op, arrays, out_dtype) -> None:
    if np.dtype(out_dtype) == np.float16 or any(not _is_scalar(a) and a.dtype == np.float16 for a in arrays):
        raise NoLowering(f"op {op.name!r} has no CUDA lowering for float16 tensors yet (runtime generates float32 "
                         f"and float64 kernels); compute in float32 (tensor.float())")


_INDEXED = {"getitem": 1, "index_put": 2}  # the first index tensor's position among each op's inputs


def _is_scalar(a) -> bool:
    return a is None or isinstance(a, (bool, int, float, np.generic))


def _operands(op, arrays):
    """Host 0-d arrays (CPU scalar tensors, which torch lets CUDA ops read) become scalars; other host arrays
    mixed with device ones are torch's device error."""
    out = []
    for k, a in enumerate(arrays):
        if isinstance(a, np.ndarray) and op.name in _INDEXED and k >= _INDEXED[op.name]:
            a = memory.to_device(a)  # index tensors may live on the host, as torch's CUDA indexing allows
        if isinstance(a, np.ndarray):
            if a.ndim != 0 or op.kind not in (Kind.ELEMENTWISE,):
                raise device_error(["cuda:0", "cpu"])
            a = a.item()
        out.append(a)
    return out


# ---------------------------------------------------------------------------------------------------------------
# elementwise
# ---------------------------------------------------------------------------------------------------------------

def broadcast_view(a, shape):
    """a viewed with `shape` (numpy's broadcasting: stride 0 along the dims it repeats)."""
    if tuple(a.shape) == tuple(shape):
        return a
    base = memory.stand_in(a)
    return memory.strided_view(a, *memory.layout_of(np.broadcast_to(base, shape), base))


def _kernel_view(a, rank: int):
    """Rank-0 arrays run as rank 1 (one element)."""
    return memory.strided_view(a, (1,), (0,)) if rank == 0 else a


def elementwise(op, arrays, attrs, compute, out_dtype, out=None):
    """op's template over operands broadcast together (scalars become kernel arguments), into a new array or out."""
    shapes = [tuple(a.shape) for a in arrays if not _is_scalar(a)]
    shape = ops.broadcast_shapes(*shapes)
    if out is None:
        out = memory.empty(shape, out_dtype)
    elif tuple(out.shape) != shape:
        shape = tuple(out.shape)
    n = math.prod(shape)
    if n == 0:
        return out
    rank = len(shape)
    dtypes, args = [], []
    for k, a in enumerate(arrays):
        if _is_scalar(a):
            is_cast = op.cast_inputs is None or k in op.cast_inputs
            target = (compute if compute is not None else out_dtype) if is_cast else None
            dtypes.append(None)
            args.append(_typed_scalar(a, target))
        else:
            dtypes.append(np.dtype(a.dtype))
            args.append(_kernel_view(broadcast_view(a, shape), rank))
    if op.name == "clamp":
        work = compute if compute is not None else out_dtype
        args += [_typed_scalar(attrs["min"] if attrs["min"] is not None else 0, work),
                 _typed_scalar(attrs["max"] if attrs["max"] is not None else 0, work)]
    kernel = kernels.elementwise(op, tuple(dtypes), None if compute is None else np.dtype(compute),
                                 np.dtype(out_dtype), max(rank, 1), attrs)
    blocks, threads = kernels.launch_1d(n)
    kernel[blocks, threads](_kernel_view(out, rank), *args, n)
    return out


def _typed_scalar(value, dtype):
    if value is None:
        return False
    if dtype is None:
        return value
    return np.dtype(dtype).type(value)


def copy_into(dst, src) -> None:
    """dst[...] = src (a device array broadcast to dst's shape, or a scalar), cast to dst's dtype. A source that
    overlaps dst other than element for element is copied first (as numpy's copyto buffers it)."""
    op = ops.OPS["clone"] if _is_scalar(src) or np.dtype(src.dtype) == np.dtype(dst.dtype) else ops.OPS["cast"]
    if not _is_scalar(src):
        if memory.reads_elsewhere(dst, src):
            src = contiguous(src)
        src = broadcast_view(src, tuple(dst.shape))
    elif src is not None:
        src = np.dtype(dst.dtype).type(src)
    attrs = {"dtype": _runtime_dtype(dst.dtype)} if op.name == "cast" else {}
    elementwise(op, [src], attrs, None, np.dtype(dst.dtype), out=dst)


def _runtime_dtype(np_dtype):
    from .. import dtypes as dt

    return dt.from_numpy_dtype(np.dtype(np_dtype))


def contiguous(a):
    """A C-contiguous copy of a device array."""
    out = memory.empty(tuple(a.shape), a.dtype)
    copy_into(out, a)
    return out


def clone(a):
    return contiguous(a)


def full(shape, value, dtype):
    out = memory.empty(tuple(shape), dtype)
    copy_into(out, value)
    return out


def _check_divisor(divisor) -> None:
    """Integer division by zero raises, as on the CPU (torch's ZeroDivisionError): one bool read back."""
    if _is_scalar(divisor):
        if divisor == 0:
            raise RuntimeError("ZeroDivisionError")
        return
    zero = elementwise(ops.OPS["eq"], [divisor, 0], {}, np.dtype(divisor.dtype), np.dtype(np.bool_))
    if memory.to_host(reduce(ops.OPS["any"], zero, {"dims": tuple(range(zero.ndim)), "keepdim": False},
                             np.dtype(np.bool_))).item():
        raise RuntimeError("ZeroDivisionError")


# ---------------------------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------------------------

def _rows(a, dims):
    """a as a (rows, cols) array whose columns are the reduced dims (a view when the layout allows, else a copy),
    and the kept dims' sizes."""
    keep = [d for d in range(a.ndim) if d not in dims]
    moved = permute_view(a, tuple(keep) + tuple(dims))
    rows = math.prod(a.shape[d] for d in keep)
    cols = math.prod(a.shape[d] for d in dims)
    return reshape_view(moved, (rows, cols)), tuple(a.shape[d] for d in keep)


def reduce(op, a, attrs, out_dtype):
    if op.reducer is None:
        return arg_reduce(op, a, attrs)
    dims, keepdim = tuple(attrs["dims"]), attrs.get("keepdim", False)
    out_shape = ops.reduced_shape(tuple(a.shape), dims, keepdim) if a.ndim else ()
    if a.ndim == 0:
        a, dims = reshape_view(a, (1,)), (0,)
    rows2d, _ = _rows(a, dims)
    acc = op.reducer.accumulator(np.dtype(a.dtype), np.dtype(out_dtype))
    out = memory.empty((rows2d.shape[0],), out_dtype)
    if rows2d.shape[0]:
        kernel, threads = kernels.reduction(op, a.dtype, acc, out_dtype)
        kernel[min(rows2d.shape[0], kernels.MAX_BLOCKS), threads](out, rows2d)
    return memory.reshaped(out, out_shape)


def arg_reduce(op, a, attrs):
    dim, keepdim = attrs["dim"], attrs.get("keepdim", False)
    shape = tuple(a.shape)
    if dim is None:
        flat = reshape_view(a, (1, a.size))
        out_shape = (1,) * a.ndim if keepdim else ()
    else:
        flat, _ = _rows(a, (dim,))
        out_shape = ops.reduced_shape(shape, (dim,), keepdim)
    if flat.shape[1] == 0:
        raise ValueError(f"{op.name}: attempt to get {op.name} of an empty sequence")
    out = memory.empty((flat.shape[0],), np.int64)
    if flat.shape[0]:
        kernel, threads = kernels.arg_reduction(op, a.dtype)
        scratch = memory.empty((flat.shape[0], threads), a.dtype)
        kernel[min(flat.shape[0], kernels.MAX_BLOCKS), threads](out, flat, scratch)
    return memory.reshaped(out, out_shape)


# ---------------------------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------------------------

def _as_batched(a, batch: tuple):
    """a (..., M, K) broadcast to batch + (M, K) and viewed as (B, M, K) (copied when no view gives that)."""
    a = broadcast_view(a, batch + tuple(a.shape[-2:]))
    return reshape_view(a, (math.prod(batch),) + tuple(a.shape[-2:]))


_MAX_GRID_YZ = 65535  # CUDA's limit on a grid's y and z dimensions


def matmul(a, b, out_dtype):
    out_dtype = np.dtype(out_dtype)
    if out_dtype.kind == "b":
        raise NoLowering("op 'matmul' has no CUDA lowering for bool tensors")
    batch = ops.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    m, n = tuple(a.shape)[-2], tuple(b.shape)[-1]
    out = memory.empty((math.prod(batch), m, n), out_dtype)
    if out.size:
        acc = np.dtype(np.int64) if out_dtype.kind in "iu" else out_dtype
        kernel, tile = kernels.matmul(acc, out_dtype)
        grid = (-(-n // tile), -(-m // tile), math.prod(batch))
        if grid[1] > _MAX_GRID_YZ or grid[2] > _MAX_GRID_YZ:
            raise NoLowering(f"op 'matmul' has no CUDA lowering for {m} rows in {math.prod(batch)} batches: the "
                             f"tiled kernel's grid allows {_MAX_GRID_YZ * tile} rows and {_MAX_GRID_YZ} batches")
        kernel[grid, (tile, tile)](out, _as_batched(a, batch), _as_batched(b, batch))
    return memory.reshaped(out, batch + (m, n))


def linear(x, w, out_dtype):
    """x @ w.T with w stored (out, in): x's leading dims flattened into one matrix."""
    rows = reshape_view(x, (1, math.prod(x.shape[:-1]), tuple(x.shape)[-1]))
    wt = permute_view(w, (1, 0))
    wt = memory.strided_view(wt, (1,) + tuple(wt.shape), (0,) + tuple(wt.strides))
    out = matmul(rows, wt, out_dtype)
    return memory.reshaped(out, tuple(x.shape[:-1]) + (w.shape[0],))


# ---------------------------------------------------------------------------------------------------------------
# views
# ---------------------------------------------------------------------------------------------------------------

def reshape_view(a, shape):
    """a with another shape: a view when the layout allows (as numpy's reshape), else a contiguous copy's view."""
    shape = tuple(shape)
    if tuple(a.shape) == shape:
        return a
    base = memory.stand_in(a)
    try:
        view = np.reshape(base, shape, copy=False)
    except ValueError:
        return memory.reshaped(contiguous(a), shape)
    return memory.strided_view(a, *memory.layout_of(view, base))


def permute_view(a, dims):
    base = memory.stand_in(a)
    return memory.strided_view(a, *memory.layout_of(base.transpose(dims), base))


def _reshape(op, arrays, attrs):
    a = arrays[0]
    out = reshape_view(a, attrs["shape"])
    return out, _shares(out, a)


def _shares(out, a) -> bool:
    """Whether reshape_view gave a view of a (not a copy)."""
    base = memory.stand_in(a)
    try:
        np.reshape(base, tuple(out.shape), copy=False)
    except ValueError:
        return False
    return True


def _permute(op, arrays, attrs):
    return permute_view(arrays[0], tuple(attrs["dims"])), True


def _expand(op, arrays, attrs):
    return broadcast_view(arrays[0], tuple(attrs["shape"])), True


def basic_view(a, key):
    """a[key] for a key of ints, slices, None and ... (runtime.ops' encoded form): always a view."""
    if any(item[0] == "tensor" for item in key):
        raise NoLowering("op 'getitem' has no CUDA lowering for tensor (advanced) indices; only ints, slices, "
                         "None and ... index CUDA tensors")
    base = memory.stand_in(a)
    index = ops.decode_key(key, [])
    if Ellipsis not in index:
        index += (Ellipsis,)  # `...` keeps integer keys a 0-d view, never a read
    view = base[index]
    return memory.strided_view(a, *memory.layout_of(view, base))


def _getitem(op, arrays, attrs):
    if len(arrays) > 1:
        return take(arrays[0], arrays[1:], attrs["key"]), False
    return basic_view(arrays[0], attrs["key"]), True


_ADVANCED = ("op '{}' has no CUDA lowering for this tensor (advanced) index: CUDA tensors take ints, slices, None "
             "and ..., or one integer tensor indexing one dim with every other dim whole (x[idx], x[:, idx])")


def _indexed_dim(op_name, x, indices, key) -> int:
    """The dim that a key of one integer index tensor, every other item a whole slice (or a trailing ...),
    indexes; NoLowering for any other advanced key."""
    whole = ("slice", None, None, None)
    tensors = [k for k, item in enumerate(key) if item[0] == "tensor"]
    ok = len(indices) == 1 and len(tensors) == 1 and np.dtype(indices[0].dtype).kind in "iu" \
        and all(item == whole or (item[0] == "ellipsis" and k > tensors[0]) for k, item in enumerate(key)
                if k != tensors[0])
    if not ok:
        raise NoLowering(_ADVANCED.format(op_name))
    return tensors[0]


def _check_take_range(index, size: int, dim: int) -> None:
    if not index.size:
        return
    dims = {"dims": tuple(range(index.ndim)), "keepdim": False}
    low = memory.to_host(reduce(ops.OPS["amin"], index, dims, np.dtype(index.dtype))).item()
    high = memory.to_host(reduce(ops.OPS["amax"], index, dims, np.dtype(index.dtype))).item()
    if low < -size or high >= size:
        raise IndexError(f"index {high if high >= size else low} is out of bounds for dimension {dim} with size "
                         f"{size}")


def _three_d(a, dim: int):
    """a viewed as (dims before dim, dim, dims after)."""
    shape = tuple(a.shape)
    return reshape_view(a, (math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])))


def take(x, indices, key):
    """x[..., idx, ...] for one integer index tensor on one dim: the index's shape replaces that dim."""
    dim = _indexed_dim("getitem", x, indices, key)
    index = indices[0]
    shape = tuple(x.shape)
    _check_take_range(index, shape[dim], dim)
    flat = reshape_view(index, (index.size,))
    out = memory.empty((math.prod(shape[:dim]), index.size, math.prod(shape[dim + 1:])), x.dtype)
    if out.size:
        kernel = kernels.take("take", x.dtype, index.dtype)
        blocks, threads = kernels.launch_1d(out.size)
        kernel[blocks, threads](out, _three_d(x, dim), flat, shape[dim], out.size)
    return memory.reshaped(out, shape[:dim] + tuple(index.shape) + shape[dim + 1:])


def put(out, values, indices, key, accumulate: bool) -> None:
    """out[..., idx, ...] = values (accumulate: +=, repeated indices adding up), in place."""
    dim = _indexed_dim("index_put", out, indices, key)
    index = indices[0]
    shape = tuple(out.shape)
    _check_take_range(index, shape[dim], dim)
    region = shape[:dim] + tuple(index.shape) + shape[dim + 1:]
    if _is_scalar(values):
        values = full(region, values, out.dtype)
    elif np.dtype(values.dtype) != np.dtype(out.dtype):
        values = contiguous_cast(values, out.dtype)
    values = broadcast_view(values, region)
    n = math.prod(region)
    if n:
        flat = reshape_view(index, (index.size,))
        target = _three_d(out, dim)
        v = reshape_view(values, (math.prod(shape[:dim]), index.size, math.prod(shape[dim + 1:])))
        kernel = kernels.take("put_add" if accumulate else "put", out.dtype, index.dtype)
        blocks, threads = kernels.launch_1d(n)
        kernel[blocks, threads](target, v, flat, shape[dim], n)


_VIEWS = {"reshape": _reshape, "permute": _permute, "expand": _expand, "getitem": _getitem}


def view_of(op_name: str, a, attrs: dict):
    """A reshape, permute or expand of a device array, as the op runs eagerly (a view where the layout allows)."""
    return _VIEWS[op_name](ops.OPS[op_name], [a], attrs)[0]


def cat(arrays, dim, out_dtype):
    shape = list(arrays[0].shape)
    shape[dim] = sum(a.shape[dim] for a in arrays)
    out = memory.empty(tuple(shape), out_dtype)
    start = 0
    for a in arrays:
        size = a.shape[dim]
        key = tuple(("slice", None, None, None) for _ in range(dim)) + (("slice", start, start + size, None),)
        if a.size:
            copy_into(basic_view(out, key), a)
        start += size
    return out


def index_put(arrays, attrs, out_dtype):
    """A copy of input 0 with values written at a basic key (accumulate adds them: the same as writing when a
    basic key selects each element once)."""
    x, values = arrays[0], arrays[1]
    out = memory.empty(tuple(x.shape), out_dtype)
    copy_into(out, x)
    if len(arrays) > 2:
        put(out, values, arrays[2:], attrs["key"], attrs["accumulate"])
        return out
    region = basic_view(out, attrs["key"])
    if attrs["accumulate"]:
        total = elementwise(ops.OPS["add"], [region, values], {}, np.dtype(out_dtype), np.dtype(out_dtype))
        copy_into(region, total)
    else:
        copy_into(region, values)
    return out


def add_into(dst, src) -> None:
    """dst += src, in place (gradient accumulation)."""
    if memory.reads_elsewhere(dst, src):
        src = contiguous(src)
    d = np.dtype(dst.dtype)
    elementwise(ops.OPS["add"], [dst, src], {}, d, d, out=dst)


def _check_index_range(index, dim: int, size: int) -> None:
    """gather/scatter indices must lie in [0, size), as on the CPU: their min and max, read back."""
    if not index.size:
        return
    dims = {"dims": tuple(range(index.ndim)), "keepdim": False}
    low = memory.to_host(reduce(ops.OPS["amin"], index, dims, np.dtype(np.int64))).item()
    high = memory.to_host(reduce(ops.OPS["amax"], index, dims, np.dtype(np.int64))).item()
    if low < 0 or high >= size:
        raise RuntimeError(f"index {high if high >= size else low} is out of bounds for dimension {dim} with size "
                           f"{size}")


def gather(x, index, dim: int, out_dtype):
    _check_index_range(index, dim, x.shape[dim])
    out = memory.empty(tuple(index.shape), out_dtype)
    n = index.size
    if n:
        rank = max(index.ndim, 1)
        kernel = kernels.gather(rank, dim, out_dtype, scatter=False)
        blocks, threads = kernels.launch_1d(n)
        kernel[blocks, threads](_kernel_view(out, index.ndim), _kernel_view(x, index.ndim),
                                _kernel_view(index, index.ndim), n)
    return out


def scatter_add(x, index, src, dim: int, out_dtype):
    """A copy of x with src's elements added at index along dim (atomic adds: the order of a repeated index's
    additions varies, so float sums may differ from the CPU's in the last bits)."""
    _check_index_range(index, dim, x.shape[dim])
    out = memory.empty(tuple(x.shape), out_dtype)
    copy_into(out, x)
    n = index.size
    if n:
        if np.dtype(src.dtype) != np.dtype(out_dtype):
            src = contiguous_cast(src, out_dtype)
        rank = max(index.ndim, 1)
        kernel = kernels.gather(rank, dim, out_dtype, scatter=True)
        blocks, threads = kernels.launch_1d(n)
        kernel[blocks, threads](_kernel_view(out, index.ndim), _kernel_view(src, index.ndim),
                                _kernel_view(index, index.ndim), n)
    return out


def contiguous_cast(a, dtype):
    out = memory.empty(tuple(a.shape), dtype)
    copy_into(out, a)
    return out


def window(name: str, arrays, attrs, out_dtype):
    """im2col, col2im, max_pool, max_pool_backward and max_pool_pick: one thread per output element (an atomic add
    per window for max_pool_backward, whose windows may overlap)."""
    window_attrs = {k: attrs[k] for k in ("kernel", "stride", "padding", "dilation")}
    spatial = len(attrs["kernel"])
    source = arrays[0]
    size = tuple(attrs["size"]) if name == "col2im" else tuple(arrays[-1].shape)[2:]
    out_sizes = ops.window_output_sizes(size, attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"])
    n_out, ksize = math.prod(out_sizes), math.prod(attrs["kernel"])
    if name == "im2col":
        n, c = tuple(source.shape)[:2]
        out = memory.empty((c * ksize, n * n_out), out_dtype)
        args = (out, source, out_sizes, n_out)
    elif name == "col2im":
        out = memory.empty((source.shape[1] // n_out, source.shape[0] // ksize) + size, out_dtype)
        args = (out, source, out_sizes, n_out)
    elif name == "max_pool":
        out = memory.empty(tuple(source.shape)[:2] + out_sizes, out_dtype)
        args = (out, source, out_sizes)
    elif name == "max_pool_pick":
        picked, x = arrays
        out = memory.empty(tuple(x.shape)[:2] + out_sizes, out_dtype)
        if np.dtype(picked.dtype) != np.dtype(out_dtype):
            picked = contiguous_cast(picked, out_dtype)
        args = (out, picked, x, out_sizes)
    else:
        g, x = arrays
        out = full(tuple(x.shape), 0, out_dtype)
        if np.dtype(g.dtype) != np.dtype(out_dtype):
            g = contiguous_cast(g, out_dtype)
        args = (out, g, x, out_sizes)
    count = math.prod(arrays[0].shape) if name == "max_pool_backward" else out.size
    if count:
        kernel = kernels.window(name, spatial, window_attrs, out_dtype)
        blocks, threads = kernels.launch_1d(count)
        kernel[blocks, threads](*args, count)
    return out


_SCANS = {"cumsum": "({0} + {1})", "cumprod": "({0} * {1})"}


def scan(name: str, a, dim: int, out_dtype):
    """cumsum/cumprod along dim: the dim moved last and each row scanned in order by one thread."""
    if a.ndim == 0:
        a = reshape_view(a, (1,))
    rows2d, kept = _rows(a, (dim,))
    out = memory.empty(tuple(rows2d.shape), out_dtype)
    if out.size:
        kernel = kernels.scan(name, _SCANS[name], a.dtype, out_dtype)
        blocks, threads = kernels.launch_1d(rows2d.shape[0])
        kernel[blocks, threads](out, rows2d)
    order = [d for d in range(a.ndim) if d != dim] + [dim]
    moved = memory.reshaped(out, kept + (a.shape[dim],))
    result = permute_view(moved, tuple(int(i) for i in np.argsort(order)))
    return reshape_view(result, tuple(a.shape)) if a.ndim else reshape_view(contiguous(result), ())
