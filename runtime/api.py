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

from . import amp as _amp
from . import dtypes as dt
from . import memory_formats as mf
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


def _size_value(value):
    """An int from an index-like value; a compiler's symbolic size (it says so) stays one."""
    return value if _is_symbolic_size(value) else value.__index__()


def _is_symbolic_size(value) -> bool:
    """Whether a size is a compiler's symbolic size (nnc.symbolic.SymInt says so), which stays as it is."""
    return getattr(type(value), "symbolic_size", False)


def size_args(sizes) -> tuple:
    """Accept f(2, 3), f((2, 3)) and f([2, 3]) and return a tuple of ints."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = sizes[0]
    if builtins.all(type(s) is int for s in sizes):
        return tuple(sizes)
    try:  # a compiler's symbolic size (nnc.symbolic.SymInt) says so, and stays one
        return tuple(_size_value(s) for s in sizes)
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
    if math.prod(shape) != numel or builtins.any(s < 0 for s in shape):
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
# bfloat16 composites
# ---------------------------------------------------------------------------------------------

def rounds_bfloat16_once(fn):
    """Decorate a composite op so that on a bfloat16 input it computes in float32 and rounds its result to bfloat16
    once, as torch's fused kernel for it does (its steps would otherwise each round to bfloat16)."""

    @functools.wraps(fn)
    def composite(input, *args, **kwargs):
        if getattr(input, "dtype", None) is not dt.bfloat16:
            return fn(input, *args, **kwargs)
        out = fn(_widened(input), *map(_widened, args), **{k: _widened(v) for k, v in kwargs.items()})
        return out.to(dt.bfloat16) if is_tensor_like(out) and out.dtype is dt.float32 else out

    return composite


def _widened(value):
    return value.float() if is_tensor_like(value) and value.dtype is dt.bfloat16 else value


# ---------------------------------------------------------------------------------------------
# Elementwise
# ---------------------------------------------------------------------------------------------

def add(input, other, *, alpha=1):
    if alpha == 1:
        return apply("add", input, other)
    return _scaled_add(input, other, alpha, "add")


def sub(input, other, *, alpha=1):
    if alpha == 1:
        return apply("sub", input, other)
    return _scaled_add(input, other, alpha, "sub")


def _scaled_add(input, other, alpha, name):
    if getattr(input, "dtype", None) is dt.bfloat16 and type(alpha) in (int, float):
        alpha = float(dt.bfloat16.np.type(alpha))  # torch casts alpha to the op's dtype, then computes in float32
    if is_tensor_like(input) and is_tensor_like(other) and other.dtype.is_floating_point:
        wider = result_type(input, other)
        if wider is not other.dtype:  # NOTE: a float32 parameter plus alpha times a bfloat16 update: alpha * other
            other = other.to(wider)   # is computed at the result's precision, not rounded to bfloat16 first
    return _add_scaled_other(input, other, alpha, name)


@rounds_bfloat16_once
def _add_scaled_other(input, other, alpha, name):
    if getattr(input, "dtype", None) is dt.float32 and getattr(other, "dtype", None) is dt.float32 and \
            type(alpha) in (int, float):
        # NOTE: torch's kernel is one fused multiply-add, alpha in float32: through float64 (the product is exact
        # there), rounded once, as an EMA's mul_(decay).add_(p, alpha=1 - decay) must be to give torch's bits
        return apply(name, input.double(), other.double() * float(np.float32(alpha))).to(dt.float32)
    return apply(name, input, other * alpha)


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
    # NOTE: the result requires grad where an input does, as torch's; its gradient is zero (torch's floor_divide
    # raises at backward instead, div(rounding_mode='floor') gives zero as here).
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


def round(input, *, decimals=0):
    if decimals:
        if not input.dtype.is_floating_point:
            raise RuntimeError("round_cpu not implemented for integer dtypes with decimals != 0")
        # NOTE: torch scales by 10**decimals (dividing by 10**-decimals for negative decimals), rounds half to even
        # and scales back, so 2.675 with decimals=2 rounds as 267.49999... does
        scale = 10.0 ** builtins.abs(decimals)
        if decimals > 0:
            return round(input * scale) / scale
        return round(input / scale) * scale
    if not input.dtype.is_floating_point:
        return clone(input)
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
    if input.dtype is dt.bool_:
        return eq(input, other)
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
        return nonzero(condition, as_tuple=True)
    if input is None or other is None:
        raise TypeError("where() takes a condition alone, or a condition, input and other")
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


@rounds_bfloat16_once
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


@rounds_bfloat16_once
def logsumexp(input, dim, keepdim=False):
    # NOTE: stable form m + log(sum(exp(x - m))); an infinite max is replaced by 0 so that rows of
    # all -inf give -inf (not nan) and a +inf gives +inf, as in torch.
    dims = wrap_dims(dim, input.ndim)
    m = input.amax(dims, keepdim=True).detach()
    m = m.masked_fill(isinf(m), 0.0)
    out = (input - m).exp().sum(dims, keepdim=True).log() + m
    return out if keepdim else _own(out.squeeze(dims))


