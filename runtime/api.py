"""The public tensor functions (runtime.* and Tensor.*): argument handling plus compositions of
primitives. Written against any tensor-like (shape, ndim, dtype, methods, `ops.apply`), so that a graph
proxy can reuse them; composite ops live here and need no derivative or kernel of their own.
"""
from __future__ import annotations

import builtins
import functools
import math
import warnings
from typing import NamedTuple

import numpy as np

from . import dtypes as dt
from . import ops as _ops
from .ops import apply, is_tensor_like
from .random import rng

inf = math.inf


# ---------------------------------------------------------------------------------------------
# Argument normalisation
# ---------------------------------------------------------------------------------------------

def wrap_dim(dim: int, ndim: int) -> int:
    """A non-negative dim, with torch's error for one out of range."""
    dim = dim.__index__()
    n = builtins.max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim + n if dim < 0 else dim


def wrap_dims(dim, ndim: int) -> tuple:
    """None or () -> every dim; an int or a sequence -> sorted unique non-negative dims."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(ndim))
    if isinstance(dim, (tuple, list)):
        dims = tuple(wrap_dim(d, ndim) for d in dim)
        if len(set(dims)) != len(dims):
            raise RuntimeError(f"dim {list(dims)} appears multiple times in the list of dims")
        return tuple(sorted(dims))
    return (wrap_dim(dim, ndim),) if ndim else ()


def size_args(sizes) -> tuple:
    """Accept f(2, 3), f((2, 3)) and f([2, 3]) and return a tuple of ints."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = sizes[0]
    if builtins.all(type(s) is int for s in sizes):
        return tuple(sizes)
    try:
        return tuple(s.__index__() for s in sizes)
    except AttributeError:
        raise TypeError(f"sizes must be integers, got {sizes!r}") from None


def _resolve_shape(shape: tuple, numel: int) -> tuple:
    """Fill in a single -1 from the element count; a clear error for a shape of another size."""
    if -1 in shape:
        if shape.count(-1) > 1:
            raise RuntimeError("only one dimension can be inferred")
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    if math.prod(shape) != numel or builtins.min(shape, default=0) < 0:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
    return shape


def _is_eager(t) -> bool:
    """An eager tensor, as opposed to a tracer's proxy (which has no memory to alias or own)."""
    return isinstance(t, _ops._default_handler)


def _own(t, copy=False):
    """t as a tensor of its own where torch returns a new tensor but the composition here ends in a view: of a
    temporary no one else reads (forgotten: no base, its own version counter) or, with copy, maybe of the input
    (copied). Graph proxies pass through."""
    return t._own(copy) if _is_eager(t) else t


def _alias(t):
    """A view of all of t, as torch's view ops return even when they change nothing (squeeze of no size-1 dim,
    expand to the same size, t() of a vector). Graph proxies get t itself: a graph needs no no-op node."""
    return apply("reshape", t, shape=tuple(t.shape)) if _is_eager(t) else t


def _numel(x) -> int:
    return math.prod(x.shape)


# ---------------------------------------------------------------------------------------------
# Elementwise
# ---------------------------------------------------------------------------------------------

def add(input, other, *, alpha=1):
    return apply("add", input, other if alpha == 1 else other * alpha)


def sub(input, other, *, alpha=1):
    return apply("sub", input, other if alpha == 1 else other * alpha)


def mul(input, other):
    return apply("mul", input, other)


def div(input, other, *, rounding_mode=None):
    if rounding_mode is None:
        return apply("div", input, other)
    if rounding_mode == "floor":
        return apply("floordiv", input, other)
    if rounding_mode == "trunc":
        if result_type(input, other).is_floating_point is False and _any_zero(other):
            raise RuntimeError("ZeroDivisionError")
        q = apply("div", input, other)
        trunc = q.sign() * q.abs().floor()
        return trunc if q.dtype is result_type(input, other) else trunc.to(result_type(input, other))
    raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")


def with_out(fn):
    """`fn` with torch's `out=` keyword: the result is written into `out` (resized, with torch's warning, when its
    shape differs) and `out` is returned. As in torch, not while an argument requires grad and grad is recorded."""

    @functools.wraps(fn)
    def call(*args, out=None, **kwargs):
        if out is None:
            return fn(*args, **kwargs)
        name = fn.__name__
        if not is_tensor_like(out):
            raise TypeError(f"{name}(): argument 'out' must be Tensor, not {type(out).__name__}")
        if _records_grad(args, kwargs, out):
            raise RuntimeError(f"{name}(): functions with out=... arguments don't support automatic "
                               f"differentiation, but one of the arguments requires grad.")
        return _write_out(name, fn(*args, **kwargs), out)

    return call


