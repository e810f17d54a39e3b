"""Tensor factories: tensor, as_tensor, from_numpy, zeros, ones, full, arange, rand, ... and *_like."""
from __future__ import annotations

import functools
import warnings

import numpy as np

from . import dtypes as dt
from . import memory_formats as mf
from ._aligned import aligned_empty
from .api import size_args
from .device import CPU, check_device
from .random import rng
from .tensor import Tensor, _dense


def _finish(array: np.ndarray, requires_grad: bool, device=CPU) -> Tensor:
    """A tensor of a host array's values on `device` (a checked runtime.device)."""
    if device is not CPU:
        from .cuda import memory

        array = memory.to_device(array)
    t = Tensor._from_array(array)
    return t.requires_grad_(True) if requires_grad else t


def _random(generator, device) -> np.random.Generator:
    """The numpy generator random values come from: CUDA tensors draw from runtime.cuda's generator (on the host,
    then copied to the device), unless one is given."""
    if generator is None and device is not CPU:
        from . import cuda

        return cuda.default_generator.numpy
    return rng(generator)


def _plain(data, found: list):
    """Nested Python data with tensors replaced by their values (a one-element tensor by its scalar, as torch takes
    it); the dtypes of the tensors and numpy values met are appended to `found`."""
    if isinstance(data, Tensor):
        found.append(data.dtype)
        values = data._host()
        return values.reshape(()) if values.size == 1 else values
    if isinstance(data, (np.ndarray, np.generic)):
        found.append(dt.from_numpy_dtype(data.dtype))
        return data
    if isinstance(data, (list, tuple)):
        return [_plain(x, found) for x in data]
    return data


def _python_scalar_dtypes(data, out: set) -> set:
    """The dtypes the Python numbers in nested data take (bool, int64, the default float and complex dtypes)."""
    if isinstance(data, (list, tuple)):
        for x in data:
            _python_scalar_dtypes(x, out)
    elif isinstance(data, (bool, int, float, complex)):
        out.add(_infer_dtype(data, np.asarray(data)))
    return out


def _infer_dtype(data, array: np.ndarray, found: list = ()) -> dt.dtype:
    """numpy arrays keep their dtype; Python floats take the default dtype, ints int64, bools bool. In a list
    holding tensors or numpy values, their dtypes and those of the Python numbers beside them promote together
    (torch.tensor([x.sum(), 1.0]) of a float64 x is float64)."""
    if found:
        return functools.reduce(dt.promote_types, [*found, *_python_scalar_dtypes(data, set())])
    if isinstance(data, (np.ndarray, np.generic, Tensor)):
        return dt.from_numpy_dtype(array.dtype)
    kind = array.dtype.kind
    if kind == "b":
        return dt.bool_
    if kind in "iu":
        return dt.int64
    if kind == "f":
        return dt.get_default_dtype()
    if kind == "c":  # Python complex numbers: the complex dtype of the default float dtype, as in torch
        return dt.get_default_dtype().to_complex()
    raise TypeError(f"can't convert data of type {type(data).__name__} (numpy dtype {array.dtype}) to a tensor")


def _array_from(data, dtype, copy: bool) -> np.ndarray:
    source = data._host() if isinstance(data, Tensor) else data
    found: list = []
    try:
        if isinstance(source, np.ndarray):
            array = source
        else:
            array = np.array(_plain(source, found)) if copy else np.asarray(_plain(source, found))
    except ValueError as e:
        raise ValueError(f"can't build a tensor from ragged or mixed data: {e}") from None
    if isinstance(source, np.generic):
        found.clear()  # a numpy scalar on its own keeps its dtype (below)
    target = dt.as_dtype(dtype) if dtype is not None else _infer_dtype(data, array, found)
    if copy and array is source:
        return _copy(array, target.np)
    return dt.astype(array, target.np, copy=False)


def _copy(array: np.ndarray, np_dtype) -> np.ndarray:
    """A copy of `array` as `np_dtype` in the same memory layout (as torch.tensor keeps it), on a cache line when
    it is C-contiguous."""
    if not array.flags.c_contiguous or np_dtype == dt.bfloat16.np:
        return dt.astype(array, np_dtype, copy=True)
    out = aligned_empty(array.shape, np_dtype)
    np.copyto(out, array, casting="unsafe")
    return out