@rounds_bfloat16_once
def addcmul(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 * tensor2 as torch's kernel computes it: (value * tensor1) times tensor2 in one fused
    multiply-add with input (float32 through float64, where the product is exact)."""
    scaled = tensor1 * value if value != 1 else tensor1
    if builtins.all(getattr(t, "dtype", None) is dt.float32 for t in (input, tensor1, tensor2)):
        return (scaled.double() * tensor2.double() + input.double()).to(dt.float32)
    return input + scaled * tensor2


@rounds_bfloat16_once
def addcdiv(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 / tensor2, (value * tensor1) / tensor2 as torch's kernel orders it."""
    return input + (tensor1 * value if value != 1 else tensor1) / tensor2


@rounds_bfloat16_once
def lerp(input, end, weight):
    """torch's two-sided formula, exact at both ends: input + w (end - input) where |w| < 0.5, else
    end + (w - 1)(end - input), a number w taken at the precision torch computes in (float32 for float32). torch
    computes it as one fused multiply-add; in float32 so does this, through float64 (the product is exact there)."""
    diff = end - input
    if is_tensor_like(weight):
        small = abs(weight) < 0.5
        base, coefficient = where(small, input, end), where(small, weight, weight - 1)
    else:
        if getattr(diff, "dtype", None) in (dt.float32, dt.float16):
            weight = float(np.float32(weight))
        small = builtins.abs(weight) < 0.5
        base, coefficient = (input if small else end), (weight if small else weight - 1)
    if getattr(diff, "dtype", None) is dt.float32 and getattr(base, "dtype", dt.float32) is dt.float32:
        return (coefficient * diff.double() + base).to(dt.float32)
    return base + coefficient * diff


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


@rounds_bfloat16_once
def mean(input, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    if not input.dtype.is_differentiable:
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


@rounds_bfloat16_once
def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    dim, correction = _var_args(dim, unbiased, correction)
    dims = wrap_dims(dim, input.ndim)
    count = math.prod(input.shape[d] for d in dims)
    centered = input - input.mean(dims, keepdim=True)
    squares = real(centered * conj(centered)) if input.dtype.is_complex else centered * centered  # |x - mean|^2
    return squares.sum(dims, keepdim=keepdim) / builtins.max(count - correction, 0)


@rounds_bfloat16_once
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


@_amp.runs_in_float32
def prod(input, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    return apply("prod", input, dims=wrap_dims(dim, input.ndim), keepdim=keepdim)


def all(input, dim=None, keepdim=False):
    return _uint8_stays_uint8(input, apply("all", input, dims=wrap_dims(dim, input.ndim), keepdim=keepdim))


def any(input, dim=None, keepdim=False):
    return _uint8_stays_uint8(input, apply("any", input, dims=wrap_dims(dim, input.ndim), keepdim=keepdim))


def _uint8_stays_uint8(input, result):
    """torch's all() and any() of a uint8 tensor give uint8 (0 or 1), a rule kept from before bool tensors."""
    return result.to(dt.uint8) if input.dtype is dt.uint8 else result


def _surely_equal(a: tuple, b: tuple) -> bool:
    """Whether two shapes are equal, for a shortcut that is optional: a compiler's symbolic size (which says so) is
    only equal to itself here, so the shortcut never becomes a decision on its value."""
    return len(a) == len(b) and builtins.all(
        x is y or not (_is_symbolic_size(x) or _is_symbolic_size(y))
        and x == y for x, y in zip(a, b))


def sum_to_size(input, *size):
    """Sum over broadcast dims so the result has `size` (the reverse of expand)."""
    size = size_args(size)
    shape = tuple(input.shape)
    if _surely_equal(shape, size):
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


def spmm(input, mat2):
    """torch.spmm: a sparse matrix times a dense one (runtime.sparse's tensors take the matmul over)."""
    return mm(input, mat2)


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


def squeeze(input, dim=None, *more):
    if more:  # x.squeeze(0, 1)
        dim = (dim,) + more
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


def broadcast_to(input, *size):
    return expand(input, size_args(size))


def cat(tensors, dim=0, *, axis=None):
    if axis is not None:
        dim = axis
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat(): expected a non-empty list of Tensors")
    # NOTE: as torch, a 1-D tensor with no elements is skipped (a legacy rule), though its dtype still promotes
    kept = [x for x in tensors if tuple(x.shape) != (0,)]
    if not kept or len(kept) == len(tensors):
        d = wrap_dim(dim, tensors[0].ndim)
        return apply("cat", *tensors, dim=d)
    dtype = result_type(*tensors)
    d = wrap_dim(dim, kept[0].ndim)
    out = apply("cat", *kept, dim=d) if len(kept) > 1 else clone(kept[0])
    return out if out.dtype is dtype else out.to(dtype)


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


def take_along_dim(input, indices, dim=None):
    if dim is None:  # as torch: both flattened
        return gather(input.reshape(-1), 0, indices.reshape(-1))
    d = wrap_dim(dim, input.ndim)
    if input.ndim != indices.ndim:
        raise RuntimeError("torch.take_along_dim(): input and indices should have the same number of dimensions, "
                           f"but got {input.ndim} dimensions for input, and {indices.ndim} dimensions for indices")
    # torch broadcasts the two over every dim but `dim`
    shape = list(broadcast_shapes(tuple(input.shape), tuple(indices.shape)))
    shape_x, shape_i = list(shape), list(shape)
    shape_x[d], shape_i[d] = input.shape[d], indices.shape[d]
    return gather(expand(input, shape_x), d, expand(indices, shape_i))


def scatter_add(input, dim, index, src):
    return apply("scatter_add", input, index, src, dim=wrap_dim(dim, input.ndim))


def index_select(input, dim, index):
    d = wrap_dim(dim, input.ndim)
    return apply("getitem", input, index, key=(("slice", None, None, None),) * d + (("tensor", 0),))


def clone(input, *, memory_format=None):
    # NOTE: preserve_format (the default) gives a C-contiguous copy, where torch keeps a dense input's strides
    fmt = mf.checked(memory_format, "clone")
    if fmt.rank is None:
        return apply("clone", input)
    mf.check_rank(fmt, input.ndim)
    n = input.ndim  # a C-contiguous copy of the (N, spatial..., C) permutation is channels-last memory
    return _own(apply("clone", input.permute((0, *range(2, n), 1))).permute((0, n - 1, *range(1, n - 1))))


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
    """(encoded key, index tensors) for input[key]; lists, ranges and arrays become int64/bool tensors."""
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
        elif is_tensor_like(item) or isinstance(item, (list, tuple, range)) or hasattr(item, "__array__"):
            index = item if is_tensor_like(item) else _index_tensor(input, item)
            if index.dtype not in (dt.int64, dt.bool_):
                if index.dtype.is_floating_point:
                    raise IndexError("tensors used as indices must be long, int or bool tensors")
                index = index.to(dt.int64)
            encoded.append(("tensor", len(tensors)))
            tensors.append(index)
        else:
            try:
                encoded.append(("int", _size_value(item)))
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
    parts = tuple(None if v is None else _size_value(v) for v in (s.start, s.stop, s.step))
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
                                               "bfloat16": "bfloat16", "int64": "long", "int32": "int",
                                               "int16": "short", "int8": "char", "uint8": "byte",
                                               "bool_": "bool", "complex64": "cfloat",
                                               "complex128": "cdouble"}[dtype_name]
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
    if not (isinstance(rows, int) and isinstance(cols, int)):  # a compiler's symbolic sizes: the mask from ranges
        row = apply("arange", like=input, start=0, end=rows, step=1, dtype=dt.int64).reshape(rows, 1)
        col = apply("arange", like=input, start=0, end=cols, step=1, dtype=dt.int64).reshape(1, cols)
        return (col - row > k) if lower else (col - row < k)
    # NOTE: the mask depends only on the shape, so it is a constant: tril is one where, and its gradient
    # is the same mask applied to the incoming gradient (where's rule), with no rule of its own.
    drop = ~np.tri(rows, cols, k, dtype=bool) if lower else np.tri(rows, cols, k - 1, dtype=bool)
    return input.new_tensor(drop, dtype=dt.bool_)


def tril(input, diagonal=0):
    return masked_fill(input, _off_triangle(input, diagonal, True, "tril"), 0)


def triu(input, diagonal=0):
    return masked_fill(input, _off_triangle(input, diagonal, False, "triu"), 0)


def _on_host(input, name: str) -> None:
    """Raise for a CUDA tensor: `name` chooses entries by their values on the host."""
    if getattr(input, "is_cuda", False):
        raise NotImplementedError(f"{name} has no CUDA lowering in runtime's eager CUDA backend (it reads values on "
                                  f"the host); run it on the CPU (tensor.cpu())")


def _values(input, name: str) -> np.ndarray:
    """The numpy values of an eager tensor, for ops whose result depends on values (not only shapes)."""
    from .tensor import Tensor

    if not isinstance(input, Tensor):
        raise TypeError(f"{name} reads tensor values, so it needs an eager Tensor, not {type(input).__name__}")
    if input.is_cuda:
        raise NotImplementedError(f"{name} has no CUDA lowering in runtime's eager CUDA backend (it reads values on "
                                  f"the host); run it on the CPU (tensor.cpu())")
    return input.detach().numpy()


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
    _on_host(input, "topk")
    # NOTE: the values are a gather, whose rule scatters the gradient back to the chosen entries
    indices = apply("topk_indices", input, k=int(k), dim=d, largest=bool(largest))
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
    return _ops._np_topk_indices(times, count, 1, largest=False)


def multinomial(input, num_samples, replacement=False, *, generator=None):
    """int64 category indices drawn from (unnormalised) probabilities: one row of draws per row of input."""
    _check_multinomial(input, num_samples, replacement)
    p = _checked_rows(input)
    draw = _draw_with_replacement if replacement else _draw_without_replacement
    samples = draw(p, num_samples, rng(generator))
    return input.new_tensor(samples.reshape(tuple(input.shape[:-1]) + (num_samples,)), dtype=dt.int64)


# ---------------------------------------------------------------------------------------------
# More of torch's functions: elementwise math, scans, sorting, indexing, shapes, contractions, statistics.
# Compositions of primitives where they are differentiable; those reading values (sort's order, unique, nonzero)
# compute indices with numpy on the eager tensor and gather, as topk does.
# ---------------------------------------------------------------------------------------------

def broadcast_shapes(*shapes):
    from .tensor import Size

    try:
        return Size(_ops.broadcast_shapes(*(tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in shapes)))
    except _ops.ShapeError as e:
        raise RuntimeError(f"shape mismatch: {e}") from None


tan, asin, acos, atan = (_unary(n) for n in ("tan", "asin", "acos", "atan"))
sinh, cosh, asinh, acosh, atanh = (_unary(n) for n in ("sinh", "cosh", "asinh", "acosh", "atanh"))
expm1, erfc, erfinv, lgamma, digamma, trunc = (_unary(n) for n in ("expm1", "erfc", "erfinv", "lgamma", "digamma",
                                                                     "trunc"))
arcsin, arccos, arctan, arcsinh, arccosh, arctanh, fix = asin, acos, atan, asinh, acosh, atanh, trunc


def atan2(input, other):
    return apply("atan2", input, other)


arctan2 = atan2


def fmod(input, other):
    return apply("fmod", input, other)


def copysign(input, other):
    return apply("copysign", input, other)


def nextafter(input, other):
    return apply("nextafter", input, other)


def heaviside(input, values):
    return apply("heaviside", input, values)


def gcd(input, other):
    return apply("gcd", input, other)


def lcm(input, other):
    return apply("lcm", input, other)


def bitwise_left_shift(input, other):
    return apply("bitwise_left_shift", input, other)


def bitwise_right_shift(input, other):
    return apply("bitwise_right_shift", input, other)


class _Geqrf(NamedTuple):
    a: object
    tau: object


def geqrf(input):
    """LAPACK's QR in compact form: R on and above the diagonal, the Householder vectors below it, and their
    scales tau (linalg.householder_product(a, tau) is Q). Not differentiable, as torch's."""
    if input.ndim < 2:
        raise RuntimeError(f"torch.geqrf: input must have at least 2 dimensions, got {input.ndim}")
    a = _values(input, "geqrf")
    flat = a.reshape(-1, *a.shape[-2:])
    pairs = [np.linalg.qr(m, mode="raw") for m in flat]  # (h, tau) with h the transposed (Fortran) result
    stored = np.ascontiguousarray(np.stack([h.T for h, _ in pairs]).reshape(a.shape)) if flat.shape[0] else a.copy()
    k = builtins.min(a.shape[-2:])
    taus = np.stack([t for _, t in pairs]).reshape(a.shape[:-2] + (k,)) if flat.shape[0] else \
        np.zeros(a.shape[:-2] + (k,), a.dtype)
    return _Geqrf(input.new_tensor(stored.astype(a.dtype)), input.new_tensor(taus.astype(a.dtype)))


def polygamma(n, input):
    if n == 0:
        return digamma(input)
    if n == 1:
        return apply("trigamma", input)
    if not isinstance(n, int) or n < 0:
        raise RuntimeError(f"polygamma(n, x) does not support negative n (got {n})")
    return apply("polygamma", input, n=n)


def exp2(input):
    return pow(2.0, input) if input.dtype.is_floating_point else pow(2.0, input.to(dt.get_default_dtype()))


def frac(input):
    return input - trunc(input)


def sgn(input):
    return _ops._sgn(input) if input.dtype.is_complex else sign(input)


# complex numbers (runtime/ops.py says which primitives take them)

def is_complex(input):
    return input.dtype.is_complex


def is_conj(input):
    return False  # conj() here computes the conjugate, where torch may set a lazy bit


def conj(input):
    """The complex conjugate; a real tensor itself, as in torch."""
    return apply("conj", input) if input.dtype.is_complex else input


def conj_physical(input):
    return apply("conj", input) if input.dtype.is_complex else clone(input)


def resolve_conj(input):
    return input


resolve_neg = resolve_conj


def real(input):
    """The real parts of a complex tensor, a view of its memory; a real tensor itself."""
    return apply("real", input) if input.dtype.is_complex else input


def imag(input):
    if not input.dtype.is_complex:
        raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
    return apply("imag", input)


def angle(input):
    return apply("angle", input)


def view_as_real(input):
    if not input.dtype.is_complex:
        raise RuntimeError("view_as_real is only supported for complex tensors")
    return apply("view_as_real", input)


def view_as_complex(input):
    return apply("view_as_complex", input)


def complex(real, imag):  # noqa: A001 (torch's name)
    return apply("complex", real, imag)


def stft(input, n_fft, hop_length=None, win_length=None, window=None, center=True, pad_mode="reflect",
         normalized=False, onesided=None, return_complex=None):
    from .fft import stft as short_time_transform  # NOTE: runtime.fft imports this module

    return short_time_transform(input, n_fft, hop_length, win_length, window, center, pad_mode, normalized,
                                onesided, return_complex)


def istft(input, n_fft, hop_length=None, win_length=None, window=None, center=True, normalized=False,
          onesided=None, length=None, return_complex=False):
    from .fft import istft as inverse_short_time_transform

    return inverse_short_time_transform(input, n_fft, hop_length, win_length, window, center, normalized, onesided,
                                        length, return_complex)


def polar(abs, angle):  # noqa: A002 (torch's names)
    """abs * (cos(angle) + i sin(angle))."""
    return complex(abs * cos(angle), abs * sin(angle))


def signbit(input):
    if input.dtype is dt.bool_:
        return zeros_like_bool(input)
    if not input.dtype.is_floating_point:
        return input < 0
    return (input < 0) | ((input == 0) & ((1.0 / input) < 0))


def zeros_like_bool(input):
    return apply("full", like=input, shape=tuple(input.shape), value=False, dtype=dt.bool_)


def hypot(input, other):
    return sqrt(input * input + other * other)


def logaddexp(input, other):
    # NOTE: max + log1p(exp(-|a - b|)) never overflows; equal infinities give that infinity, not nan
    input, other = _floating_operands(input, other)
    m = maximum(input, other)
    d = abs(input - other)
    out = m + log1p(exp(-d))
    return where(input == other, input + math.log(2.0), out)


def _floating_operands(input, other) -> tuple:
    """Tensor operands of a floating-point op, bool or integer ones as the float dtype they promote to."""
    wanted = result_type(input, other)
    if not wanted.is_floating_point and not wanted.is_complex:
        wanted = dt.get_default_dtype()
    return tuple(a.to(wanted) if is_tensor_like(a) and a.dtype is not wanted else a for a in (input, other))


def logaddexp2(input, other):
    return logaddexp(input * math.log(2.0), other * math.log(2.0)) / math.log(2.0)


def xlogy(input, other):
    # NOTE: 0 * log(0) is 0 here, not nan; the gradient with respect to input stays log(other), as torch's
    x = input if is_tensor_like(input) else other.new_tensor(input, dtype=result_type(input, other))
    y = other if is_tensor_like(other) else x.new_tensor(other, dtype=result_type(x, other))
    logy = log(y)
    return x * where((x == 0) & ~isnan(y) & isinf(logy), 0.0, logy)


def ldexp(input, other):
    return input * pow(2.0, other)


def float_power(input, exponent):
    base = input.to(dt.float64) if is_tensor_like(input) else input
    exp_ = exponent.to(dt.float64) if is_tensor_like(exponent) else exponent
    return pow(base, exp_)


def logit(input, eps=None):
    # NOTE: not clamp(input, eps, 1 - eps): with eps > 0.5 torch takes eps below eps and 1 - eps above 1 - eps
    x = input if eps is None else where(input < eps, eps, where(input > 1 - eps, 1 - eps, input))
    # NOTE: log(x) - log1p(-x), not log(x / (1 - x)): its gradient at 0 and 1 is torch's inf, not 0/0
    return log(x) - log1p(-x)


def sinc(input):
    px = input * math.pi
    safe = where(input == 0, 1.0, px)
    return where(input == 0, 1.0, sin(safe) / safe)


def deg2rad(input):
    return input * (math.pi / 180)


def rad2deg(input):
    return input * (180 / math.pi)


def fmax(input, other):
    return where(isnan(other), input, where(isnan(input), other, maximum(input, other)))


def fmin(input, other):
    return where(isnan(other), input, where(isnan(input), other, minimum(input, other)))


def clamp_min(input, min):
    return clamp(input, min=min)


def clamp_max(input, max):
    return clamp(input, max=max)


def positive(input):
    if input.dtype is dt.bool_:
        raise RuntimeError("The `+` operator, on a bool tensor is not supported.")
    return input


def isneginf(input):
    return input == -inf


def isposinf(input):
    return input == inf


def isreal(input):
    if input.dtype.is_complex:
        return imag(input) == 0
    return apply("full", like=input, shape=tuple(input.shape), value=True, dtype=dt.bool_)


def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    if not input.dtype.is_floating_point:
        return clone(input)
    info = np.finfo(input.dtype.np)
    out = where(isnan(input), nan, input)
    out = where(out == inf, float(info.max) if posinf is None else posinf, out)
    return where(out == -inf, float(info.min) if neginf is None else neginf, out)


def is_signed(input):
    return input.dtype.is_signed


def is_nonzero(input):
    if _numel(input) != 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(input)


def count_nonzero(input, dim=None, *more):
    return (input != 0).sum((dim,) + more if more else dim)


def aminmax(input, *, dim=None, keepdim=False):
    from collections import namedtuple

    pair = namedtuple("aminmax", ["min", "max"])
    dims = () if dim is None else dim
    return pair(amin(input, dims, keepdim), amax(input, dims, keepdim))


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return std(input, dim, unbiased, keepdim, correction=correction), mean(input, dim, keepdim)


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return var(input, dim, unbiased, keepdim, correction=correction), mean(input, dim, keepdim)


def nansum(input, dim=None, keepdim=False, *, dtype=None):
    return sum(where(isnan(input), 0.0, input) if input.dtype.is_floating_point else input, dim, keepdim, dtype=dtype)


def nanmean(input, dim=None, keepdim=False, *, dtype=None):
    present = ~isnan(input)
    return nansum(input, dim, keepdim, dtype=dtype) / present.sum(dim, keepdim)


def cumsum(input, dim, *, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    if input.ndim == 0:
        return apply("cumsum", input.reshape(1), dim=0).reshape(())
    return apply("cumsum", input, dim=wrap_dim(dim, input.ndim))


def cumprod(input, dim, *, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    if input.ndim == 0:
        return apply("cumprod", input.reshape(1), dim=0).reshape(())
    return apply("cumprod", input, dim=wrap_dim(dim, input.ndim))


def logcumsumexp(input, dim):
    # NOTE: shifted by the (detached) max along dim so exp never overflows, as logsumexp
    d = wrap_dim(dim, input.ndim)
    m = input.amax(d, keepdim=True).detach() if _numel(input) else input.sum(d, keepdim=True).detach()
    m = m.masked_fill(isinf(m), 0.0)
    return log(cumsum(exp(input - m), d)) + m


def _cum_extremum(input, dim, name, ufunc):
    d = wrap_dim(dim, input.ndim)
    a = _values(input, name)
    if a.ndim == 0:
        return ValuesIndices(clone(input), input.new_tensor(0, dtype=dt.int64))
    n = a.shape[d]
    idx = np.broadcast_to(np.arange(n).reshape((-1,) + (1,) * (a.ndim - d - 1)), a.shape)
    running = ufunc.accumulate(a, axis=d) if n else a
    # the index of the last position holding the running extremum (torch takes the latest tie)
    hit = np.where((a == running) | (np.isnan(a) & np.isnan(running)), idx, -1)
    indices = np.maximum.accumulate(hit, axis=d) if n else hit
    ind = input.new_tensor(indices.astype(np.int64), dtype=dt.int64)
    return ValuesIndices(gather(input, d, ind), ind)


def cummax(input, dim):
    return _cum_extremum(input, dim, "cummax", np.maximum)


def cummin(input, dim):
    return _cum_extremum(input, dim, "cummin", np.minimum)


def diff(input, n=1, dim=-1, prepend=None, append=None):
    d = wrap_dim(dim, input.ndim)
    if prepend is not None or append is not None:
        parts = ([prepend] if prepend is not None else []) + [input] + ([append] if append is not None else [])
        input = cat(parts, d)
    for _ in range(n):
        size = input.shape[d]
        if size == 0:
            break
        hi, lo = narrow(input, d, 1, size - 1), narrow(input, d, 0, size - 1)
        input = (hi != lo) if input.dtype is dt.bool_ else hi - lo
    return input


def flip(input, *dims):
    dims = wrap_dims(size_args(dims) if dims else (), input.ndim) if dims else ()
    if not dims:
        return clone(input)
    key = tuple(("slice", None, None, -1) if i in dims else ("slice", None, None, None) for i in range(input.ndim))
    return _own(apply("getitem", input, key=key), copy=True)


def fliplr(input):
    if input.ndim < 2:
        raise RuntimeError("Input must be >= 2-d.")
    return flip(input, 1)


def flipud(input):
    if input.ndim < 1:
        raise RuntimeError("Input must be >= 1-d.")
    return flip(input, 0)


def roll(input, shifts, dims=None):
    if dims is None:
        return roll(input.reshape(-1), shifts, 0).reshape(tuple(input.shape))
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    out = input
    for s, d in zip(shifts, dims):
        d = wrap_dim(d, input.ndim)
        size = input.shape[d]
        if size == 0:
            continue
        s %= size
        if s:
            out = cat([narrow(out, d, size - s, s), narrow(out, d, 0, size - s)], d)
    return out if out is not input else clone(input)


def rot90(input, k=1, dims=(0, 1)):
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    d0, d1 = wrap_dim(dims[0], input.ndim), wrap_dim(dims[1], input.ndim)
    if d0 == d1:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {d0} and dim1 = {d1}")
    k %= 4
    if k == 1:
        return flip(input, d1).transpose(d0, d1)
    if k == 2:
        return flip(input, d0, d1)
    if k == 3:
        return flip(input, d0).transpose(d0, d1)
    return clone(input)


def movedim(input, source, destination):
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(src)} dims) should contain "
                           f"the same number of dims as destination ({list(dst)} dims)")
    src = [wrap_dim(d, input.ndim) for d in src]
    dst = [wrap_dim(d, input.ndim) for d in dst]
    order = [None] * input.ndim
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(d for d in range(input.ndim) if d not in src)
    order = [next(rest) if o is None else o for o in order]
    return permute(input, tuple(order))


moveaxis = movedim
swapdims = transpose


def ravel(input):
    return _own(input.reshape(-1), copy=not input.is_contiguous()) if _is_eager(input) else input.reshape(-1)


def tile(input, *sizes, dims=None):
    """torch.tile(input, dims), or the method's x.tile(1, 2) with the sizes as separate arguments."""
    dims = size_args(sizes if dims is None else (dims,))
    if len(dims) < input.ndim:
        dims = (1,) * (input.ndim - len(dims)) + dims
    return repeat(input, dims)


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    if repeats is None:  # repeat_interleave(repeats): the indices repeated
        counts = _values(input, "repeat_interleave")
        return input.new_tensor(np.repeat(np.arange(len(counts)), counts), dtype=dt.int64)
    if dim is None:
        input, dim = input.reshape(-1), 0
    d = wrap_dim(dim, input.ndim)
    n = input.shape[d]
    counts = _values(repeats, "repeat_interleave") if is_tensor_like(repeats) else np.full(n, repeats)
    counts = np.broadcast_to(counts, (n,))
    index = input.new_tensor(np.repeat(np.arange(n), counts).astype(np.int64), dtype=dt.int64)
    return index_select(input, d, index)


def meshgrid(*tensors, indexing=None):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing is None:
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}')
    n = len(tensors)
    sizes = [_numel(t) for t in tensors]
    swap = indexing == "xy" and n >= 2
    if swap:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for i, t in enumerate(tensors):
        pos = (1 - i if i < 2 else i) if swap else i
        shape = [1] * n
        shape[pos] = _numel(t)
        out.append(expand(t.reshape(tuple(shape)), tuple(sizes)))
    return tuple(out)