def _records_grad(args, kwargs, out) -> bool:
    from .autograd import grad_mode

    if not grad_mode.is_grad_enabled():
        return False
    values = [out, *args, *kwargs.values()]
    values += [v for x in list(values) if isinstance(x, (list, tuple)) for v in x]
    return builtins.any(is_tensor_like(v) and getattr(v, "requires_grad", False) for v in values)


def _write_out(name: str, result, out):
    from .autograd import no_grad

    if not is_tensor_like(result):
        raise TypeError(f"{name}(): out= takes one tensor result")
    if result.dtype.category > out.dtype.category:
        raise RuntimeError(f"result type {result.dtype.name} can't be cast to the desired output type "
                           f"{out.dtype.name}")
    if tuple(out.shape) != tuple(result.shape):
        if math.prod(out.shape):
            warnings.warn(f"An output with one or more elements was resized since it had shape {list(out.shape)}, "
                          f"which does not match the required output shape {list(result.shape)}. This behavior is "
                          f"deprecated, and in a future PyTorch release outputs will not be resized unless they "
                          f"have zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, "
                          f"to zero elements with t.resize_(0).", UserWarning, stacklevel=3)
        out._resize_for_out(tuple(result.shape))
    with no_grad():
        out.copy_(result)
    return out


def _any_zero(value) -> bool:
    """Whether a divisor holds a zero (a tensor's values are read: integer division must check them)."""
    if is_tensor_like(value):
        return bool((value == 0).any())
    return value == 0


def result_type(*operands) -> dt.dtype:
    from .ops import result_type as _rt

    return _rt(operands)


def floor_divide(input, other):
    return apply("floordiv", input, other)


def remainder(input, other):
    return apply("remainder", input, other)


def pow(input, exponent):
    return apply("pow", input, exponent)


def maximum(input, other):
    return apply("maximum", input, other)


def minimum(input, other):
    return apply("minimum", input, other)


def _unary(name):
    def fn(input):
        return apply(name, input)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Elementwise {name} (primitive op {name!r})."
    return fn


neg = _unary("neg")
abs = _unary("abs")
sign = _unary("sign")
floor = _unary("floor")
exp = _unary("exp")
log = _unary("log")
log1p = _unary("log1p")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
reciprocal = _unary("reciprocal")
sin = _unary("sin")
cos = _unary("cos")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
relu = _unary("relu")
erf = _unary("erf")
logical_not = _unary("logical_not")
negative = neg
absolute = abs


def bitwise_not(input):
    return apply("logical_not" if input.dtype is dt.bool_ else "bitwise_not", input)


def square(input):
    return pow(input, 2)


def log2(input):
    return log(input) / math.log(2.0)


def log10(input):
    return log(input) / math.log(10.0)


def ceil(input):
    return -floor(-input)


def round(input):
    # NOTE: torch rounds half to even; floor(x + 0.5) would not, so correct the exact ties.
    down = floor(input)
    diff = input - down
    up = down + 1
    half_to_even = where(floor(down / 2) * 2 == down, down, up)
    return where(diff > 0.5, up, where(diff < 0.5, down, half_to_even))


def isnan(input):
    return input != input


def isinf(input):
    return abs(input) == inf


def isfinite(input):
    return abs(input) < inf


def equal(input, other) -> bool:
    """True when both have the same shape and the same values."""
    return tuple(input.shape) == tuple(other.shape) and bool(apply("eq", input, other).all())


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    close = abs(input - other) <= atol + rtol * abs(other)
    close = close | (input == other)  # equal infinities
    return close | (isnan(input) & isnan(other)) if equal_nan else close


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    return bool(isclose(input, other, rtol, atol, equal_nan).all())


def eq(input, other):
    return apply("eq", input, other)


def ne(input, other):
    return apply("ne", input, other)


def lt(input, other):
    return apply("lt", input, other)


def le(input, other):
    return apply("le", input, other)


def gt(input, other):
    return apply("gt", input, other)