def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, numbers, numpy arrays or tensors)."""
    device = check_device(device)
    return _finish(_array_from(data, dtype, copy=True), requires_grad, device)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """Like tensor(), but shares memory with a numpy array or tensor when no conversion is needed."""
    device = check_device(device) if device is not None else None
    if isinstance(data, Tensor) and (dtype is None or dt.as_dtype(dtype) is data.dtype) and \
            (device is None or device == data.device):
        return data
    if isinstance(data, Tensor) and device is None:
        device = data.device
    return _finish(_array_from(data, dtype, copy=False), False, device or CPU)


def asarray(obj, *, dtype=None, device=None, copy=None, requires_grad=False) -> Tensor:
    """obj as a tensor, sharing its memory where it can (copy=None), always copied (copy=True), or never (copy=False:
    a conversion that needs a copy raises)."""
    out = tensor(obj, dtype=dtype, device=device) if copy else as_tensor(obj, dtype=dtype, device=device)
    if copy is False and not _shares_memory(obj, out):
        raise ValueError(f"asarray(copy=False): {type(obj).__name__} cannot become a tensor of dtype {out.dtype} "
                         f"without a copy")
    return out.requires_grad_(True) if requires_grad else out


def _shares_memory(obj, out: Tensor) -> bool:
    source = obj._data if isinstance(obj, Tensor) else obj
    return isinstance(source, np.ndarray) and isinstance(out._data, np.ndarray) and \
        np.shares_memory(source, out._data)


def frombuffer(buffer, *, dtype, count: int = -1, offset: int = 0, requires_grad: bool = False) -> Tensor:
    """A 1-D tensor over an object's buffer (bytes, bytearray, memoryview, array.array), sharing its memory; count
    elements (-1: all after offset bytes). A read-only buffer gives a tensor not to be written, as torch warns."""
    target = dt.as_dtype(dtype)
    view = memoryview(buffer)
    if len(view) == 0 or view.nbytes <= offset:
        raise ValueError(f"both buffer length ({view.nbytes}) and offset ({offset}) must be positive and offset "
                         f"smaller than the buffer length")
    if view.readonly:
        warnings.warn("The given buffer is not writable: writing to the tensor made from it is undefined behavior, "
                      "as in torch", UserWarning, stacklevel=2)
    out = Tensor._from_array(np.frombuffer(buffer, dtype=target.np, count=count, offset=offset))
    return out.requires_grad_(True) if requires_grad else out


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with a numpy array."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(array).__name__})")
    dt.from_numpy_dtype(array.dtype)
    return Tensor._from_array(array)


def _new_shape(size) -> tuple:
    """Sizes for a new tensor, with torch's error for a negative one."""
    shape = size_args(size)
    if any(s < 0 for s in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(shape)}: {list(shape)}")
    return shape


def _dtype_or_default(dtype) -> np.dtype:
    return (dt.as_dtype(dtype) if dtype is not None else dt.get_default_dtype()).np


def _no_extra(kw, name):
    kw.pop("layout", None)
    kw.pop("pin_memory", None)
    if "out" in kw and kw["out"] is None:
        del kw["out"]
    if kw:
        raise TypeError(f"{name}() got an unexpected keyword argument '{next(iter(kw))}'")


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    device = check_device(device)
    if dtype is None:
        dtype = dt.default_for_category(dt.scalar_category(fill_value))
    return _filled(_new_shape((size,)), fill_value, dt.as_dtype(dtype).np, requires_grad, device)


def _filled(shape, value, np_dtype, requires_grad, device) -> Tensor:
    """A tensor of one value: numpy's full on the CPU, a fill kernel on CUDA."""
    if device is CPU:
        array = aligned_empty(shape, np_dtype)
        array.fill(np.float32(value) if np_dtype == dt.bfloat16.np else value)
        return _finish(array, requires_grad)
    from .cuda import dispatch

    t = Tensor._from_array(dispatch.full(shape, value, np_dtype))
    return t.requires_grad_(True) if requires_grad else t


def _sizes(size, keyword, name):
    """The sizes given positionally or as size= (torch accepts either, not both)."""
    if keyword is None:
        return size
    if size:
        raise TypeError(f"{name}() got multiple values for argument 'size'")
    return (keyword,)


def zeros(*size, dtype=None, device=None, requires_grad=False, **kw) -> Tensor:
    size = _sizes(size, kw.pop("size", None), "zeros")
    _no_extra(kw, "zeros")
    return _filled(_new_shape(size), 0, _dtype_or_default(dtype), requires_grad, check_device(device))