def cartesian_prod(*tensors):
    if len(tensors) == 1:
        return tensors[0]
    grids = meshgrid(*tensors, indexing="ij")
    return stack([g.reshape(-1) for g in grids], 1)


def broadcast_tensors(*tensors):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    shape = tuple(broadcast_shapes(*(tuple(t.shape) for t in tensors)))
    return tuple(expand(t, shape) for t in tensors)


def atleast_1d(*tensors):
    out = tuple(t.reshape(1) if t.ndim == 0 else t for t in _tensor_args(tensors))
    return out[0] if len(out) == 1 else out


def atleast_2d(*tensors):
    out = tuple(t.reshape(1, 1) if t.ndim == 0 else t.unsqueeze(0) if t.ndim == 1 else t
                for t in _tensor_args(tensors))
    return out[0] if len(out) == 1 else out


def atleast_3d(*tensors):
    def lift(t):
        if t.ndim == 0:
            return t.reshape(1, 1, 1)
        if t.ndim == 1:
            return t.reshape(1, -1, 1)
        return t.unsqueeze(-1) if t.ndim == 2 else t

    out = tuple(lift(t) for t in _tensor_args(tensors))
    return out[0] if len(out) == 1 else out


def _tensor_args(tensors):
    return tuple(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else tensors


def hstack(tensors):
    tensors = atleast_1d(*tensors)
    tensors = tensors if isinstance(tensors, tuple) else (tensors,)
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


def vstack(tensors):
    tensors = atleast_2d(*tensors)
    return cat(tensors if isinstance(tensors, tuple) else (tensors,), 0)


def dstack(tensors):
    tensors = atleast_3d(*tensors)
    return cat(tensors if isinstance(tensors, tuple) else (tensors,), 2)


def column_stack(tensors):
    return hstack([t.reshape(-1, 1) if t.ndim <= 1 else t for t in tensors])


def tensor_split(input, indices_or_sections, dim=0):
    d = wrap_dim(dim, input.ndim)
    size = input.shape[d]
    if isinstance(indices_or_sections, int):
        n = indices_or_sections
        if n <= 0:
            raise RuntimeError(f"number of sections must be larger than 0, got {n}")
        q, r = divmod(size, n)
        bounds, start = [], 0
        for i in range(n):
            bounds.append((start, start + q + (1 if i < r else 0)))
            start = bounds[-1][1]
    else:
        cuts = [int(c) for c in (indices_or_sections.tolist() if is_tensor_like(indices_or_sections)
                                 else indices_or_sections)]
        edges = [0] + cuts + [size]
        bounds = [(builtins.min(builtins.max(a, 0), size), builtins.min(builtins.max(b, a, 0), size))
                  for a, b in zip(edges, edges[1:])]
    return tuple(narrow(input, d, a, builtins.max(b - a, 0)) for a, b in bounds)


def _split_n(input, sections, dim, name):
    if isinstance(sections, int) and input.shape[dim] % sections:
        raise RuntimeError(f"torch.{name} attempted to split along dimension {dim}, but the size of the dimension "
                           f"{input.shape[dim]} is not divisible by the split_size {sections}!")
    return tensor_split(input, sections, dim)


def hsplit(input, sections, *indices):
    """Split along dim 1 (dim 0 of a vector); `t.hsplit(1, 2)` gives the indices as separate arguments, as in torch."""
    return _split_n(input, (sections, *indices) if indices else sections, 0 if input.ndim == 1 else 1, "hsplit")


def vsplit(input, sections, *indices):
    return _split_n(input, (sections, *indices) if indices else sections, 0, "vsplit")


def dsplit(input, sections, *indices):
    return _split_n(input, (sections, *indices) if indices else sections, 2, "dsplit")


def split_with_sizes(input, split_sizes, dim=0):
    return split(input, list(split_sizes), dim)


def diagonal(input, offset=0, dim1=0, dim2=1):
    d1, d2 = wrap_dim(dim1, input.ndim), wrap_dim(dim2, input.ndim)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    if d1 > d2:  # the same elements as the transposed matrix's opposite diagonal, in dims kept in memory order
        d1, d2, offset = d2, d1, -offset
    rows, cols = input.shape[d1], input.shape[d2]
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    n = builtins.max(builtins.min(rows - r0, cols - c0), 0)
    x = movedim(input, (d1, d2), (-2, -1))
    # NOTE: element (r0 + k, c0 + k) is element r0 * cols + c0 + k * (cols + 1) of the flattened matrix, so the
    # diagonal is a strided slice of it: a view (writes reach the input, as torch's `K.diagonal().add_(eps)` does)
    # wherever the two dims are contiguous together (a matrix, a batch of them); dims apart, or not contiguous
    # together, make the reshape a copy, and so the diagonal (where torch's is still a view)
    start = r0 * cols + c0
    flat = x.reshape(tuple(x.shape[:-2]) + (rows * cols,))
    return flat[..., start:start + n * (cols + 1):cols + 1] if n else flat[..., 0:0]


def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    n = input.shape[-1] + builtins.abs(offset)
    out_nd = input.ndim + 1
    rows = input.new_tensor(np.arange(input.shape[-1]) + builtins.max(-offset, 0), dtype=dt.int64)
    cols = input.new_tensor(np.arange(input.shape[-1]) + builtins.max(offset, 0), dtype=dt.int64)
    base = apply("full", like=input, shape=tuple(input.shape[:-1]) + (n, n), value=0, dtype=input.dtype)
    out = apply("index_put", base, input, rows, cols, key=(("ellipsis",), ("tensor", 0), ("tensor", 1)),
                accumulate=False)
    d1, d2 = wrap_dim(dim1, out_nd), wrap_dim(dim2, out_nd)
    return movedim(out, (-2, -1), (d1, d2)) if (d1, d2) != (out_nd - 2, out_nd - 1) else out


def diag(input, diagonal_=0, *, diagonal=None):
    k = diagonal if diagonal is not None else diagonal_
    if input.ndim == 1:
        return diag_embed(input, k)
    if input.ndim == 2:
        return globals()["diagonal"](input, k)
    raise RuntimeError("diag(): Supports 1D or 2D tensors. Got " + f"{input.ndim}D")


def diagflat(input, offset=0):
    return diag_embed(input.reshape(-1), offset)


@_amp.runs_in_float32
def trace(input):
    if input.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {input.ndim}")
    return diagonal(input).sum()


def tril_indices(row, col, offset=0, *, dtype=None, device=None):
    from .factories import tensor

    return tensor(np.stack(np.tril_indices(row, offset, col)), dtype=dtype or dt.int64)


def triu_indices(row, col, offset=0, *, dtype=None, device=None):
    from .factories import tensor

    return tensor(np.stack(np.triu_indices(row, offset, col)), dtype=dtype or dt.int64)


def block_diag(*tensors):
    mats = [t.reshape(1, -1) if t.ndim <= 1 and _numel(t) else t.reshape(1, 1) if t.ndim == 0 else t
            for t in tensors]
    dtype = result_type(*tensors)
    cols = builtins.sum(m.shape[1] for m in mats)
    rows, start = [], 0
    for m in mats:
        m = m.to(dtype)
        left = apply("full", like=m, shape=(m.shape[0], start), value=0, dtype=dtype)
        right = apply("full", like=m, shape=(m.shape[0], cols - start - m.shape[1]), value=0, dtype=dtype)
        rows.append(cat([left, m, right], 1))
        start += m.shape[1]
    return cat(rows, 0)


def narrow_copy(input, dim, start, length):
    return clone(narrow(input, dim, start, length))


def take(input, index):
    return gather(input.reshape(-1), 0, index.reshape(-1)).reshape(tuple(index.shape))


def unfold(input, dimension, size, step):
    """Tensor.unfold: the windows of `size` elements every `step` along `dimension`, as a new last dim."""
    d = wrap_dim(dimension, input.ndim)
    n = input.shape[d] if input.ndim else 1
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    count = (n - size) // step + 1
    if input.ndim and 0 < size <= step and count * step <= n:  # a view, as torch's (writes reach input)
        return _unfold_view(input, d, size, step, count)
    windows = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    x = movedim(input, d, -1) if input.ndim else input.reshape(1)
    idx = x.new_tensor(windows.astype(np.int64), dtype=dt.int64)
    out = apply("getitem", x, idx, key=(("ellipsis",), ("tensor", 0)))  # (..., count, size)
    return movedim(out, -2, d) if input.ndim else out.reshape(size)


def _unfold_view(input, d, size, step, count):
    """unfold's windows when size <= step and count * step <= the dim's size, from views only: the first count *
    step elements along d split into (count, step), each row cut to its first size elements, that dim moved last.
    NOTE: overlapping windows (size > step), or a last window closer than step - size to the end, would need an
    as_strided view; they are gathered (a copy: reads agree with torch, writes into them are lost)."""
    before = (slice(None),) * d
    x = input[before + (slice(0, count * step),)]
    x = x.reshape(tuple(input.shape[:d]) + (count, step) + tuple(input.shape[d + 1:]))
    if size < step:
        x = x[before + (slice(None), slice(0, size))]
    return movedim(x, d + 1, -1)


def _grid_index(index, dim):
    """The index tensors that address index's positions along `dim` and themselves elsewhere (scatter's key)."""
    tensors = [index if k == dim else _grid(index, k) for k in range(index.ndim)]
    key = tuple(("tensor", k) for k in range(index.ndim))
    return key, tensors


def _grid(index, k):
    """0..n-1 along dim k of index (of size n there), size 1 elsewhere. NOTE: from arange where n is a compiler's
    symbolic size, so that the grid is a graph node rather than numpy's constant of one size."""
    n = index.shape[k]
    shape = tuple(n if d == k else 1 for d in range(index.ndim))
    if _is_symbolic_size(n):
        from .factories import arange

        return arange(n, dtype=dt.int64).reshape(shape)
    return index.new_tensor(np.arange(n, dtype=np.int64).reshape(shape), dtype=dt.int64)


def _check_scatter_index(input, dim, index):
    if index.dtype is not dt.int64:
        raise RuntimeError(f"scatter(): Expected dtype int64 for index, got {index.dtype}")
    a = _values(index, "scatter") if _is_eager(index) else None
    if a is not None and a.size and (a.min() < 0 or a.max() >= input.shape[dim]):
        bad = a.max() if a.max() >= input.shape[dim] else a.min()
        raise RuntimeError(f"index {bad} is out of bounds for dimension {dim} with size {input.shape[dim]}")


def scatter(input, dim, index, src=None, *, value=None, reduce=None):
    d = wrap_dim(dim, input.ndim)
    _check_scatter_index(input, d, index)
    if src is None:
        src = value
    if reduce == "add":
        return scatter_add(input, d, index, src if is_tensor_like(src) else full_like_value(index, src, input))
    if reduce == "multiply":
        return scatter_reduce(input, d, index, src if is_tensor_like(src) else full_like_value(index, src, input),
                              "prod")
    if reduce is not None:
        raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce}")
    key, tensors = _grid_index(index, d)
    if is_tensor_like(src):
        src = narrow_to(src, tuple(index.shape))
    return apply("index_put", input, src, *tensors, key=key, accumulate=False)