def ge(input, other):
    return apply("ge", input, other)


def logical_and(input, other):
    return apply("logical_and", input, other)


def logical_or(input, other):
    return apply("logical_or", input, other)


def logical_xor(input, other):
    return apply("logical_xor", input, other)


def bitwise_and(input, other):
    return apply("bitwise_and", input, other)


def bitwise_or(input, other):
    return apply("bitwise_or", input, other)


def bitwise_xor(input, other):
    return apply("bitwise_xor", input, other)


def where(condition, input=None, other=None):
    if input is None and other is None:
        raise NotImplementedError("where(condition) with one argument (nonzero) is not supported")
    return apply("where", condition, input, other)


def masked_fill(input, mask, value):
    if mask.dtype is not dt.bool_:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype {mask.dtype}")
    out = apply("where", mask, value, input)
    return out if out.dtype is input.dtype else out.to(input.dtype)


def clamp(input, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    if is_tensor_like(min) or is_tensor_like(max):
        out = input if min is None else maximum(input, min)
        return out if max is None else minimum(out, max)
    return apply("clamp", input, min=min, max=max)


clip = clamp


def softmax(input, dim, dtype=None):
    # NOTE: subtract the row max first so exp never overflows; detaching it is exact, since
    # softmax is invariant to the shift and its gradient through the max cancels.
    if dtype is not None:
        input = input.to(dtype)
    shifted = input - input.amax(dim, keepdim=True).detach()
    e = shifted.exp()
    return e / e.sum(dim, keepdim=True)


def log_softmax(input, dim, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    return apply("log_softmax", input, dim=wrap_dim(dim, input.ndim))


def logsumexp(input, dim, keepdim=False):
    # NOTE: stable form m + log(sum(exp(x - m))); an infinite max is replaced by 0 so that rows of
    # all -inf give -inf (not nan) and a +inf gives +inf, as in torch.
    dims = wrap_dims(dim, input.ndim)
    m = input.amax(dims, keepdim=True).detach()
    m = m.masked_fill(isinf(m), 0.0)
    out = (input - m).exp().sum(dims, keepdim=True).log() + m
    return out if keepdim else _own(out.squeeze(dims))


def addcmul(input, tensor1, tensor2, *, value=1):
    return input + tensor1 * tensor2 * value if value != 1 else input + tensor1 * tensor2


def addcdiv(input, tensor1, tensor2, *, value=1):
    return input + tensor1 / tensor2 * value if value != 1 else input + tensor1 / tensor2


def lerp(input, end, weight):
    return input + (end - input) * weight


# ---------------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------------

class ValuesIndices(NamedTuple):
    """What max/min with a dim and topk return (torch.return_types.max, torch.return_types.topk)."""

    values: object
    indices: object


def sum(input, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    return apply("sum", input, dims=wrap_dims(dim, input.ndim), keepdim=keepdim)


def mean(input, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating point "
                           f"or complex dtype. Got: {input.dtype}")
    dims = wrap_dims(dim, input.ndim)
    count = math.prod(input.shape[d] for d in dims)
    return apply("sum", input, dims=dims, keepdim=keepdim) / count


def _var_args(dim, unbiased, correction):
    if isinstance(dim, bool):  # var(x, True): the legacy positional `unbiased`
        dim, unbiased = None, dim
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return dim, correction


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    dim, correction = _var_args(dim, unbiased, correction)
    dims = wrap_dims(dim, input.ndim)
    count = math.prod(input.shape[d] for d in dims)
    centered = input - input.mean(dims, keepdim=True)
    return (centered * centered).sum(dims, keepdim=keepdim) / builtins.max(count - correction, 0)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    # NOTE: sqrt's gradient is infinite at 0 (inf * 0 = nan for equal values); torch's std_backward gives 0 there.
    # The inner where keeps the gradient finite, the outer one stops it, and the value is sqrt(v) everywhere.
    v = var(input, dim, unbiased, keepdim, correction=correction)
    nonzero = v != 0
    return v.where(nonzero, 1.0).sqrt().where(nonzero, 0.0)


def _extremum(name, arg_name, elementwise):
    def fn(input, dim=None, keepdim=False):
        if is_tensor_like(dim):
            return apply(elementwise, input, dim)
        if dim is None:
            if _numel(input) == 0:
                raise RuntimeError(f"{name[1:]}(): Expected reduction dim to be specified for input.numel() == 0. "
                                   f"Specify the reduction dim with the 'dim' argument.")
            return apply(name, input, dims=tuple(range(input.ndim)), keepdim=False)
        d = wrap_dim(dim, input.ndim)
        indices = apply(arg_name, input, dim=d, keepdim=keepdim)
        # the gather reads a view of the indices returned: modifying them in place is caught, as in torch
        values = apply("gather", input, indices if keepdim else indices.unsqueeze(d), dim=d)
        return ValuesIndices(values if keepdim else _own(values.squeeze(d)), indices)

    fn.__name__ = fn.__qualname__ = name[1:]
    return fn


max = _extremum("amax", "argmax", "maximum")
min = _extremum("amin", "argmin", "minimum")


def amax(input, dim=(), keepdim=False):
    return apply("amax", input, dims=wrap_dims(dim, input.ndim), keepdim=keepdim)


def amin(input, dim=(), keepdim=False):
    return apply("amin", input, dims=wrap_dims(dim, input.ndim), keepdim=keepdim)


def argmax(input, dim=None, keepdim=False):
    return apply("argmax", input, dim=None if dim is None else wrap_dim(dim, input.ndim), keepdim=keepdim)


def argmin(input, dim=None, keepdim=False):
    return apply("argmin", input, dim=None if dim is None else wrap_dim(dim, input.ndim), keepdim=keepdim)


def prod(input, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    return apply("prod", input, dims=wrap_dims(dim, input.ndim), keepdim=keepdim)


def all(input, dim=None, keepdim=False):
    return apply("all", input, dims=wrap_dims(dim, input.ndim), keepdim=keepdim)


def any(input, dim=None, keepdim=False):
    return apply("any", input, dims=wrap_dims(dim, input.ndim), keepdim=keepdim)


def sum_to_size(input, *size):
    """Sum over broadcast dims so the result has `size` (the reverse of expand)."""
    size = size_args(size)
    shape = tuple(input.shape)
    if shape == size:
        return input
    lead = len(shape) - len(size)
    if lead < 0 or builtins.any(s != 1 and s != shape[lead + i] for i, s in enumerate(size)):
        raise RuntimeError(f"size {list(size)} is not expandable to size {list(shape)}")
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(size) if s == 1 and shape[lead + i] != 1)
    out = apply("sum", input, dims=dims, keepdim=True) if dims else input
    return out.reshape(size) if tuple(out.shape) != size else out


# ---------------------------------------------------------------------------------------------
# Linear algebra
# ---------------------------------------------------------------------------------------------

def matmul(input, other):
    if input.ndim == 0 or other.ndim == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are "
                           f"{input.ndim}D and {other.ndim}D")
    a = input.unsqueeze(0) if input.ndim == 1 else input
    b = other.unsqueeze(-1) if other.ndim == 1 else other
    if a.shape[-1] != b.shape[-2] and (input.ndim == 1 or other.ndim == 1):
        raise RuntimeError(f"matmul: size mismatch, got input {list(input.shape)} and other {list(other.shape)}")
    out = apply("matmul", a, b)
    if input.ndim == 1:
        out = out.squeeze(-2)
    if other.ndim == 1:
        out = out.squeeze(-1)
    return _own(out) if input.ndim == 1 or other.ndim == 1 else out


def mm(input, mat2):
    if input.ndim != 2 or mat2.ndim != 2:
        raise RuntimeError(f"mm: expected 2-D tensors, got {input.ndim}D and {mat2.ndim}D")
    return apply("matmul", input, mat2)


def bmm(input, mat2):
    if input.ndim != 3 or mat2.ndim != 3:
        raise RuntimeError(f"bmm: expected 3-D tensors, got {input.ndim}D and {mat2.ndim}D")
    return apply("matmul", input, mat2)


# ---------------------------------------------------------------------------------------------
# Shape and view ops
# ---------------------------------------------------------------------------------------------

def reshape(input, *shape):
    shape = _resolve_shape(size_args(shape), _numel(input))
    return apply("reshape", input, shape=shape)


def view(input, *shape):
    return reshape(input, *shape)


def view_as(input, other):
    return reshape(input, tuple(other.shape))


def reshape_as(input, other):
    return reshape(input, tuple(other.shape))


def flatten(input, start_dim=0, end_dim=-1):
    if input.ndim == 0:
        return input.reshape(1)
    start, end = wrap_dim(start_dim, input.ndim), wrap_dim(end_dim, input.ndim)
    if start > end:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    shape = tuple(input.shape)
    return input.reshape(shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:])


def unflatten(input, dim, sizes):
    d = wrap_dim(dim, input.ndim)
    shape = tuple(input.shape)
    sizes = _resolve_shape(tuple(sizes), shape[d])
    return input.reshape(shape[:d] + sizes + shape[d + 1:])


def squeeze(input, dim=None):
    shape = tuple(input.shape)
    dims = wrap_dims(dim, input.ndim)
    keep = tuple(s for i, s in enumerate(shape) if not (i in dims and s == 1))
    return _alias(input) if keep == shape else apply("reshape", input, shape=keep)


def unsqueeze(input, dim):
    d = wrap_dim(dim, input.ndim + 1)
    shape = tuple(input.shape)
    return apply("reshape", input, shape=shape[:d] + (1,) + shape[d:])


def permute(input, *dims):
    dims = tuple(wrap_dim(d, input.ndim) for d in size_args(dims))
    return apply("permute", input, dims=dims)


def transpose(input, dim0, dim1):
    d0, d1 = wrap_dim(dim0, input.ndim), wrap_dim(dim1, input.ndim)
    dims = list(range(input.ndim))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return apply("permute", input, dims=tuple(dims))


swapaxes = transpose


def t(input):
    if input.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {input.ndim}D")
    return _alias(input) if input.ndim < 2 else transpose(input, 0, 1)


def expand(input, *sizes):
    sizes = size_args(sizes)
    shape = tuple(input.shape)
    lead = len(sizes) - len(shape)
    if lead < 0:
        raise RuntimeError(f"expand: the number of sizes provided ({len(sizes)}) must be greater or equal to the "
                           f"number of dimensions in the tensor ({len(shape)})")
    target = tuple(shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(sizes))
    return _alias(input) if target == shape else apply("expand", input, shape=target)


def expand_as(input, other):
    return expand(input, tuple(other.shape))


def broadcast_to(input, size):
    return expand(input, tuple(size))


def cat(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat(): expected a non-empty list of Tensors")
    d = wrap_dim(dim, tensors[0].ndim)
    return apply("cat", *tensors, dim=d)


concat = concatenate = cat


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    for i, x in enumerate(tensors[1:], 1):
        if tuple(x.shape) != tuple(tensors[0].shape):
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(tensors[0].shape)} "
                               f"at entry 0 and {list(x.shape)} at entry {i}")
    d = wrap_dim(dim, tensors[0].ndim + 1)
    return cat([x.unsqueeze(d) for x in tensors], d)