def ones(*size, dtype=None, device=None, requires_grad=False, **kw) -> Tensor:
    size = _sizes(size, kw.pop("size", None), "ones")
    _no_extra(kw, "ones")
    return _filled(_new_shape(size), 1, _dtype_or_default(dtype), requires_grad, check_device(device))


def empty(*size, dtype=None, device=None, requires_grad=False, memory_format=None, **kw) -> Tensor:
    """Zeros (runtime never hands out uninitialized memory), laid out in memory_format."""
    fmt = mf.checked(memory_format, "empty", mf.contiguous_format)
    if fmt is mf.preserve_format:
        raise RuntimeError("unsupported memory format Preserve")
    size = _sizes(size, kw.pop("size", None), "empty")
    _no_extra(kw, "empty")
    out = zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)
    return out if fmt is mf.contiguous_format else _laid_out(out, fmt)


def _laid_out(t, fmt):
    """A new tensor t with its data in an explicit memory format (on the CPU; a CUDA tensor stays C-contiguous)."""
    mf.check_rank(fmt, t.ndim)
    return _restrided(t, mf.strides_for(fmt, tuple(t.shape)))


def _restrided(t, strides):
    """A new CPU tensor t with its data moved to an array of these element strides; others as they are."""
    if isinstance(t, Tensor) and isinstance(t._data, np.ndarray) and t.stride() != strides:
        data = mf.strided_empty(t._data.shape, strides, t._data.dtype)
        data[...] = t._data
        t._data = data
    return t


def _laid_out_like(t, input, fmt):
    """A new tensor t laid out as `input` asks for it: preserve_format keeps the strides of a dense input, or the
    order of its dims in memory (as torch's empty_like); another format is explicit."""
    if fmt is not mf.preserve_format:
        return _laid_out(t, fmt)
    if not isinstance(input, Tensor):  # a tracer's proxy: graph values have no layout
        return t
    if _dense(input._data) if isinstance(input._data, np.ndarray) else input.is_contiguous():
        return _restrided(t, input.stride())
    return _restrided(t, mf.dense_strides_like(tuple(input.shape), input.stride()))


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    device = check_device(device)
    if end is None:
        start, end = 0, start
    values = (start, end, step)
    if dtype is None:
        is_int = all(isinstance(v, int) or (isinstance(v, Tensor) and not v.is_floating_point()) for v in values)
        dtype = dt.int64 if is_int else dt.get_default_dtype()
    start, end, step = (float(v) if isinstance(v, Tensor) else v for v in values)
    if step == 0:
        raise RuntimeError("arange: step must be nonzero")
    count = max(int(np.ceil((end - start) / step)), 0)
    array = (start + np.arange(count, dtype=np.float64) * step) if dt.as_dtype(dtype).is_floating_point \
        else np.arange(start, end, step, dtype=np.int64)
    return _finish(array.astype(dt.as_dtype(dtype).np), requires_grad, device)


def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    device = check_device(device)
    if steps < 0:
        raise RuntimeError(f"linspace(): number of steps must be non-negative, got {steps}")
    return _finish(_linspace_values(start, end, steps, _dtype_or_default(dtype)), requires_grad, device)