def full_like_value(index, value, input):
    return apply("full", like=input, shape=tuple(index.shape), value=value, dtype=input.dtype)


def narrow_to(src, shape):
    """src's leading block of `shape` (scatter reads only as much of src as index has)."""
    key = tuple(("slice", 0, s, None) for s in shape)
    return apply("getitem", src, key=key) if tuple(src.shape) != shape else src


def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
    d = wrap_dim(dim, input.ndim)
    _check_scatter_index(input, d, index)
    src = narrow_to(src, tuple(index.shape))
    if reduce == "sum":
        base = input if include_self else scatter(input, d, index, value=0)
        return scatter_add(base, d, index, src)
    if reduce == "mean":
        total = scatter_reduce(input, d, index, src, "sum", include_self=include_self)
        count = scatter_add(apply("full", like=input, shape=tuple(input.shape),
                                  value=1 if include_self else 0, dtype=input.dtype), d, index,
                            apply("full", like=input, shape=tuple(index.shape), value=1, dtype=input.dtype))
        count = where(count == 0, 1, count)
        out = total / count
        return out if input.dtype.is_floating_point else floor_divide(total, count)
    if reduce in ("amax", "amin"):
        return apply("scatter_extremum", input, index, src, dim=d, reduce=reduce, include_self=bool(include_self))
    if reduce != "prod":
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    if _records_grad((input, src), {}, None):
        raise RuntimeError(f"scatter_reduce(reduce='{reduce}'): runtime has no gradient for this reduction")
    out = _values(input, "scatter_reduce").copy()
    idx = _along_axis(_values(index, "scatter_reduce"), d)
    if not include_self:
        out[idx] = 1
    np.multiply.at(out, idx, _values(src, "scatter_reduce").astype(out.dtype))
    return input.new_tensor(out)