def narrow(input, dim, start, length):
    d = wrap_dim(dim, input.ndim)
    size = input.shape[d]
    start = start + size if start < 0 else start
    if not (0 <= start and start + length <= size and length >= 0):
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    key = (("slice", None, None, None),) * d + (("slice", start, start + length, None),)
    return apply("getitem", input, key=key)


def select(input, dim, index):
    d = wrap_dim(dim, input.ndim)
    size = input.shape[d]
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(input.shape)} "
                         f"at dimension {d}")
    return apply("getitem", input, key=(("slice", None, None, None),) * d + (("int", index),))


def split(tensor, split_size_or_sections, dim=0):
    d = wrap_dim(dim, tensor.ndim)
    size = tensor.shape[d]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if step <= 0:
            raise RuntimeError(f"split expects split_size be non-negative, but got split_size={step}")
        sections = [builtins.min(step, size - s) for s in range(0, size, step)] or [0]
    else:
        sections = list(split_size_or_sections)
        if builtins.sum(sections) != size:
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {size} (input tensor's size "
                               f"at dimension {d}), but got split_sizes={sections}")
    out, start = [], 0
    for length in sections:
        out.append(narrow(tensor, d, start, length))
        start += length
    return tuple(out)


def chunk(input, chunks, dim=0):
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    size = input.shape[wrap_dim(dim, input.ndim)]
    return split(input, builtins.max(-(-size // chunks), 1), dim)


def unbind(input, dim=0):
    d = wrap_dim(dim, input.ndim)
    return tuple(select(input, d, i) for i in range(input.shape[d]))


def gather(input, dim, index):
    return apply("gather", input, index, dim=wrap_dim(dim, input.ndim))


def take_along_dim(input, indices, dim):
    return gather(input, dim, indices)


def scatter_add(input, dim, index, src):
    return apply("scatter_add", input, index, src, dim=wrap_dim(dim, input.ndim))


def index_select(input, dim, index):
    d = wrap_dim(dim, input.ndim)
    return apply("getitem", input, index, key=(("slice", None, None, None),) * d + (("tensor", 0),))


def clone(input, *, memory_format=None):
    return apply("clone", input)


def detach(input):
    return apply("detach", input)


def repeat(input, *sizes):
    sizes = size_args(sizes)
    if len(sizes) < input.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    x = input.reshape((1,) * (len(sizes) - input.ndim) + tuple(input.shape))
    shape = tuple(x.shape)
    interleaved = tuple(v for pair in zip(sizes, shape) for v in pair)
    x = x.reshape(tuple(v for s in shape for v in (1, s))).expand(interleaved)
    return _own(x.reshape(tuple(r * s for r, s in zip(sizes, shape))), copy=True)


# ---------------------------------------------------------------------------------------------
# Indexing: encode a Python key into the hashable form the getitem/index_put ops take.
# ---------------------------------------------------------------------------------------------

def encode_index(input, key):
    """(encoded key, index tensors) for input[key]; lists and arrays become int64/bool tensors."""
    if not isinstance(key, tuple):
        key = (key,)
    encoded, tensors = [], []
    for item in key:
        if item is None:
            encoded.append(("none",))
        elif item is Ellipsis:
            encoded.append(("ellipsis",))
        elif isinstance(item, slice):
            encoded.append(_encode_slice(item))
        elif isinstance(item, bool):
            raise IndexError("indexing with a Python bool is not supported; use a bool tensor")
        elif is_tensor_like(item) or isinstance(item, (list, tuple)) or hasattr(item, "__array__"):
            index = item if is_tensor_like(item) else _index_tensor(input, item)
            if index.dtype not in (dt.int64, dt.bool_):
                if index.dtype.is_floating_point:
                    raise IndexError("tensors used as indices must be long, int or bool tensors")
                index = index.to(dt.int64)
            encoded.append(("tensor", len(tensors)))
            tensors.append(index)
        else:
            try:
                encoded.append(("int", item.__index__()))
            except AttributeError:
                raise IndexError(f"only integers, slices, None, Ellipsis and integer or boolean tensors are "
                                 f"valid indices (got {type(item).__name__})") from None
    return tuple(encoded), tensors


def _index_tensor(input, item):
    """A list or array used as an index becomes a bool tensor (a mask) or an int64 tensor."""
    values = np.asarray(item)
    if values.dtype.kind == "b":
        return input.new_tensor(values, dtype=dt.bool_)
    if values.dtype.kind not in "iu" and values.size:
        raise IndexError("tensors used as indices must be long, int or bool tensors")
    return input.new_tensor(values.astype(np.int64), dtype=dt.int64)


def _encode_slice(s: slice):
    parts = tuple(None if v is None else v.__index__() for v in (s.start, s.stop, s.step))
    if parts[2] is not None and parts[2] <= 0:
        raise ValueError("step must be greater than zero")
    return ("slice",) + parts


def getitem(input, key):
    encoded, tensors = encode_index(input, key)
    return apply("getitem", input, *tensors, key=encoded)


# ---------------------------------------------------------------------------------------------
# dtype conversion and new tensors like an existing one
# ---------------------------------------------------------------------------------------------

def to_dtype(input, dtype, copy=False):
    dtype = dt.as_dtype(dtype)
    if dtype is input.dtype:
        return clone(input) if copy else input
    return apply("cast", input, dtype=dtype)


def new_full(input, size, fill_value, *, dtype=None, device=None, requires_grad=False):
    out = apply("full", like=input, shape=size_args((size,)), value=fill_value,
                dtype=dt.as_dtype(dtype) if dtype is not None else input.dtype)
    return out.requires_grad_(True) if requires_grad else out


def new_zeros(input, *size, dtype=None, device=None, requires_grad=False):
    return new_full(input, size_args(size), 0, dtype=dtype, requires_grad=requires_grad)


def new_ones(input, *size, dtype=None, device=None, requires_grad=False):
    return new_full(input, size_args(size), 1, dtype=dtype, requires_grad=requires_grad)


new_empty = new_zeros


def _conversion(dtype_name: str):
    def convert(input):
        return to_dtype(input, getattr(dt, dtype_name))

    convert.__name__ = convert.__qualname__ = {"float32": "float", "float64": "double", "float16": "half",
                                               "int64": "long", "int32": "int", "bool_": "bool"}[dtype_name]
    return convert


def type_as(input, other):
    return to_dtype(input, other.dtype)


# ---------------------------------------------------------------------------------------------
# Triangles, top-k and sampling
# ---------------------------------------------------------------------------------------------

def _off_triangle(input, diagonal, lower: bool, name: str):
    """The bool mask of what tril (lower) or triu drops, over the last two dims."""
    if input.ndim < 2:
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
    if not hasattr(diagonal, "__index__"):
        raise TypeError(f"{name}(): argument 'diagonal' must be int, not {type(diagonal).__name__}")
    rows, cols, k = input.shape[-2], input.shape[-1], diagonal.__index__()
    # NOTE: the mask depends only on the shape, so it is a constant: tril is one where, and its gradient
    # is the same mask applied to the incoming gradient (where's rule), with no rule of its own.
    drop = ~np.tri(rows, cols, k, dtype=bool) if lower else np.tri(rows, cols, k - 1, dtype=bool)
    return input.new_tensor(drop, dtype=dt.bool_)


def tril(input, diagonal=0):
    return masked_fill(input, _off_triangle(input, diagonal, True, "tril"), 0)


def triu(input, diagonal=0):
    return masked_fill(input, _off_triangle(input, diagonal, False, "triu"), 0)


def _values(input, name: str) -> np.ndarray:
    """The numpy values of an eager tensor, for ops whose result depends on values (not only shapes)."""
    from .tensor import Tensor

    if not isinstance(input, Tensor):
        raise TypeError(f"{name} reads tensor values, so it needs an eager Tensor, not {type(input).__name__}")
    return input.detach().numpy()


def _topk_indices(a: np.ndarray, k: int, axis: int, largest: bool) -> np.ndarray:
    """Indices of the k largest (or smallest) entries along axis, best first; nan counts as the largest."""
    n = a.shape[axis]
    if 0 < k < n:  # O(n) selection, then a sort of the k chosen only
        idx = np.argpartition(a, n - k if largest else k - 1, axis=axis)
    else:
        idx = np.argsort(a, axis=axis)
    idx = np.take(idx, np.arange(n - k, n) if largest else np.arange(k), axis=axis)
    order = np.argsort(np.take_along_axis(a, idx, axis=axis), axis=axis, kind="stable")
    return np.take_along_axis(idx, np.flip(order, axis=axis) if largest else order, axis=axis)


def topk(input, k, dim=-1, largest=True, sorted=True):
    """(values, indices) of the k largest (or smallest) entries along dim; always sorted, best first."""
    if input.dtype is dt.bool_:
        raise RuntimeError("topk does not support bool dtypes on CPU")
    if input.ndim == 0:
        wrap_dim(dim, 0)
        values, indices = topk(input.reshape(1), k, 0, largest)
        return ValuesIndices(values.reshape(()), indices.reshape(())) if k == 1 else ValuesIndices(values, indices)
    d = wrap_dim(dim, input.ndim)
    if not 0 <= k <= input.shape[d]:
        raise RuntimeError("selected index k out of range")
    # NOTE: which entries win reads values, so the indices come from numpy on the eager tensor (a constant
    # to autograd); the values are a gather, whose rule scatters the gradient back to the chosen entries.
    indices = input.new_tensor(_topk_indices(_values(input, "topk"), k, d, largest), dtype=dt.int64)
    return ValuesIndices(gather(input, d, indices), indices)


def _check_multinomial(input, num_samples: int, replacement: bool) -> None:
    if input.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {input.dtype.name}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > input.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")


def _checked_rows(input) -> np.ndarray:
    """The probabilities as float64 rows, with torch's errors for bad entries or an all-zero row."""
    p = _values(input, "multinomial").astype(np.float64).reshape(-1, input.shape[-1])
    if not np.isfinite(p).all() or (p < 0).any():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if (p.sum(axis=1) <= 0).any():
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    return p


def _draw_with_replacement(p: np.ndarray, count: int, gen: np.random.Generator) -> np.ndarray:
    """Inverse-CDF draws: the first category whose cumulative probability exceeds a uniform."""
    cdf = np.cumsum(p, axis=1)
    cdf /= cdf[:, -1:]  # the last entry is then exactly 1.0, above every uniform in [0, 1)
    u = gen.random((p.shape[0], count))
    return np.array([np.searchsorted(c, x, side="right") for c, x in zip(cdf, u)], np.int64).reshape(u.shape)


def _draw_without_replacement(p: np.ndarray, count: int, gen: np.random.Generator) -> np.ndarray:
    """Categories in the order sequential draws without replacement pick them (an exponential race)."""
    # NOTE: category i finishes at E_i / p_i with E_i ~ Exp(1); the finishing order is distributed as
    # drawing one by one in proportion to the remaining probabilities. A zero probability finishes last.
    with np.errstate(divide="ignore"):
        times = gen.exponential(size=p.shape) / p
    return _topk_indices(times, count, 1, largest=False)


def multinomial(input, num_samples, replacement=False, *, generator=None):
    """int64 category indices drawn from (unnormalised) probabilities: one row of draws per row of input."""
    _check_multinomial(input, num_samples, replacement)
    p = _checked_rows(input)
    draw = _draw_with_replacement if replacement else _draw_without_replacement
    samples = draw(p, num_samples, rng(generator))
    return input.new_tensor(samples.reshape(tuple(input.shape[:-1]) + (num_samples,)), dtype=dt.int64)


# ---------------------------------------------------------------------------------------------
# What becomes a Tensor method (name -> function taking the tensor first) and operator dunders.
# ---------------------------------------------------------------------------------------------

METHODS = {name: globals()[name] for name in """
    add sub mul div floor_divide remainder pow maximum minimum neg negative abs absolute sign floor ceil round
    exp log log1p log2 log10 sqrt rsqrt reciprocal sin cos tanh sigmoid relu erf square
    eq ne lt le gt ge equal isclose allclose logical_and logical_or logical_xor logical_not
    bitwise_not bitwise_and bitwise_or bitwise_xor isnan isinf isfinite
    masked_fill clamp clip softmax log_softmax logsumexp addcmul addcdiv lerp
    sum mean var std max min amax amin argmax argmin prod all any sum_to_size
    matmul mm bmm reshape view view_as reshape_as flatten unflatten squeeze unsqueeze permute transpose swapaxes
    t expand expand_as broadcast_to narrow select split chunk unbind gather take_along_dim scatter_add
    index_select clone detach repeat new_full new_zeros new_ones new_empty tril triu topk multinomial
""".split()}
METHODS.update({f.__name__: f for f in map(_conversion, ("float32", "float64", "float16", "int64", "int32", "bool_"))})
METHODS.update(type_as=type_as, multiply=mul, subtract=sub, divide=div, true_divide=div, greater=gt, less=lt,
               greater_equal=ge, less_equal=le, not_equal=ne)


def _where_method(self, condition, y):
    return where(condition, self, y)


METHODS["where"] = _where_method


def _reflected(fn):
    return lambda self, other: fn(other, self)


DUNDERS = {
    "__add__": add, "__radd__": _reflected(add),
    "__sub__": sub, "__rsub__": _reflected(sub),
    "__mul__": mul, "__rmul__": _reflected(mul),
    "__truediv__": div, "__rtruediv__": _reflected(div),
    "__floordiv__": floor_divide, "__rfloordiv__": _reflected(floor_divide),
    "__mod__": remainder, "__rmod__": _reflected(remainder),
    "__pow__": pow, "__rpow__": _reflected(pow),
    "__matmul__": matmul, "__rmatmul__": _reflected(matmul),
    "__and__": bitwise_and, "__rand__": _reflected(bitwise_and),
    "__or__": bitwise_or, "__ror__": _reflected(bitwise_or),
    "__xor__": bitwise_xor, "__rxor__": _reflected(bitwise_xor),
    "__eq__": eq, "__ne__": ne, "__lt__": lt, "__le__": le, "__gt__": gt, "__ge__": ge,
    "__neg__": neg, "__abs__": abs, "__invert__": bitwise_not, "__getitem__": getitem,
    "__pos__": lambda self: self,
}