def _linspace_values(start, end, steps: int, np_dtype) -> np.ndarray:
    """torch's float32 and float64 linspace: step = (end - start) / (steps - 1) in the dtype, the first half counted
    up from start and the rest down from end (so both ends are exact), each point one fused multiply-add, emulated
    at a wider precision (float64 for float32, long double for float64: rarely off by one unit there)."""
    np_dtype = np.dtype(np_dtype)
    if np_dtype not in (np.float32, np.float64) or steps < 2:  # (torch's reduced-float and integer rules differ)
        return dt.astype(np.linspace(float(start), float(end), steps), np_dtype)
    work = np_dtype.type
    wide = np.longdouble if work is np.float64 else np.float64
    first, last = work(start), work(end)
    step = (last - first) / work(steps - 1)
    index = np.arange(steps)
    up = wide(first) + wide(step) * index.astype(wide)
    down = wide(last) - wide(step) * (steps - 1 - index).astype(wide)
    return dt.astype(np.where(index < steps // 2, up, down).astype(work), np_dtype)


def eye(n, m=None, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    device = check_device(device)
    _new_shape((n, n if m is None else m))
    return _finish(np.eye(n, m, dtype=_dtype_or_default(dtype)), requires_grad, device)


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False, **kw) -> Tensor:
    size = _sizes(size, kw.pop("size", None), "rand")
    _no_extra(kw, "rand")
    device = check_device(device)
    target = _dtype_or_default(dtype)
    if target.kind == "c":  # uniform real and imaginary parts, as torch draws them
        return _finish(_complex_draws(_random(generator, device).random, _new_shape(size), target, 1.0),
                       requires_grad, device)
    draw_dtype = target if target in (np.float32, np.float64) else np.float64
    values = _random(generator, device).random(dtype=draw_dtype, out=aligned_empty(_new_shape(size), draw_dtype))
    return _finish(values.astype(target, copy=False), requires_grad, device)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False, **kw) -> Tensor:
    size = _sizes(size, kw.pop("size", None), "randn")
    _no_extra(kw, "randn")
    device = check_device(device)
    target = _dtype_or_default(dtype)
    if target.kind == "c":  # parts of variance 1/2, so that E|z|^2 = 1, as torch draws them
        return _finish(_complex_draws(_random(generator, device).standard_normal, _new_shape(size), target,
                                      np.sqrt(0.5)), requires_grad, device)
    draw_dtype = target if target in (np.float32, np.float64) else np.float64
    values = _random(generator, device).standard_normal(dtype=draw_dtype,
                                                        out=aligned_empty(_new_shape(size), draw_dtype))
    return _finish(values.astype(target, copy=False), requires_grad, device)


def _complex_draws(draw, shape: tuple, target: np.dtype, scale: float) -> np.ndarray:
    """Complex values whose real and imaginary parts are consecutive draws of `draw` (scaled by `scale`)."""
    part = np.float32 if target == np.complex64 else np.float64
    parts = draw(dtype=part, out=aligned_empty(shape + (2,), part))
    if scale != 1.0:
        parts *= part(scale)
    return parts.view(target)[..., 0]


def randint(*args, size=None, generator=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    """randint(high, size) or randint(low, high, size)."""
    device = check_device(device)
    if size is None:
        *bounds, size = args
    else:
        bounds = list(args)
    low, high = (0, bounds[0]) if len(bounds) == 1 else bounds
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    values = _random(generator, device).integers(low, high, _new_shape((size,)), dtype=np.int64)
    return _finish(values.astype((dt.as_dtype(dtype) if dtype is not None else dt.int64).np), requires_grad, device)


def randperm(n, *, generator=None, dtype=None, device=None) -> Tensor:
    device = check_device(device)
    values = _random(generator, device).permutation(n).astype((dtype and dt.as_dtype(dtype) or dt.int64).np)
    return _finish(values, False, device)


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False, memory_format=None) -> Tensor:
    out = full(tuple(input.shape), fill_value, dtype=dtype if dtype is not None else input.dtype,
               requires_grad=requires_grad, device=device if device is not None else _device_of(input))
    return _laid_out_like(out, input, mf.checked(memory_format, "full_like"))


def _shape_like(factory, name: str):
    def like(input, *, dtype=None, device=None, requires_grad=False, memory_format=None, **kwargs):
        out = factory(tuple(input.shape), dtype=dtype if dtype is not None else input.dtype,
                      requires_grad=requires_grad, device=device if device is not None else _device_of(input),
                      **kwargs)
        return _laid_out_like(out, input, mf.checked(memory_format, name))

    like.__name__ = like.__qualname__ = name
    return like


zeros_like = _shape_like(zeros, "zeros_like")
ones_like = _shape_like(ones, "ones_like")
empty_like = _shape_like(empty, "empty_like")
rand_like = _shape_like(rand, "rand_like")
randn_like = _shape_like(randn, "randn_like")


def randint_like(input, *bounds, dtype=None, device=None, requires_grad=False, memory_format=None) -> Tensor:
    out = randint(*bounds, tuple(input.shape), dtype=dtype if dtype is not None else input.dtype,
                  requires_grad=requires_grad, device=device if device is not None else _device_of(input))
    return _laid_out_like(out, input, mf.checked(memory_format, "randint_like"))


def _device_of(input):
    """A tensor's device; None for a tracer's proxy (its *_like tensors are made where the graph runs)."""
    return input.device if isinstance(input, Tensor) else None