def _along_axis(index, dim):
    grids = list(np.ogrid[tuple(slice(0, s) for s in index.shape)])
    grids[dim] = index
    return tuple(grids)


def index_add(input, dim, index, source, *, alpha=1):
    d = wrap_dim(dim, input.ndim)
    key = (("slice", None, None, None),) * d + (("tensor", 0),)
    src = source if alpha == 1 else source * alpha
    return apply("index_put", input, src, index, key=key, accumulate=True)


def index_copy(input, dim, index, source):
    d = wrap_dim(dim, input.ndim)
    key = (("slice", None, None, None),) * d + (("tensor", 0),)
    return apply("index_put", input, source, index, key=key, accumulate=False)


def index_fill(input, dim, index, value):
    d = wrap_dim(dim, input.ndim)
    key = (("slice", None, None, None),) * d + (("tensor", 0),)
    if is_tensor_like(value) and value.ndim:
        raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.ndim} dimension(s).")
    return apply("index_put", input, value if is_tensor_like(value) else value, index.reshape(-1), key=key,
                 accumulate=False)


def index_put(input, indices, values, accumulate=False):
    """input with `values` (broadcast) written at input[indices], a tuple of integer or bool index tensors; with
    `accumulate`, added instead, so repeated indices add up."""
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"index_put(): argument 'indices' must be tuple of Tensors, not {type(indices).__name__}")
    for k, index in enumerate(indices):
        if not is_tensor_like(index):
            raise TypeError(f"index_put(): expected Tensor as element {k} in argument 'indices', but got "
                            f"{type(index).__name__}")
    if not is_tensor_like(values):
        raise TypeError(f"index_put(): argument 'values' must be Tensor, not {type(values).__name__}")
    if values.dtype is not input.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got {input.dtype.name} for "
                           f"the destination and {values.dtype.name} for the source.")
    if len(indices) == 1 and indices[0].dtype is dt.bool_ and not (accumulate and input.dtype is dt.bool_):
        value = _value_at_every_masked_position(input, indices[0], values)
        if value is not None:
            mask = indices[0].reshape(tuple(indices[0].shape) + (1,) * (input.ndim - indices[0].ndim))
            return where(mask, input + value if accumulate else value, input)
    key, tensors = encode_index(input, tuple(indices))
    return apply("index_put", input, values, *tensors, key=key, accumulate=bool(accumulate))


def _value_at_every_masked_position(input, mask, values):
    """`values` without its leading (count) dim when index_put through `mask` writes the same values at every
    masked position, else None. Then the put is a `where`, whose shapes, gradients included, do not depend on how
    many elements the mask holds (so it compiles)."""
    rest = tuple(input.shape[mask.ndim:])
    if mask.ndim > input.ndim or tuple(mask.shape) != tuple(input.shape[:mask.ndim]):
        return None
    if values.ndim == len(rest) + 1 and values.shape[0] == 1:
        values = values.reshape(tuple(values.shape[1:]))
    if values.ndim > len(rest):
        return None
    try:
        fits = _ops.broadcast_shapes(tuple(values.shape), rest) == rest
    except _ops.ShapeError:
        return None
    return values if fits else None


def fill_diagonal_key(input, wrap=False):
    """The index tensors of the elements fill_diagonal_ writes: (i, i, ...) for every i < the smallest size; with
    `wrap`, a tall matrix's diagonal starts again after each blank row, as torch's does."""
    if input.ndim < 2:
        raise RuntimeError("dimensions must larger than 1")
    if input.ndim > 2 and len(set(input.shape)) != 1:
        raise RuntimeError("all dimensions of input must be of equal length")
    rows, cols = input.shape[0], input.shape[1]
    if wrap and input.ndim == 2 and rows > cols + 1:
        index = np.arange(rows)
        index = index[index % (cols + 1) != cols]
        return input.new_tensor(index, dtype=dt.int64), input.new_tensor(index % (cols + 1), dtype=dt.int64)
    index = input.new_tensor(np.arange(builtins.min(input.shape)), dtype=dt.int64)
    return (index,) * input.ndim


def masked_select(input, mask):
    x, m = broadcast_tensors(input, mask)
    return getitem(x, m)


def masked_scatter(input, mask, source):
    x, m = broadcast_tensors(input, mask)
    count = int(_values(m, "masked_scatter").sum())
    if count > _numel(source):
        raise RuntimeError("masked_scatter: expected source to have at least as many elements as ones in mask")
    flat = source.reshape(-1)[:count]
    encoded, tensors = encode_index(x, m)
    return apply("index_put", clone(x) if x is not input else input, flat, *tensors, key=encoded, accumulate=False)


def select_scatter(input, src, dim, index):
    d = wrap_dim(dim, input.ndim)
    key = (("slice", None, None, None),) * d + (("int", index),)
    return apply("index_put", input, src, key=key, accumulate=False)


def slice_scatter(input, src, dim=0, start=None, end=None, step=1):
    d = wrap_dim(dim, input.ndim)
    key = (("slice", None, None, None),) * d + (("slice", start, end, step),)
    return apply("index_put", input, src, key=key, accumulate=False)


def diagonal_scatter(input, src, offset=0, dim1=0, dim2=1):
    d1, d2 = wrap_dim(dim1, input.ndim), wrap_dim(dim2, input.ndim)
    x = movedim(input, (d1, d2), (-2, -1))
    rows, cols = x.shape[-2], x.shape[-1]
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    n = builtins.max(builtins.min(rows - r0, cols - c0), 0)
    i = x.new_tensor(np.arange(r0, r0 + n), dtype=dt.int64)
    j = x.new_tensor(np.arange(c0, c0 + n), dtype=dt.int64)
    out = apply("index_put", x, src, i, j, key=(("ellipsis",), ("tensor", 0), ("tensor", 1)), accumulate=False)
    return movedim(out, (-2, -1), (d1, d2))


def nonzero(input, *, as_tuple=False):
    a = _values(input, "nonzero")
    if as_tuple:
        if a.ndim == 0:
            return (input.new_tensor(np.zeros(int(a != 0), np.int64), dtype=dt.int64),)
        return tuple(input.new_tensor(i.astype(np.int64), dtype=dt.int64) for i in np.nonzero(a))
    return input.new_tensor(np.argwhere(a).astype(np.int64), dtype=dt.int64)


def argwhere(input):
    return nonzero(input)


def _sorted_indices(input, dim, descending, name):
    """The stable order of input along dim as an int64 tensor (sort_indices; a 0-dim input's is 0)."""
    _on_host(input, name)
    if input.ndim == 0:
        return input.new_tensor(0, dtype=dt.int64)
    return apply("sort_indices", input, dim=dim, descending=bool(descending))


def sort(input, dim=-1, descending=False, stable=False):
    if isinstance(dim, bool):  # sort(x, True)? no: torch's second positional is dim
        raise TypeError("sort(): argument 'dim' must be int, not bool")
    d = wrap_dim(dim, input.ndim)
    indices = _sorted_indices(input, d, descending, "sort")
    if input.ndim == 0:
        return ValuesIndices(clone(input), indices)
    return ValuesIndices(gather(input, d, indices), indices)


def argsort(input, dim=-1, descending=False, stable=False):
    return sort(input, dim, descending, stable).indices


def msort(input):
    return sort(input, 0).values


def kthvalue(input, k, dim=-1, keepdim=False):
    d = wrap_dim(dim, input.ndim)
    n = input.shape[d] if input.ndim else 1
    if not 1 <= k <= n:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d}")
    values, indices = sort(input, d)
    if input.ndim == 0:
        return ValuesIndices(values, indices)
    v, i = narrow(values, d, k - 1, 1), narrow(indices, d, k - 1, 1)
    return ValuesIndices(v if keepdim else _own(v.squeeze(d)), i if keepdim else _own(i.squeeze(d)))


def median(input, dim=None, keepdim=False):
    if dim is None:
        flat = input.reshape(-1)
        n = _numel(input)
        if n == 0:
            return apply("full", like=input, shape=(), value=math.nan, dtype=input.dtype)
        a = _values(flat, "median")
        if a.dtype.kind == "f" and np.isnan(a).any():
            return gather(flat, 0, flat.new_tensor([int(np.argmax(np.isnan(a)))], dtype=dt.int64)).reshape(())
        return kthvalue(flat, (n + 1) // 2, 0).values
    d = wrap_dim(dim, input.ndim)
    n = input.shape[d] if input.ndim else 1
    # NOTE: torch's median is the lower of the two middle values, and nan where a row holds nan
    values, indices = sort(input, d)
    if input.ndim == 0:
        return ValuesIndices(values, indices)
    a = _values(input, "median")
    pos = np.full(a.shape[:d] + a.shape[d + 1:], (n - 1) // 2, np.int64)
    if a.dtype.kind == "f":
        first_nan = np.argmax(np.isnan(np.sort(a, axis=d)), axis=d)
        pos = np.where(np.isnan(a).any(axis=d), first_nan, pos)
    p = input.new_tensor(np.expand_dims(pos, d), dtype=dt.int64)
    v, i = gather(values, d, p), gather(indices, d, p)
    return ValuesIndices(v if keepdim else _own(v.squeeze(d)), i if keepdim else _own(i.squeeze(d)))


def nanmedian(input, dim=None, keepdim=False):
    if dim is None:
        flat = input.reshape(-1)
        a = _values(flat, "nanmedian")
        keep = ~np.isnan(a) if a.dtype.kind == "f" else np.ones(a.shape, bool)
        if not keep.any():
            return apply("full", like=input, shape=(), value=math.nan, dtype=input.dtype)
        order = np.argsort(np.where(keep, a, np.inf), kind="stable")
        pick = order[(int(keep.sum()) - 1) // 2]
        return gather(flat, 0, flat.new_tensor([int(pick)], dtype=dt.int64)).reshape(())
    d = wrap_dim(dim, input.ndim)
    a = _values(input, "nanmedian")
    nans = np.isnan(a) if a.dtype.kind == "f" else np.zeros(a.shape, bool)
    order = np.argsort(np.where(nans, np.inf, a), axis=d, kind="stable")
    count = (~nans).sum(axis=d, keepdims=True)
    pos = np.maximum((count - 1) // 2, 0)
    idx = np.take_along_axis(order, pos, axis=d).astype(np.int64)
    i = input.new_tensor(idx, dtype=dt.int64)
    v = gather(input, d, i)
    return ValuesIndices(v if keepdim else _own(v.squeeze(d)), i if keepdim else _own(i.squeeze(d)))


def mode(input, dim=-1, keepdim=False):
    d = wrap_dim(dim, input.ndim)
    a = _values(input, "mode")
    if a.ndim == 0:
        return ValuesIndices(clone(input), input.new_tensor(0, dtype=dt.int64))
    moved = np.moveaxis(a, d, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    best = np.empty(flat.shape[0], np.int64)
    for r, row in enumerate(flat):
        values, counts = np.unique(row, return_counts=True)
        v = values[np.argmax(counts)]  # the smallest of the most frequent values
        best[r] = np.nonzero(row == v)[0][-1]  # torch reports the last index holding it
    idx = np.moveaxis(best.reshape(moved.shape[:-1] + (1,)), -1, d)
    i = input.new_tensor(idx, dtype=dt.int64)
    v = gather(input, d, i)
    return ValuesIndices(v if keepdim else _own(v.squeeze(d)), i if keepdim else _own(i.squeeze(d)))


@_amp.runs_in_float32
def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    if not input.dtype.is_floating_point:
        raise RuntimeError("quantile() input tensor must be either float or double dtype")
    qs = _values(q, "quantile") if is_tensor_like(q) else np.asarray(q, dtype=np.float64)
    if ((qs < 0) | (qs > 1)).any():
        raise RuntimeError("quantile() q values must be in the range [0, 1]")
    x = input.reshape(-1) if dim is None else input
    d = 0 if dim is None else wrap_dim(dim, input.ndim)
    n = x.shape[d]
    srt = sort(x, d).values
    outs = []
    for qv in np.atleast_1d(qs).reshape(-1):
        pos = float(qv) * (n - 1)
        lo, hi = int(math.floor(pos)), int(math.ceil(pos))
        frac_ = pos - lo
        if interpolation == "lower" or (interpolation == "nearest" and builtins.round(pos) == lo):
            hi, frac_ = lo, 0.0
        elif interpolation == "higher" or interpolation == "nearest":
            lo, frac_ = hi, 0.0
        elif interpolation == "midpoint":
            frac_ = 0.5 if hi != lo else 0.0
        elif interpolation != "linear":
            raise RuntimeError(f"quantile() interpolation must be one of linear, lower, higher, midpoint or nearest. "
                               f"Got {interpolation}")
        a, b = narrow(srt, d, lo, 1), narrow(srt, d, hi, 1)
        v = a + (b - a) * frac_ if frac_ else a
        outs.append(v if keepdim and dim is not None else v.squeeze(d))
    if dim is None and keepdim:
        outs = [o.reshape((1,) * input.ndim) for o in outs]
    if is_tensor_like(q) and q.ndim == 0 or not is_tensor_like(q) and np.ndim(q) == 0:
        return outs[0]
    return stack(outs, 0)


@_amp.runs_in_float32
def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    if not bool(isnan(input).any()):
        return quantile(input, q, dim, keepdim, interpolation=interpolation)
    raise NotImplementedError("nanquantile with nan values: runtime has quantile over values without nan only")


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    a = _values(input, "unique")
    if dim is None:
        values, inverse, counts = np.unique(a.reshape(-1), return_inverse=True, return_counts=True)
        inverse = inverse.reshape(a.shape)
    else:
        d = wrap_dim(dim, input.ndim)
        values, inverse, counts = np.unique(a, axis=d, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
    out = [input.new_tensor(values)]
    if return_inverse:
        out.append(input.new_tensor(inverse.astype(np.int64), dtype=dt.int64))
    if return_counts:
        out.append(input.new_tensor(counts.astype(np.int64), dtype=dt.int64))
    return out[0] if len(out) == 1 else tuple(out)


def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
    a = _values(input, "unique_consecutive")
    if dim is not None:
        d = wrap_dim(dim, input.ndim)
        moved = np.moveaxis(a, d, 0).reshape(a.shape[d], -1)
        change = np.ones(len(moved), bool)
        change[1:] = (moved[1:] != moved[:-1]).any(axis=1)
        values = np.moveaxis(np.moveaxis(a, d, 0)[change], 0, d)
    else:
        flat = a.reshape(-1)
        change = np.ones(flat.size, bool)
        change[1:] = flat[1:] != flat[:-1]
        values = flat[change]
    group = np.cumsum(change) - 1
    out = [input.new_tensor(values)]
    if return_inverse:
        out.append(input.new_tensor(group.reshape(a.shape if dim is None else -1).astype(np.int64), dtype=dt.int64))
    if return_counts:
        out.append(input.new_tensor(np.bincount(group, minlength=int(change.sum())).astype(np.int64),
                                    dtype=dt.int64))
    return out[0] if len(out) == 1 else tuple(out)


def bincount(input, weights=None, minlength=0):
    a = _values(input, "bincount")
    if a.ndim != 1 or input.dtype.is_floating_point:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if a.size and a.min() < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is None:
        return input.new_tensor(np.bincount(a, minlength=minlength).astype(np.int64), dtype=dt.int64)
    w = _values(weights, "bincount")
    out_dtype = weights.dtype if weights.dtype.is_floating_point else dt.float64
    return input.new_tensor(np.bincount(a, w, minlength=minlength), dtype=out_dtype)


def histc(input, bins=100, min=0, max=0):
    a = _values(input, "histc").astype(np.float64)
    lo, hi = float(min), float(max)
    if lo == hi and a.size:
        lo, hi = float(a.min()), float(a.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    counts, _ = np.histogram(a[(a >= lo) & (a <= hi)], bins=bins, range=(lo, hi))
    return input.new_tensor(counts.astype(input.dtype.np))


def histogram(input, bins=100, *, range=None, weight=None, density=False):
    a = _values(input, "histogram")
    edges_in = _values(bins, "histogram") if is_tensor_like(bins) else bins
    w = None if weight is None else _values(weight, "histogram")
    hist, edges = np.histogram(a, bins=edges_in, range=range, weights=w, density=density)
    return input.new_tensor(hist.astype(input.dtype.np)), input.new_tensor(edges.astype(input.dtype.np))


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None, sorter=None):
    seq = _values(sorted_sequence, "searchsorted")
    vals = _values(input, "searchsorted") if is_tensor_like(input) else np.asarray(input)
    side = side or ("right" if right else "left")
    if sorter is not None:
        seq = np.take_along_axis(seq, _values(sorter, "searchsorted"), axis=-1)
    if seq.ndim == 1:
        out = np.searchsorted(seq, vals, side=side)
    else:
        out = np.stack([np.searchsorted(s, v, side=side) for s, v in
                        zip(seq.reshape(-1, seq.shape[-1]), vals.reshape(-1, vals.shape[-1]))]).reshape(vals.shape)
    return sorted_sequence.new_tensor(np.asarray(out, dtype=np.int32 if out_int32 else np.int64),
                                      dtype=dt.int32 if out_int32 else dt.int64)


def bucketize(input, boundaries, *, out_int32=False, right=False):
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


def isin(elements, test_elements, *, assume_unique=False, invert=False):
    a = _values(elements, "isin") if is_tensor_like(elements) else np.asarray(elements)
    b = _values(test_elements, "isin") if is_tensor_like(test_elements) else np.asarray(test_elements)
    like = elements if is_tensor_like(elements) else test_elements
    return like.new_tensor(np.isin(a, b, invert=invert), dtype=dt.bool_)


# contractions

def dot(input, other):
    if input.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {input.ndim}D and {other.ndim}D tensors")
    if input.dtype is not other.dtype:
        raise RuntimeError(f"dot : expected both vectors to have same dtype, but found {input.dtype.name} and "
                           f"{other.dtype.name}")
    if input.shape[0] != other.shape[0]:
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{input.shape[0]}] and src [{other.shape[0]}] "
                           f"to have the same number of elements, but got {input.shape[0]} and {other.shape[0]} "
                           f"elements respectively")
    return (input * other).sum()


vdot = dot


def inner(input, other):
    if input.ndim == 0 or other.ndim == 0:
        return input * other
    return tensordot(input, other, ([-1], [-1]))


def outer(input, vec2):
    return input.reshape(-1, 1) * vec2.reshape(1, -1)


ger = outer


def mv(input, vec):
    if input.ndim != 2 or vec.ndim != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got {input.ndim}, {vec.ndim}")
    return matmul(input, vec)


def _scaled_sum(input, product, beta, alpha):
    out = product if alpha == 1 else product * alpha
    if beta == 0:  # as torch, input's values (nan included) are ignored
        return out
    return (input if beta == 1 else input * beta) + out


@rounds_bfloat16_once
def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    return _scaled_sum(input, mm(mat1, mat2), beta, alpha)


@rounds_bfloat16_once
def addmv(input, mat, vec, *, beta=1, alpha=1):
    return _scaled_sum(input, mv(mat, vec), beta, alpha)


@rounds_bfloat16_once
def addr(input, vec1, vec2, *, beta=1, alpha=1):
    return _scaled_sum(input, outer(vec1, vec2), beta, alpha)


@rounds_bfloat16_once
def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_sum(input, bmm(batch1, batch2), beta, alpha)


@rounds_bfloat16_once
def addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_sum(input, bmm(batch1, batch2).sum(0), beta, alpha)


def _sublist_equation(arguments) -> tuple:
    """(equation, operands) of einsum's sublist form: operands each followed by its dims' integers (0-51) or
    Ellipsis, then optionally the output's."""
    def letters(sublist) -> str:
        out = ""
        for d in sublist:
            if d is Ellipsis:
                out += "..."
                continue
            d = d.__index__() if hasattr(d, "__index__") else d  # ints, or an integer tensor's elements
            if isinstance(d, int) and 0 <= d < 52:
                out += chr(ord("a") + d) if d < 26 else chr(ord("A") + d - 26)
            else:
                raise ValueError(f"einsum(): subscript in subscript list is not within the valid range [0, 52), "
                                 f"got {d}")
        return out

    terms = []
    for k in range(0, len(arguments) - 1, 2):
        terms.append(letters(arguments[k + 1]))
    equation = ",".join(terms) + ("->" + letters(arguments[-1]) if len(arguments) % 2 else "")
    return equation, tuple(arguments[0:2 * len(terms):2])


def tensordot(a, b, dims=2):
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
        da, db = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    elif is_tensor_like(dims):
        pairs = dims.tolist()
        da, db = ([pairs[0]], [pairs[1]]) if isinstance(pairs[0], int) else (pairs[0], pairs[1])
    else:
        da, db = dims
        da, db = ([da], [db]) if isinstance(da, int) else (list(da), list(db))
    da, db = [wrap_dim(d, a.ndim) for d in da], [wrap_dim(d, b.ndim) for d in db]
    for x, y in zip(da, db):
        if a.shape[x] != b.shape[y]:
            raise RuntimeError(f"contracted dimensions need to match, but first has size {a.shape[x]} in dim {x} and "
                               f"second has size {b.shape[y]} in dim {y}")
    free_a = [d for d in range(a.ndim) if d not in da]
    free_b = [d for d in range(b.ndim) if d not in db]
    k = math.prod(a.shape[d] for d in da)
    left = permute(a, tuple(free_a + da)).reshape(math.prod(a.shape[d] for d in free_a), k)
    right = permute(b, tuple(db + free_b)).reshape(k, math.prod(b.shape[d] for d in free_b))
    return mm(left, right).reshape(tuple(a.shape[d] for d in free_a) + tuple(b.shape[d] for d in free_b))


def kron(input, other):
    nd = builtins.max(input.ndim, other.ndim)
    a = input.reshape((1,) * (nd - input.ndim) + tuple(input.shape))
    b = other.reshape((1,) * (nd - other.ndim) + tuple(other.shape))
    a = a.reshape(tuple(v for s in a.shape for v in (s, 1)))
    b = b.reshape(tuple(v for s in b.shape for v in (1, s)))
    return (a * b).reshape(tuple(x * y for x, y in zip(input.shape if input.ndim == nd else a.shape[::2],
                                                       other.shape if other.ndim == nd else b.shape[1::2])))


def cross(input, other, dim=None):
    if dim is None:
        shape = broadcast_shapes(input.shape, other.shape)
        dim = next((i for i, s in enumerate(shape) if s == 3), None)
        if dim is None:
            raise RuntimeError("no dimension of size 3 in input")
    x, y = broadcast_tensors(input, other)
    d = wrap_dim(dim, x.ndim)
    if x.shape[d] != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {d} must have length 3. Got {x.shape[d]} and "
                           f"{y.shape[d]}")
    a = [select(x, d, i) for i in range(3)]
    b = [select(y, d, i) for i in range(3)]
    return stack([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]], d)


def einsum(equation, *operands):
    """einsum as broadcast products and sums of primitives (no BLAS path); '...' and repeated indices included. The
    sublist form, einsum(x, [0, 1], y, [1, 2], [0, 2]), names the dims with integers (and Ellipsis)."""
    if not isinstance(equation, str):
        equation, operands = _sublist_equation((equation,) + operands)
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if _amp.state.dtype is not None and len(operands) > 1:  # NOTE: torch's runs as bmm, which autocast casts
        operands = _amp.autocast_inputs(None, operands)
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise RuntimeError("einsum(): more operands were provided than specified in the equation"
                           if len(operands) > len(terms) else
                           "einsum(): fewer operands were provided than specified in the equation")
    ell = builtins.max((t.ndim - len(s.replace("...", "")) for s, t in zip(terms, operands) if "..." in s), default=0)
    ell_letters = "".join(chr(0x100 + i) for i in range(ell))
    terms = [s.replace("...", ell_letters[len(ell_letters) - (t.ndim - len(s.replace("...", ""))):]) if "..." in s
             else s for s, t in zip(terms, operands)]
    if not arrow:
        counts = {}
        for s in terms:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        rhs = ell_letters + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell_letters))
    else:
        rhs = rhs.replace("...", ell_letters)
    letters = list(dict.fromkeys(rhs + "".join(terms)))
    aligned = []
    for s, t in zip(terms, operands):
        if len(s) != t.ndim:
            raise RuntimeError(f"einsum(): the number of subscripts in the equation ({len(s)}) does not match the "
                               f"number of dimensions ({t.ndim}) for operand {len(aligned)}")
        while len(set(s)) != len(s):  # a repeated index takes the diagonal
            c = next(c for c in s if s.count(c) > 1)
            i, j = s.index(c), s.index(c, s.index(c) + 1)
            t = diagonal(t, 0, i, j)
            s = s[:i] + s[i + 1:j] + s[j + 1:] + c
        order = sorted(range(len(s)), key=lambda k: letters.index(s[k]))
        t = permute(t, tuple(order)) if order != list(range(len(s))) else t
        present = [s[k] for k in order]
        shape = [1] * len(letters)
        for c, size in zip(present, t.shape):
            shape[letters.index(c)] = size
        aligned.append(t.reshape(tuple(shape)))
    prod_ = aligned[0]
    for t in aligned[1:]:
        prod_ = prod_ * t
    summed = tuple(i for i, c in enumerate(letters) if c not in rhs)
    out = prod_.sum(summed) if summed else prod_
    kept = [c for c in letters if c in rhs]
    order = tuple(kept.index(c) for c in rhs)
    return permute(out, order) if order != tuple(range(len(order))) else out


# norms and distances

def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    if isinstance(p, str):
        if p == "fro":
            return _vector_norm(input, 2, dim, keepdim)
        if p == "nuc":
            from .linalg import matrix_norm

            return matrix_norm(input, "nuc", (-2, -1) if dim is None else dim, keepdim)
        raise RuntimeError(f"norm: unsupported p {p!r}")
    return _vector_norm(input, 2 if p is None else p, dim, keepdim)


@rounds_bfloat16_once
def _vector_norm(x, ord, dim, keepdim):
    if not x.dtype.is_differentiable:
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got "
                           f"{x.dtype.name}")
    dims = wrap_dims(dim, x.ndim) if dim is not None else tuple(range(x.ndim))
    a = abs(x)
    if x.dtype.is_complex:  # the norm of the magnitudes
        x = a
    if ord == inf:
        return a.amax(dims, keepdim)
    if ord == -inf:
        return a.amin(dims, keepdim)
    if ord == 0:
        return (a != 0).to(a.dtype).sum(dims, keepdim)
    if ord == 1:
        return a.sum(dims, keepdim)
    if ord == 2:
        # NOTE: sqrt's gradient at 0 is inf * 0 = nan; torch's norm gives a zero subgradient there, so does this
        s = (x * x).sum(dims, keepdim)
        nz = s != 0
        return s.where(nz, 1.0).sqrt().where(nz, 0.0)
    return pow(pow(a, ord).sum(dims, keepdim), 1.0 / ord)


def dist(input, other, p=2):
    return _vector_norm(input - other, p, None, False)


@_amp.runs_in_float32
def cdist(x1, x2, p=2.0, compute_mode=None):
    if x1.ndim < 2 or x2.ndim < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: {x1.ndim}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
    diff_ = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    return _vector_norm(diff_, p, -1, False)


def renorm(input, p, dim, maxnorm):
    d = wrap_dim(dim, input.ndim)
    others = tuple(i for i in range(input.ndim) if i != d)
    norms = _vector_norm(input, p, others, True)
    factor = where(norms > maxnorm, maxnorm / (norms + 1e-7), 1.0)
    return input * factor


# statistics

def cov(input, *, correction=1, fweights=None, aweights=None):
    if not input.dtype.is_floating_point:
        input = input.to(dt.get_default_dtype())
    if input.ndim > 2:
        raise RuntimeError(f"cov(): expected input to have two or fewer dimensions but got an input with "
                           f"{input.ndim} dimensions")
    if fweights is not None or aweights is not None:
        raise NotImplementedError("cov(fweights=, aweights=) is not supported by runtime")
    x = input.reshape(1, -1) if input.ndim < 2 else input
    n = x.shape[1]
    centered = x - x.mean(1, keepdim=True)
    c = mm(centered, centered.t()) / builtins.max(n - correction, 0)
    return c.squeeze() if input.ndim < 2 else c


def corrcoef(input):
    c = cov(input)
    if c.ndim == 0:
        return c / c
    d = sqrt(diagonal(c))
    return clamp(c / d.unsqueeze(1) / d.unsqueeze(0), -1, 1)


def trapezoid(y, x=None, *, dx=None, dim=-1):
    d = wrap_dim(dim, y.ndim)
    n = y.shape[d]
    if n == 0:
        return y.sum(d)
    avg = (narrow(y, d, 1, n - 1) + narrow(y, d, 0, n - 1)) / 2
    if x is not None:
        xd = diff(x, dim=dim if x.ndim == y.ndim else -1)
        return (avg * xd).sum(d)
    return avg.sum(d) * (1 if dx is None else dx)


def cumulative_trapezoid(y, x=None, *, dx=None, dim=-1):
    d = wrap_dim(dim, y.ndim)
    n = y.shape[d]
    avg = (narrow(y, d, 1, n - 1) + narrow(y, d, 0, n - 1)) / 2
    if x is not None:
        avg = avg * diff(x, dim=dim if x.ndim == y.ndim else -1)
    elif dx is not None:
        avg = avg * dx
    return cumsum(avg, d)


def vander(x, N=None, increasing=False):
    n = x.shape[0] if N is None else N
    powers = x.new_tensor(np.arange(n) if increasing else np.arange(n - 1, -1, -1), dtype=dt.int64)
    base = x if x.dtype is not dt.bool_ else x.to(dt.int64)
    return pow(base.unsqueeze(1), powers.unsqueeze(0))


def logdet(input):
    from .linalg import slogdet

    sign_, logabs = slogdet(input)
    return where(sign_ < 0, math.nan, logabs)


def matrix_power(input, n):
    from .linalg import matrix_power as mp

    return mp(input, n)


def matrix_exp(input):
    from .linalg import matrix_exp as me

    return me(input)


def det(input):
    return apply("det", input)


def inverse(input):
    return apply("inv", input)


def slogdet(input):
    from .linalg import slogdet as sd

    return sd(input)


def unravel_index(indices, shape):
    a = _values(indices, "unravel_index") if is_tensor_like(indices) else np.asarray(indices)
    if np.issubdtype(a.dtype, np.floating):
        raise TypeError("expected 'indices' to be integer dtype, but got float")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    total = math.prod(shape)
    if a.size and (a.min() < -total or a.max() >= total):
        raise RuntimeError("'indices' must be in range [-prod(shape), prod(shape) - 1]")
    from .factories import tensor

    return tuple(tensor(c.astype(np.int64)) for c in np.unravel_index(np.where(a < 0, a + total, a), shape))


def combinations(input, r=2, with_replacement=False):
    import itertools

    n = input.shape[0]
    pick = itertools.combinations_with_replacement(range(n), r) if with_replacement else \
        itertools.combinations(range(n), r)
    idx = np.array(list(pick), dtype=np.int64).reshape(-1, r)
    if idx.shape[0] == 0:
        return input.new_zeros((0,) if r == 0 else (0, r))
    return stack([index_select(input, 0, input.new_tensor(idx[:, k], dtype=dt.int64)) for k in range(r)], 1)


def logspace(start, end, steps, base=10.0, *, dtype=None, device=None, requires_grad=False):
    from .factories import tensor

    values = np.logspace(start, end, steps, base=base)
    return tensor(values, dtype=dtype or dt.get_default_dtype(), requires_grad=requires_grad)


def scalar_tensor(s, *, dtype=None, device=None, requires_grad=False):
    from .factories import tensor

    return tensor(s, dtype=dtype or dt.get_default_dtype(), requires_grad=requires_grad)


def can_cast(from_, to):
    from_, to = dt.as_dtype(from_), dt.as_dtype(to)
    return from_.category <= to.category


def _window(name, values_fn):
    def window(window_length, periodic=True, *, dtype=None, device=None, requires_grad=False, **kw):
        from .factories import tensor

        if window_length < 0:
            raise RuntimeError(f"{name} requires non-negative window_length, got window_length={window_length}")
        if window_length <= 1:
            return tensor(np.ones(window_length), dtype=dtype or dt.get_default_dtype(), requires_grad=requires_grad)
        n = window_length + 1 if periodic else window_length
        values = values_fn(n, **kw)[:window_length]
        return tensor(values, dtype=dtype or dt.get_default_dtype(), requires_grad=requires_grad)

    window.__name__ = window.__qualname__ = name
    return window


hann_window = _window("hann_window", np.hanning)
hamming_window = _window("hamming_window", lambda n, alpha=0.54, beta=0.46: alpha - beta * np.cos(
    2 * np.pi * np.arange(n) / (n - 1)))
bartlett_window = _window("bartlett_window", np.bartlett)
blackman_window = _window("blackman_window", np.blackman)
kaiser_window = _window("kaiser_window", lambda n, beta=12.0: np.kaiser(n, beta))


def adjoint(input):
    return input.mT


def fill(input, value):
    return apply("full", like=input, shape=tuple(input.shape), value=value, dtype=input.dtype) \
        if not is_tensor_like(value) else expand(value.to(input.dtype), tuple(input.shape)) * 1


def frexp(input):
    from collections import namedtuple

    if not input.dtype.is_floating_point:
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    mantissa, exponent = np.frexp(_values(input, "frexp"))
    pair = namedtuple("frexp", ["mantissa", "exponent"])
    return pair(input.new_tensor(mantissa), input.new_tensor(exponent.astype(np.int32), dtype=dt.int32))


def i0(input):
    return apply("i0", input)


def mvlgamma(input, p):
    if p < 1:
        raise RuntimeError("p has to be greater than or equal to 1")
    total = lgamma(input)
    for j in range(1, p):
        total = total + lgamma(input - j / 2)
    return total + p * (p - 1) / 4 * math.log(math.pi)


def index_reduce(input, dim, index, source, reduce, *, include_self=True):
    d = wrap_dim(dim, input.ndim)
    shape = [1] * source.ndim
    shape[d] = source.shape[d]
    full_index = expand(index.reshape(tuple(shape)), tuple(source.shape))
    return scatter_reduce(input, d, full_index.contiguous() if _is_eager(full_index) else full_index, source, reduce,
                          include_self=include_self)


def bernoulli(input, p=None, *, generator=None):
    """0/1 draws, each 1 with probability input (or p), in input's dtype."""
    probs = _values(input, "bernoulli") if p is None else (p if not is_tensor_like(p) else _values(p, "bernoulli"))
    probs = np.broadcast_to(probs, tuple(input.shape))
    if np.any((probs < 0) | (probs > 1)):
        raise RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.")
    draws = rng(generator).random(tuple(input.shape)) < probs
    return input.new_tensor(draws.astype(input.dtype.np))


def poisson(input, generator=None):
    lam = _values(input, "poisson")
    if np.any(lam < 0):
        raise RuntimeError("invalid Poisson rate, expected rate to be non-negative")
    return input.new_tensor(np.asarray(rng(generator).poisson(lam)).astype(input.dtype.np))


def binomial(count, prob, generator=None):
    n, q = _values(count, "binomial"), _values(prob, "binomial")
    return count.new_tensor(np.asarray(rng(generator).binomial(n.astype(np.int64), q)).astype(count.dtype.np))


def normal(mean, std=1.0, size=None, *, generator=None, dtype=None, device=None, requires_grad=False):
    """normal(mean, std) with tensor or number arguments (broadcast), or normal(mean, std, size) with numbers."""
    from .factories import tensor

    gen = rng(generator)
    if is_tensor_like(mean) or is_tensor_like(std):
        like = mean if is_tensor_like(mean) else std
        m = _values(mean, "normal") if is_tensor_like(mean) else mean
        s = _values(std, "normal") if is_tensor_like(std) else std
        if np.any(np.asarray(s) < 0):
            raise RuntimeError("normal expects all elements of std >= 0.0")
        shape = np.broadcast_shapes(np.shape(m), np.shape(s)) if size is None else tuple(size)
        return like.new_tensor((m + s * gen.standard_normal(shape)).astype(like.dtype.np))
    if size is None:
        raise TypeError("normal() with a number mean and std needs a size")
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    values = mean + std * gen.standard_normal(size_args((size,)))
    return tensor(values, dtype=dtype or dt.get_default_dtype(), requires_grad=requires_grad)


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
METHODS.update({f.__name__: f for f in map(_conversion, ("float32", "float64", "float16", "bfloat16", "int64", "int32",
                                                         "int16", "int8", "uint8", "bool_", "complex64",
                                                         "complex128"))})
METHODS.update(type_as=type_as, multiply=mul, subtract=sub, divide=div, true_divide=div, greater=gt, less=lt,
               greater_equal=ge, less_equal=le, not_equal=ne)
METHODS.update({name: globals()[name] for name in """
    tan asin acos atan sinh cosh asinh acosh atanh arcsin arccos arctan arcsinh arccosh arctanh expm1 erfc erfinv
    lgamma digamma trunc fix atan2 arctan2 fmod copysign nextafter heaviside gcd lcm bitwise_left_shift
    bitwise_right_shift exp2 frac sgn signbit hypot logaddexp logaddexp2 xlogy ldexp float_power logit sinc deg2rad
    rad2deg fmax fmin clamp_min clamp_max positive isneginf isposinf isreal nan_to_num count_nonzero aminmax nansum
    nanmean cumsum cumprod logcumsumexp cummax cummin diff flip fliplr flipud roll rot90 movedim moveaxis swapdims
    ravel tile repeat_interleave tensor_split hsplit vsplit dsplit split_with_sizes diagonal diag_embed diag diagflat
    trace narrow_copy take unfold scatter scatter_reduce index_add index_copy index_fill masked_select masked_scatter
    select_scatter slice_scatter diagonal_scatter nonzero argwhere sort argsort msort kthvalue median nanmedian mode
    quantile nanquantile unique unique_consecutive bincount histc histogram dot vdot inner outer ger mv addmm addmv
    addr baddbmm addbmm kron cross norm dist renorm cov corrcoef logdet matrix_power matrix_exp det inverse slogdet
    adjoint frexp i0 mvlgamma index_reduce bernoulli index_put geqrf
    is_complex is_conj conj conj_physical resolve_conj resolve_neg angle stft istft
""".split()})
METHODS.update(polygamma=lambda self, n: polygamma(n, self), is_signed=is_signed, is_nonzero=is_nonzero)
# torch.* functions that are not Tensor methods
FUNCTIONS = {name: globals()[name] for name in """
    broadcast_shapes broadcast_tensors meshgrid cartesian_prod atleast_1d atleast_2d atleast_3d hstack vstack dstack
    column_stack tril_indices triu_indices block_diag std_mean var_mean einsum tensordot cdist searchsorted bucketize
    isin trapezoid cumulative_trapezoid vander unravel_index combinations logspace scalar_tensor can_cast
    hann_window hamming_window bartlett_window blackman_window kaiser_window polygamma fill poisson binomial normal
    real imag view_as_real view_as_complex complex polar
""".split()}
# in-place Tensor methods: self = f(self, ...) (Tensor._inplace_composite), where Tensor has no faster one
INPLACE = """
    abs absolute acos acosh asin asinh atan atanh arccos arccosh arcsin arcsinh arctan arctanh atan2 arctan2 ceil cos
    cosh sin sinh tan erf erfc erfinv exp2 expm1 floor frac trunc fix log log10 log1p log2 lgamma digamma reciprocal
    rsqrt round sign sgn square neg negative fmod remainder copysign nextafter heaviside gcd lcm hypot ldexp
    float_power logit sinc deg2rad rad2deg xlogy floor_divide true_divide divide multiply subtract clamp_min clamp_max
    nan_to_num cumsum cumprod logical_and logical_or logical_xor logical_not bitwise_and bitwise_or bitwise_xor
    bitwise_not bitwise_left_shift bitwise_right_shift eq ne lt le gt ge greater greater_equal less less_equal
    not_equal scatter scatter_add scatter_reduce index_add index_copy index_fill masked_scatter renorm addmm addmv addr
    baddbmm addbmm polygamma i0 mvlgamma index_reduce index_put
""".split()


def _where_method(self, condition, y):
    return where(condition, self, y)


METHODS["where"] = _where_method


def _equality(fn):
    """== or != as torch's: against None, a string or a container Python's own answer (NotImplemented, then
    identity), so that `t == None` is False and `t in [None, "auto"]` works; elementwise against the rest."""

    def compare(self, other):
        if other is None or isinstance(other, (str, list, tuple, dict, set)):
            return NotImplemented
        return fn(self, other)

    compare.__name__ = fn.__name__
    return compare


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
    "__eq__": _equality(eq), "__ne__": _equality(ne), "__lt__": lt, "__le__": le, "__gt__": gt, "__ge__": ge,
    "__lshift__": bitwise_left_shift, "__rlshift__": _reflected(bitwise_left_shift),
    "__rshift__": bitwise_right_shift, "__rrshift__": _reflected(bitwise_right_shift),
    "__neg__": neg, "__abs__": abs, "__invert__": bitwise_not, "__getitem__": getitem,
    "__pos__": lambda self: self,
}
