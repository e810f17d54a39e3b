"""The one op table: every primitive op declared once (kind, numpy forward, scalar template,
derivative rules written with ops, shape and dtype rules), plus `apply`, the generic dispatcher.

Derivative rules receive `(g, out, *inputs, **attrs)` and use only tensor methods and `apply`, so the
same rule builds eager tensors (runtime autograd) or graph nodes (nnc's autodiff pass).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from . import _philox, _winograd as _wg, dtypes as dt
from ._special import erf as _np_erf


class Kind:
    """Op kinds, the vocabulary passes use instead of op names."""

    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    SHAPE = "shape"
    OTHER = "other"


class ShapeError(RuntimeError):
    """Input shapes that an op cannot combine; the message names the op and the shapes."""


class DataDependentShape(Exception):
    """The output shape depends on tensor values (a boolean mask index), not only on input shapes."""


@dataclass(frozen=True)
class Reducer:
    """How a reduction folds values into one: what a code generator needs to accumulate it.

    combine: a scalar template of the accumulator {0} and a value {1} (both already in the accumulator's dtype),
      in the language of elementwise templates, giving the new accumulator: "({0} + {1})", "max({0}, {1})".
    identity: identity(numpy dtype) -> the accumulator's start value.
    accumulator: accumulator(input numpy dtype, output numpy dtype) -> the accumulator's numpy dtype.
    block: how a block of values may be reduced out of order (in vector lanes): "fold" (the combine reassociates),
      "max" / "min" (lanes keep the greater / lesser; a nan is checked apart, as numpy's max propagates it),
      "all" / "any" (the true values counted), or None (in order only).
    additive: the combine adds, so spans of values may be summed in their own dtype before they are widened to the
      accumulator's (the error of a span's sum is bounded by its length).
    """

    combine: str
    identity: Callable
    accumulator: Callable
    block: str | None = None
    additive: bool = False


@dataclass(frozen=True)
class OpDef:
    """One primitive op. `vjp[i]` is the derivative rule for input i (None: not differentiable)."""

    name: str
    kind: str
    arity: int | None  # None: variadic (cat)
    forward: Callable
    shape_rule: Callable
    dtype_rule: Callable
    template: str | None = None
    vjp: tuple = ()
    saves: tuple = ()  # what the rules read: "out" and/or input positions (for freeing, autodiff)
    is_view: bool = False  # output may alias input 0's memory
    cast_inputs: tuple | None = None  # inputs cast to the compute dtype (None: all of them)
    attr_names: tuple = field(default=())
    # The same value written with other primitives (tensor methods, as the rules are). A fused op eager runs
    # in one dispatch has one; nnc's decompose expands it, so the compiler sees only the primitives it fuses.
    decomposition: Callable | None = None
    # Reductions that code generation can accumulate (nnc fuses them with their prologues and epilogues).
    reducer: Reducer | None = None
    # noop(in_shape, in_dtype, out_shape, out_dtype, attrs) -> whether a call returns its first input unchanged
    # (nnc's remove_noops drops those calls). Shapes are tuples; either shape or dtype may be None (unknown).
    noop: Callable | None = None
    # Integer division: the input position whose zero raises torch's ZeroDivisionError for integer dtypes (the
    # forward checks it; nnc runs such nodes with integer dtypes through the interpreter, which does too).
    divisor: int | None = None
    # A kind-other op that code generation runs as a kernel of its own, of this kernel kind (nnc.codegen.cpu's
    # SKELETONS: "window" for the sliding-window gathers and scatters of convolution and pooling), not opaquely.
    kernel_kind: str | None = None
    # The op draws from runtime's random generator (`random_seed`): each call gives a new value, so compilers
    # must never fold, merge or cache a call of it.
    draws_random: bool = False
    # An elementwise op whose value also depends on its element's flat (row-major) index in its output (the
    # counter-based random draws): code generators pass that index as one more operand, after the op's own.
    needs_index: bool = False
    # A view whose result is its input broadcast to the result's shape (numpy broadcasting): an elementwise op that
    # reads it may read the input instead (nnc's fold_broadcasts), since elementwise ops broadcast their inputs.
    broadcasts: bool = False

    def is_noop(self, in_shape, in_dtype, out_shape, out_dtype, attrs) -> bool:
        """Whether a call with these input and result shapes/dtypes and attributes returns its input unchanged."""
        return self.noop is not None and bool(self.noop(in_shape, in_dtype, out_shape, out_dtype, attrs))

    @property
    def differentiable(self) -> bool:
        return any(rule is not None for rule in self.vjp)

    def vjp_rule(self, i: int):
        """The derivative rule for input i, or None."""
        if self.arity is None:
            rule = self.vjp[0]
            return lambda g, out, *inputs, **attrs: rule(g, out, *inputs, index=i, **attrs)
        return self.vjp[i] if i < len(self.vjp) else None

    def infer(self, *operands, **attrs):
        """(shape, dtype) of the result from operands' .shape/.dtype (or Python scalars)."""
        compute_dtype, out_dtype = self.dtype_rule(self, operands, attrs)
        if out_dtype.category == dt.COMPLEX or compute_dtype is not None and compute_dtype.category == dt.COMPLEX:
            check_complex(self)
        shapes = [_shape_of(x) for x in operands]
        dtypes = [x.dtype if is_tensor_like(x) else None for x in operands]
        return tuple(self.shape_rule(self, shapes, attrs, dtypes)), out_dtype

    def __repr__(self) -> str:
        return f"<op {self.name} ({self.kind})>"


OPS: dict[str, OpDef] = {}


def _register(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is declared twice")
    OPS[op.name] = op
    return op


# ---------------------------------------------------------------------------------------------
# Dispatch: the same entry point for eager tensors and (later) graph proxies.
# ---------------------------------------------------------------------------------------------

_default_handler = None  # the eager Tensor class, registered by runtime.tensor


def set_default_handler(cls) -> None:
    global _default_handler
    _default_handler = cls


def apply(name: str, *inputs, like=None, **attrs):
    """Run primitive `name` on inputs with the handler of the first tensor-like input.

    `like` picks the handler when no input is tensor-like (ops with no inputs, such as full).
    """
    op = OPS[name]
    if inputs and type(inputs[0]) is _default_handler:  # the eager handler defers to foreign inputs itself
        return _default_handler._apply_op(op, inputs, attrs)
    if not inputs and type(like) is _default_handler and like.is_cuda:  # a new tensor on like's device
        return _default_handler._apply_device_op(op, attrs)
    handler = type(like) if like is not None else None
    for x in inputs:
        if getattr(type(x), "_apply_op", None) is not None:
            handler = type(x)
            if handler is not _default_handler:
                break
    return (handler or _default_handler)._apply_op(op, inputs, attrs)


def is_tensor_like(x) -> bool:
    return getattr(type(x), "_apply_op", None) is not None


# ---------------------------------------------------------------------------------------------
# Shape rules: (op, shapes, attrs) -> output shape. Scalars have shape ().
# ---------------------------------------------------------------------------------------------

def _shape_of(x):
    return tuple(x.shape) if is_tensor_like(x) else ()


def _fmt(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def broadcast_shapes(*shapes) -> tuple:
    """numpy/torch broadcasting, with torch's error message."""
    ndim = max((len(s) for s in shapes), default=0)
    out, owner = [1] * ndim, [0] * ndim
    for k, shape in enumerate(shapes):
        for i, size in enumerate(shape):
            axis = ndim - len(shape) + i
            if out[axis] == 1:
                out[axis], owner[axis] = size, k
            elif size != 1 and size != out[axis]:
                a = owner[axis]
                raise ShapeError(
                    f"The size of tensor {_letter(a)} ({out[axis]}) must match the size of tensor "
                    f"{_letter(k)} ({size}) at non-singleton dimension {axis}; "
                    f"shapes: {', '.join(_fmt(s) for s in shapes)}")
    return tuple(out)


def _letter(i: int) -> str:
    return "abcdefgh"[i] if i < 8 else str(i)


def _broadcast_rule(op, shapes, attrs, dtypes):
    try:
        return broadcast_shapes(*shapes)
    except ShapeError as e:
        raise ShapeError(f"{op.name}: {e}") from None


def _same_shape_rule(op, shapes, attrs, dtypes):
    return shapes[0]


def reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def _reduce_rule(op, shapes, attrs, dtypes):
    shape, dims = shapes[0], attrs["dims"]
    for d in dims:
        if not 0 <= d < max(len(shape), 1):
            raise IndexError(f"{op.name}: dimension {d} out of range for a tensor of shape {_fmt(shape)}")
    return reduced_shape(shape, dims, attrs.get("keepdim", False))


def _extremum_rule(op, shapes, attrs, dtypes):
    for d in attrs["dims"]:
        if d < len(shapes[0]) and shapes[0][d] == 0:
            raise IndexError(f"{op.name}(): Expected reduction dim {d} to have non-zero size.")
    return _reduce_rule(op, shapes, attrs, dtypes)


def _arg_reduce_rule(op, shapes, attrs, dtypes):
    dim = attrs["dim"]
    if dim is None:
        return (1,) * len(shapes[0]) if attrs.get("keepdim") else ()
    return reduced_shape(shapes[0], (dim,), attrs.get("keepdim", False))


def _topk_rule(op, shapes, attrs, dtypes):
    shape = list(shapes[0])
    shape[attrs["dim"]] = attrs["k"]
    return tuple(shape)


def _matmul_rule(op, shapes, attrs, dtypes):
    a, b = shapes
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matmul: primitive needs 2-D or batched inputs, got {_fmt(a)} and {_fmt(b)}")
    if a[-1] != b[-2]:
        raise ShapeError(f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, a[-2:]))} and "
                         f"{'x'.join(map(str, b[-2:]))}); full shapes {_fmt(a)} @ {_fmt(b)}")
    try:
        batch = broadcast_shapes(a[:-2], b[:-2])
    except ShapeError:
        raise ShapeError(f"matmul: batch dimensions of {_fmt(a)} and {_fmt(b)} do not broadcast") from None
    return batch + (a[-2], b[-1])


def _linear_rule(op, shapes, attrs, dtypes):
    x, w = shapes
    if len(w) != 2 or not x or x[-1] != w[1]:
        rows = math.prod(x[:-1]) if len(x) > 1 else 1
        raise ShapeError(f"mat1 and mat2 shapes cannot be multiplied ({rows}x{x[-1] if x else 0} and "
                         f"{'x'.join(map(str, w[::-1]))}); input {_fmt(x)}, weight {_fmt(w)}")
    return x[:-1] + (w[0],)


def _reshape_rule(op, shapes, attrs, dtypes):
    shape, target = shapes[0], attrs["shape"]
    if math.prod(shape) != math.prod(target):
        raise ShapeError(f"shape '{_fmt(target)}' is invalid for input of size {math.prod(shape)}")
    return target


def _permute_rule(op, shapes, attrs, dtypes):
    shape, dims = shapes[0], attrs["dims"]
    if sorted(dims) != list(range(len(shape))):
        raise ShapeError(f"permute: dims {list(dims)} are not a permutation of the {len(shape)} dims "
                         f"of a tensor of shape {_fmt(shape)}")
    return tuple(shape[d] for d in dims)


def _expand_rule(op, shapes, attrs, dtypes):
    shape, target = shapes[0], attrs["shape"]
    lead = len(target) - len(shape)
    ok = lead >= 0 and all(s == t or s == 1 for s, t in zip(shape, target[lead:]))
    if not ok:
        raise ShapeError(f"The expanded size of the tensor ({_fmt(target)}) must match the existing size "
                         f"({_fmt(shape)}) at each non-singleton dimension")
    return target


def _cat_rule(op, shapes, attrs, dtypes):
    dim, first = attrs["dim"], shapes[0]
    for k, s in enumerate(shapes):
        if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first)) if i != dim):
            raise ShapeError(f"cat: sizes of tensors must match except in dimension {dim}; tensor 0 has "
                             f"shape {_fmt(first)} and tensor {k} has shape {_fmt(s)}")
    return first[:dim] + (sum(s[dim] for s in shapes),) + first[dim + 1:]


def _getitem_rule(op, shapes, attrs, dtypes):
    if any(d is dt.bool_ for d in dtypes[1:]):
        raise DataDependentShape(f"{op.name}: indexing with a boolean mask gives a data-dependent shape")
    if not _all_ints((shapes, attrs["key"])):
        return _index_shape(shapes[0], attrs["key"], shapes[1:])  # symbolic sizes (a compiler's) stay symbolic
    index_arrays = [np.zeros(s, dtype=np.int64) for s in shapes[1:]]
    dummy = np.broadcast_to(np.empty((), dtype=np.int8), shapes[0])
    try:
        return dummy[decode_key(attrs["key"], index_arrays)].shape
    except IndexError as e:
        message = str(e).replace("axis", "dimension")
        where = f"index {describe_key(attrs['key'])} on a tensor of shape {_fmt(shapes[0])}"
        raise IndexError(f"{message} ({where})") from None


def _all_ints(value) -> bool:
    """Whether a shape or key holds only Python ints (no compiler's symbolic sizes), nested."""
    if isinstance(value, (tuple, list)):
        return all(_all_ints(v) for v in value)
    return value is None or isinstance(value, (int, str))


def _index_shape(shape, key, index_shapes) -> tuple:
    """The shape indexing gives, in Python arithmetic (which sizes a compiler keeps symbolic take part in): numpy's
    rules for ints, slices with a positive step, None, ... and integer index tensors (broadcast together; in place of
    the dims they index when they are adjacent in the key, else first)."""
    consumed = sum(1 for item in key if item[0] in ("slice", "int", "tensor"))
    if consumed > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)} (index {describe_key(key)})")
    advanced = [i for i, item in enumerate(key) if item[0] == "tensor" or (index_shapes and item[0] == "int")]
    indexed = broadcast_shapes(*index_shapes) if index_shapes else ()
    out, d, placed = [], 0, False
    for i, item in enumerate(key):
        tag = item[0]
        if tag == "ellipsis":
            out.extend(shape[d:d + len(shape) - consumed])
            d += len(shape) - consumed
        elif tag == "none":
            out.append(1)
        elif tag == "int" and not index_shapes:
            if not -shape[d] <= item[1] < shape[d]:
                raise IndexError(f"index {item[1]} is out of bounds for dimension {d} with size {shape[d]}")
            d += 1
        elif i in advanced:
            if not placed and advanced == list(range(advanced[0], advanced[-1] + 1)):
                out.extend(indexed)
            placed = True
            d += 1
        else:
            out.append(_slice_length(shape[d], *item[1:]))
            d += 1
    out.extend(shape[d:])
    if advanced and advanced != list(range(advanced[0], advanced[-1] + 1)):
        out = list(indexed) + out
    return tuple(out)


def _slice_length(size, start, stop, step):
    step = 1 if step is None else step
    if step == 0:
        raise ValueError("step must be greater than zero")
    if step < 0:  # only runtime's own keys (flip); a user's negative step is refused with torch's error before this
        return _reversed_slice_length(size, start, stop, step)

    def clamp(bound, default):
        if bound is None:
            return default
        if bound < 0:
            bound = bound + size
            return bound if bound > 0 else 0
        return bound if bound <= size else size

    length = clamp(stop, size) - clamp(start, 0)
    return (length + step - 1) // step if length > 0 else 0


def _reversed_slice_length(size, start, stop, step):
    """len(range(size)[start:stop:step]) for a negative step, as Python counts it."""
    def clamp(bound, default):
        if bound is None:
            return default
        if bound < 0:
            bound = bound + size
            return bound if bound >= 0 else -1
        return bound if bound < size else size - 1

    length = clamp(start, size - 1) - clamp(stop, -1)
    return (length - step - 1) // -step if length > 0 else 0


def _gather_rule(op, shapes, attrs, dtypes):
    x, index = shapes[0], shapes[1]
    if len(x) != len(index):
        raise ShapeError(f"gather: index {_fmt(index)} must have as many dims as input {_fmt(x)}")
    return index


def _first_input_rule(op, shapes, attrs, dtypes):
    return shapes[0]


def _nll_rule(op, shapes, attrs, dtypes):
    return shapes[1] if attrs["reduction"] == "none" else ()


def _second_input_rule(op, shapes, attrs, dtypes):
    return shapes[1]


def _full_rule(op, shapes, attrs, dtypes):
    return tuple(attrs["shape"])


def _arange_rule(op, shapes, attrs, dtypes):
    """Integer start, end and step (a compiler's symbolic sizes among them): ceil((end - start) / step) values."""
    if attrs["step"] == 0:
        raise RuntimeError("arange: step must be nonzero")
    count = -(-(attrs["end"] - attrs["start"]) // attrs["step"])
    return (count if count > 0 else 0,)


# ---------------------------------------------------------------------------------------------
# Dtype rules: (op, operands, attrs) -> (compute dtype or None, output dtype).
# Operands are tensor-likes (with .dtype and .ndim) or Python scalars.
# ---------------------------------------------------------------------------------------------

_SCALAR_TYPES = (bool, int, float, complex)


def result_type(operands) -> dt.dtype:
    """torch's promotion: dimensioned tensors > zero-dim tensors > Python scalars (by category)."""
    dim_t = zero_t = None
    scalar_cat = -1
    for x in operands:
        if type(x) in _SCALAR_TYPES:
            scalar_cat = max(scalar_cat, dt.scalar_category(x))
        elif x is not None:
            try:
                d = x.dtype
            except AttributeError:  # NOTE: checked only here, off eager dispatch's path for tensors
                if not getattr(type(x), "symbolic_size", False):
                    raise
                scalar_cat = max(scalar_cat, dt.INT)  # a compiler's symbolic size: a Python int, unknown yet
                continue
            if x.ndim:
                dim_t = d if dim_t is None or dim_t is d else dt.promote_types(dim_t, d)
            else:
                zero_t = d if zero_t is None or zero_t is d else dt.promote_types(zero_t, d)
    result = dim_t
    if zero_t is not None and (result is None or zero_t.category > result.category):
        complex_over_float = result is not None and zero_t.category == dt.COMPLEX and result.category == dt.FLOAT
        result = result.to_complex() if complex_over_float else zero_t  # float32 and a complex128 0-dim: complex64
    if result is None or scalar_cat > result.category:
        if scalar_cat == dt.COMPLEX and result is not None and result.category == dt.FLOAT:
            return result.to_complex()  # a float64 tensor times 1j is complex128, as in torch
        result = dt.default_for_category(max(scalar_cat, 0))
    return result


def _promote(op, operands, attrs):
    t = result_type(operands)
    return t, t


def _to_float(op, operands, attrs):
    t = result_type(operands)
    if not t.is_differentiable:
        t = dt.get_default_dtype()
    return t, t


def _compare(op, operands, attrs):
    return result_type(operands), dt.bool_


def _logical(op, operands, attrs):
    return None, dt.bool_


def _keep(op, operands, attrs):
    return None, operands[0].dtype


def _sum_dtype(op, operands, attrs):
    d = operands[0].dtype
    return None, (d if d.is_differentiable else dt.int64)


def _same_required(op, operands, attrs):
    a, b = operands[0].dtype, operands[1].dtype
    if a is not b:
        raise RuntimeError(f"{op.name}: expected both operands to have the same dtype, but got {a} != {b}")
    return None, a


def _where_dtype(op, operands, attrs):
    cond = operands[0]
    if cond.dtype is not dt.bool_:
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor with dtype {cond.dtype}")
    t = result_type(operands[1:])
    return t, t


def _clamp_dtype(op, operands, attrs):
    t = result_type((operands[0], attrs["min"], attrs["max"]))
    return t, t


def _no_bool(rule, what):
    """Wrap a dtype rule so bool operands give torch's error (bool tensors have no - or negation)."""

    def checked(op, operands, attrs):
        if any(x is not None and (type(x) is bool or (is_tensor_like(x) and x.dtype is dt.bool_)) for x in operands):
            raise RuntimeError(f"{what}, the `-` operator, with a bool tensor is not supported. "
                               f"If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")
        return rule(op, operands, attrs)

    return checked


def _integral(op, operands, attrs):
    for x in operands:
        if is_tensor_like(x) and x.dtype.is_differentiable or type(x) in (float, complex):
            kind = x.dtype if is_tensor_like(x) else "float"
            raise TypeError(f"{op.name}: expected integer or bool tensors, got {kind}")
    return _promote(op, operands, attrs)


def _arg_dtype(op, operands, attrs):
    if operands[0].dtype.is_complex:
        raise RuntimeError(f"{op.name}(): does not support complex input, which has no order")
    if operands[0].dtype is dt.bool_:
        raise RuntimeError(f"{op.name}(): does not support bool input")
    return None, dt.int64


def _order_dtype(op, operands, attrs):
    """int64 positions of a sort, which orders bools as torch does, but not complex numbers (they have no order)."""
    if operands[0].dtype.is_complex:
        raise RuntimeError(f"{op.name}(): does not support complex input, which has no order")
    return None, dt.int64


def _cast_dtype(op, operands, attrs):
    return None, attrs["dtype"]


def _full_dtype(op, operands, attrs):
    return None, attrs["dtype"]


def _gather_dtype(op, operands, attrs):
    index = operands[1]
    if index.dtype is not dt.int64:
        raise TypeError(f"{op.name}(): Expected dtype int64 for index, got {index.dtype}")
    return None, operands[0].dtype


def _scatter_dtype(op, operands, attrs):
    _gather_dtype(op, operands, attrs)
    return operands[0].dtype, operands[0].dtype


def _nll_dtype(op, operands, attrs):
    target = operands[1]
    if target.dtype.is_floating_point or target.dtype is dt.bool_:
        raise TypeError(f"{op.name}(): expected an integer class-index target, got {target.dtype}")
    return None, operands[0].dtype


def _nll_backward_dtype(op, operands, attrs):
    return None, operands[1].dtype


def _index_put_dtype(op, operands, attrs):
    return operands[0].dtype, operands[0].dtype


def _cat_dtype(op, operands, attrs):
    t = result_type(operands)
    return t, t


# ---------------------------------------------------------------------------------------------
# Index keys: getitem / index_put keys as hashable tuples; tensor indices are op inputs.
# ---------------------------------------------------------------------------------------------

def decode_key(key, index_arrays):
    """Turn an encoded key back into a numpy index, taking index arrays in order."""
    out = []
    for item in key:
        tag = item[0]
        if tag == "slice":
            out.append(slice(item[1], item[2], item[3]))
        elif tag == "int":
            out.append(item[1])
        elif tag == "none":
            out.append(None)
        elif tag == "ellipsis":
            out.append(Ellipsis)
        else:  # ("tensor", k)
            out.append(index_arrays[item[1]])
    return tuple(out)


def describe_key(key) -> str:
    parts = []
    for item in key:
        tag = item[0]
        if tag == "slice":
            parts.append(":".join("" if v is None else str(v) for v in item[1:]).rstrip(":") or ":")
        elif tag == "int":
            parts.append(str(item[1]))
        elif tag == "none":
            parts.append("None")
        elif tag == "ellipsis":
            parts.append("...")
        else:
            parts.append(f"<tensor {item[1]}>")
    return "[" + ", ".join(parts) + "]"


# ---------------------------------------------------------------------------------------------
# numpy forwards that are more than a single numpy call.
# ---------------------------------------------------------------------------------------------

def _quiet(fn):
    """Wrap a numpy function so nan/inf results come without numpy warnings, as in torch."""

    def quiet(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    quiet.__name__ = getattr(fn, "__name__", "quiet")
    return quiet


def _np_sigmoid(x):
    if x.dtype.kind == "c":
        return 1 / (1 + np.exp(-x))
    # NOTE: split by sign so exp never overflows: 1/(1+e^-x) for x>=0, e^x/(1+e^x) for x<0.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def _np_where(cond, x, y):
    """np.where, with a fast path for where(mask, x, 0): relu's gradient and masked gradients."""
    if type(y) in (int, float) and y == 0 and type(x) is np.ndarray and x.shape == cond.shape \
            and x.dtype.kind == "f":
        # NOTE: a multiply by the mask is ~3x faster than np.where on a random mask. It differs only
        # where x is inf or nan (0 * inf = nan), so any nan falls back to np.where; adding 0.0 turns
        # the -0.0 of negative x * False into the +0.0 that where gives.
        with np.errstate(invalid="ignore"):
            out = np.multiply(x, cond)
        if not np.isnan(out).any():
            out += 0.0
            return out
    return np.where(cond, x, y)


def _np_sign(x):
    return x.copy() if x.dtype == np.bool_ else np.sign(x)


def _np_relu(x):
    return np.maximum(x, 0)


def _np_rsqrt(x):
    return 1 / np.sqrt(x)


def _np_sum(x, dims, keepdim):
    acc = np.float32 if x.dtype == np.float16 else (np.int64 if x.dtype.kind in "biu" else None)
    return x.sum(axis=dims, keepdims=keepdim, dtype=acc)


def _np_prod(x, dims, keepdim):
    acc = np.float32 if x.dtype == np.float16 else (np.int64 if x.dtype.kind in "biu" else None)
    return x.prod(axis=dims, keepdims=keepdim, dtype=acc)


def _np_amax(x, dims, keepdim):
    return x.max(axis=dims, keepdims=keepdim)


def _np_amin(x, dims, keepdim):
    return x.min(axis=dims, keepdims=keepdim)


def _np_all(x, dims, keepdim):
    return x.all(axis=dims, keepdims=keepdim)


def _np_any(x, dims, keepdim):
    return x.any(axis=dims, keepdims=keepdim)


def _arg_reduce(np_fn):
    def forward(x, dim, keepdim):
        if dim is None:
            out = np_fn(x.reshape(-1))
            return np.reshape(out, (1,) * x.ndim) if keepdim else np.asarray(out)
        out = np_fn(x, axis=dim)
        return np.expand_dims(out, dim) if keepdim else out

    return forward


def _np_topk_indices(a, k, dim, largest):
    """Indices of the k largest (or smallest) entries along dim, best first; nan counts as the largest."""
    n = a.shape[dim]
    if 0 < k < n:  # O(n) selection, then a sort of the k chosen only
        idx = np.argpartition(a, n - k if largest else k - 1, axis=dim)
    else:
        idx = np.argsort(a, axis=dim)
    idx = np.take(idx, np.arange(n - k, n) if largest else np.arange(k), axis=dim)
    order = np.argsort(np.take_along_axis(a, idx, axis=dim), axis=dim, kind="stable")
    return np.take_along_axis(idx, np.flip(order, axis=dim) if largest else order, axis=dim).astype(np.int64)


def _np_sort_indices(a, dim, descending):
    """A stable order along dim: equal entries keep their order, nan sorts as the largest (first if descending)."""
    if a.dtype.kind == "b":
        a = a.astype(np.int8)
    if descending:
        key = -a if a.dtype.kind == "f" else -a.astype(np.int64)
        if a.dtype.kind == "f":
            key = np.where(np.isnan(a), -np.inf, key)
        a = key
    return np.argsort(a, axis=dim, kind="stable").astype(np.int64)


def _np_linear(x, w):
    return np.matmul(x, w.T)


def _np_reshape(x, shape):
    return x.reshape(shape)


def _np_permute(x, dims):
    return x.transpose(dims)


def _np_expand(x, shape):
    return np.broadcast_to(x, shape)


def _np_getitem(x, *index_arrays, key):
    index = decode_key(key, index_arrays)
    out = x[index]
    if index_arrays:
        # NOTE: indexing with tensors copies, and torch's copy is C-contiguous (so a reshape of it is a view);
        # numpy's can come out in another order (x[..., idx])
        return np.ascontiguousarray(out)
    # NOTE: an integer for every dim gives a numpy scalar (a copy) where torch gives a 0-d view; `...` keeps a view
    return out if type(out) is np.ndarray else x[index + (Ellipsis,)]


def _np_index_put(x, values, *index_arrays, key, accumulate):
    out = x.copy()
    index = decode_key(key, index_arrays)
    if accumulate:
        np.add.at(out, index, values)
    else:
        out[index] = values
    return out


def _np_cat(*arrays, dim):
    return np.concatenate(arrays, axis=dim)


def _along_axis_index(index, dim):
    """A full fancy index that selects index[..] along `dim` and the identity elsewhere."""
    grids = list(np.ogrid[tuple(slice(0, s) for s in index.shape)])
    grids[dim] = index
    return tuple(grids)


def _check_index_range(index, dim, size):
    """gather/scatter indices must lie in [0, size): unlike indexing, torch does not wrap negatives."""
    if index.size and (index.max() >= size or index.min() < 0):
        bad = index.max() if index.max() >= size else index.min()
        raise RuntimeError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


def _np_gather(x, index, dim):
    _check_index_range(index, dim, x.shape[dim])
    return x[_along_axis_index(index, dim)]


def _np_scatter_add(x, index, src, dim):
    _check_index_range(index, dim, x.shape[dim])
    out = x.copy()
    np.add.at(out, _along_axis_index(index, dim), src)
    return out


def _np_scatter_extremum(x, index, src, dim, reduce, include_self):
    """scatter_reduce's amax/amin: each scattered position's max (min) of its sources, and of x's own entry when
    include_self (else x's entry is left out there); positions no index reaches keep x's entry."""
    _check_index_range(index, dim, x.shape[dim])
    at = _along_axis_index(index, dim)
    out = x.copy()
    if not include_self:
        if out.dtype.kind == "f":
            fill = -np.inf if reduce == "amax" else np.inf
        else:
            info = np.iinfo(out.dtype) if out.dtype.kind in "iu" else None
            fill = (info.min if reduce == "amax" else info.max) if info is not None else reduce == "amin"
        out[at] = fill
    (np.maximum if reduce == "amax" else np.minimum).at(out, at, src.astype(out.dtype, copy=False))
    return out


def _scatter_extremum_shares(out, x, index, src, dim):
    """(x's entries equal to their result, sources equal to theirs, how many entries share each result)."""
    self_is_result = (x == out).to(out.dtype)
    src_is_result = (src == out.gather(dim, index)).to(out.dtype)
    return self_is_result, src_is_result, self_is_result.scatter_add(dim, index, src_is_result)


def _scatter_extremum_self_vjp(g, out, x, index, src, dim, reduce, include_self):
    """torch's rule: a result's gradient is spread evenly over the entries equal to it."""
    self_is_result, _, shares = _scatter_extremum_shares(out, x, index, src, dim)
    grad = self_is_result * (g / shares)
    return grad if include_self else grad.scatter(dim, index, 0.0)


def _scatter_extremum_src_vjp(g, out, x, index, src, dim, reduce, include_self):
    _, src_is_result, shares = _scatter_extremum_shares(out, x, index, src, dim)
    return src_is_result * (g / shares).gather(dim, index)


def _np_log_softmax(x, dim):
    if x.size == 0:
        return x.copy()
    if x.ndim == 0:
        return _np_log_softmax(x.reshape(1), 0).reshape(())
    work = x.astype(np.float32) if x.dtype == np.float16 else x
    # NOTE: no guard for an infinite max: a row holding +inf, or only -inf, gives nan everywhere, as torch's does
    shifted = work - work.max(axis=dim, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=dim, keepdims=True))


def _np_log_softmax_backward(g, out, dim):
    return g - np.exp(out) * g.sum(axis=dim, keepdims=True)


class _NllTargets:
    """Class-index targets checked against the class count: the index to pick (class 0 where ignored) and,
    when some target is ignored, the mask of the counted positions and their number."""

    def __init__(self, target, dim, size, ignore_index):
        lo, hi = (int(target.min()), int(target.max())) if target.size else (0, 0)
        self.valid, self.count, self.index = None, target.size, target
        if lo <= ignore_index <= hi:
            self.valid = target != ignore_index
            self.count = int(self.valid.sum())
            self.index = np.where(self.valid, target, 0)
            lo, hi = (int(self.index.min()), int(self.index.max())) if target.size else (0, 0)
        if lo < 0 or hi >= size:
            bad = next(v for v in self.index.reshape(-1).tolist() if not 0 <= v < size)
            raise IndexError(f"Target {bad} is out of bounds (the input has {size} classes).")
        if target.ndim == 1 and dim == 1:
            self.selection, self.shape = (np.arange(target.shape[0]), self.index), target.shape
        else:
            expanded = np.expand_dims(self.index, dim)
            self.selection, self.shape = _along_axis_index(expanded, dim), expanded.shape

    def mask(self, values):
        """values with the ignored positions set to 0."""
        return values if self.valid is None else np.where(self.valid, values, 0)


def _np_nll_loss(logp, target, dim, reduction, ignore_index):
    targets = _NllTargets(target, dim, logp.shape[dim], ignore_index)
    loss = targets.mask(-logp[targets.selection].reshape(target.shape)).astype(logp.dtype, copy=False)
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / targets.count if targets.count else logp.dtype.type(np.nan)  # nothing counted: nan, as torch


def _np_nll_loss_backward(g, logp, target, dim, reduction, ignore_index):
    targets = _NllTargets(target, dim, logp.shape[dim], ignore_index)
    picked = -g / targets.count if reduction == "mean" and targets.count else -g
    picked = targets.mask(np.broadcast_to(picked, target.shape))
    out = np.zeros(logp.shape, dtype=logp.dtype)
    out[targets.selection] = np.reshape(picked, targets.shape)
    return out


def _np_cast(x, dtype):
    if x.dtype.kind == "c" and not dtype.is_complex:  # the real part, as torch's cast keeps (without numpy's warning)
        x = x.real
    # NOTE: numpy's "K" order would give an expanded input's copy a strided layout; torch's copy is contiguous there
    return dt.astype(x, dtype.np, order="C" if 0 in x.strides else "K")


def _np_full(shape, value, dtype):
    return np.full(shape, value, dtype=dtype.np)


def _np_arange(start, end, step, dtype):
    return np.arange(start, end, step, dtype=np.int64).astype(dtype.np)


def _np_copy(x):
    return x.copy()


def _np_detach(x):
    return x


def _np_clamp(x, min, max):
    return np.clip(x, min, max)


# ---------------------------------------------------------------------------------------------
# Derivative-rule helpers, written with tensor methods only.
# ---------------------------------------------------------------------------------------------

def _unreduce(g, x, dims, keepdim):
    """Bring a reduction's gradient back to the input's shape (broadcast over reduced dims)."""
    if not keepdim:
        g = g.reshape(reduced_shape(x.shape, dims, True))
    return g.expand(x.shape)


def _extremum_vjp(g, out, x, dims, keepdim):
    """amax/amin: the gradient is split evenly between tied extrema, as torch does."""
    out_k = out if keepdim else out.reshape(reduced_shape(x.shape, dims, True))
    g_k = g if keepdim else g.reshape(reduced_shape(x.shape, dims, True))
    mask = (x == out_k).to(g.dtype)
    return g_k * mask / mask.sum(dims, keepdim=True)


def _prod_vjp(g, out, x, dims, keepdim):
    """Exact where x has zeros: the product of the other elements, without dividing by zero."""
    g_k = _unreduce(g, x, dims, keepdim)
    is_zero = x == 0
    nonzero = x.where(~is_zero, 1.0)
    prod_nonzero = _unreduce(nonzero.prod(dims, keepdim=True), x, dims, True)
    zeros = _unreduce(is_zero.to(g.dtype).sum(dims, keepdim=True), x, dims, True)
    others = (prod_nonzero / nonzero).where(zeros == 0, prod_nonzero.where(is_zero & (zeros == 1), 0.0))
    return g_k * others


def _pow_vjp_base(g, out, x, y):
    if not is_tensor_like(y) and y == 0:
        return g.new_zeros(g.shape)
    return g * y * x ** (y - 1)


def _pow_vjp_exponent(g, out, x, y):
    if is_tensor_like(x) and x.dtype.is_complex:  # no order to test the base's sign by
        return (g * out * x.log()).where(x != 0, 0.0)
    if not is_tensor_like(x):  # a Python scalar base: 2 ** t
        return g * out * math.log(x) if x > 0 else (g * out * math.log(abs(x) or 1.0)).where(y < 0, 0.0)
    return (g * out * x.log()).where(~((x == 0) & (y >= 0)), 0.0)


def _maximum_vjp(g, x, y):
    return g.where(x > y, 0.0) + (g * 0.5).where(x == y, 0.0)


def _clamp_vjp(g, out, x, min, max):
    inside = None
    if min is not None:
        inside = x >= min
    if max is not None:
        inside = (x <= max) if inside is None else inside & (x <= max)
    return g if inside is None else g.where(inside, 0.0)


def _log_softmax_decomposition(x, dim):
    # NOTE: detaching the max is exact (log_softmax does not change when its input is shifted)
    shifted = x - x.amax(dim, keepdim=True).detach()
    return shifted - shifted.exp().sum(dim, keepdim=True).log()


def _log_softmax_backward_decomposition(g, out, dim):
    return g - out.exp() * g.sum(dim, keepdim=True)


def _nll_index(target, dim, ignore_index):
    """(target with ignored entries replaced by class 0, as an int64 index unsqueezed at dim; the kept mask)."""
    valid = target != ignore_index
    return target.masked_fill(~valid, 0).to(dt.int64).unsqueeze(dim), valid


def _nll_loss_decomposition(logp, target, dim, reduction, ignore_index):
    index, valid = _nll_index(target, dim, ignore_index)
    # where, not a product with the mask: an ignored position may pick -inf, and -inf * 0 is nan
    loss = (-logp.gather(dim, index).squeeze(dim)).where(valid, 0.0)
    if reduction == "none":
        return loss
    total = loss.sum()
    return total if reduction == "sum" else total / valid.to(logp.dtype).sum()


def _nll_loss_backward_decomposition(g, logp, target, dim, reduction, ignore_index):
    index, valid = _nll_index(target, dim, ignore_index)
    scale = valid.to(logp.dtype)
    if reduction == "mean":
        scale = scale / scale.sum()
    return apply("scatter_add", logp.new_zeros(logp.shape), index, (-(g * scale)).unsqueeze(dim), dim=dim)


def _cat_vjp(g, out, *inputs, dim, index):
    start = sum(t.shape[dim] for t in inputs[:index])
    return g.narrow(dim, start, inputs[index].shape[dim])


def _zero_vjp(g, out, x, *rest, **attrs):
    return g.new_zeros(x.shape)


def _linked_vjp(g, out, *inputs, index):
    return g if index == 0 else g.new_zeros(inputs[index].shape)


def _first_shape_rule(op, shapes, attrs, dtypes):
    return shapes[0]


def _first_dtype(op, operands, attrs):
    return None, operands[0].dtype


# linked(gradient, *saved): the gradient itself, tied to tensors it is a function of with a zero derivative. A
# derivative rule that reads saved tensors only through masks (relu's out > 0, max pooling's argmax) gives a result
# with no history; under create_graph torch's keeps one (its backward kernels take the saved tensors), so a second
# backward reaches them, giving zeros where a graph without the link gives None (autograd.graph.Node.apply).
_register(OpDef("linked", Kind.OTHER, None, lambda g, *saved: g, _first_shape_rule, _first_dtype,
                vjp=(_linked_vjp,)))


def _zero_vjp_second(g, out, x, y, **attrs):
    return g.new_zeros(y.shape)


SQRT_2_OVER_PI = 2.0 / math.sqrt(math.pi)


# ---------------------------------------------------------------------------------------------
# Reducers and no-op rules (read by nnc: fusion, code generation, remove_noops).
# ---------------------------------------------------------------------------------------------

def _widened(in_dtype, out_dtype):
    # NOTE: float32 sums and products accumulate in float64: numpy sums pairwise (error ~ log n), a serial float32
    # loop would lose ~n * eps; one float64 accumulator is at least as accurate as numpy.
    if out_dtype.kind == "f":
        return np.dtype(np.float64)
    return np.dtype(np.int64) if out_dtype.kind in "iub" else out_dtype


def _lowest(d):
    """The identity of max over numpy dtype d: its lowest value."""
    if d.kind == "f":
        return -math.inf
    return False if d.kind == "b" else int(np.iinfo(d).min)


def _highest(d):
    """The identity of min over numpy dtype d: its highest value."""
    if d.kind == "f":
        return math.inf
    return True if d.kind == "b" else int(np.iinfo(d).max)


def _output_dtype(in_dtype, out_dtype):
    return out_dtype


def _bool_dtype(in_dtype, out_dtype):
    return np.dtype(np.bool_)


_SUM = Reducer("({0} + {1})", lambda d: 0, _widened, block="fold", additive=True)
_PROD = Reducer("({0} * {1})", lambda d: 1, _widened, block="fold")
# max/min of the template language propagate nan, as numpy's amax/amin do
_AMAX = Reducer("max({0}, {1})", _lowest, _output_dtype, block="max")
_AMIN = Reducer("min({0}, {1})", _highest, _output_dtype, block="min")
_ALL = Reducer("({0} and {1})", lambda d: True, _bool_dtype, block="all")
_ANY = Reducer("({0} or {1})", lambda d: False, _bool_dtype, block="any")


def _unchanged(in_shape, in_dtype, out_shape, out_dtype, attrs):
    """A reshape or expand to the input's own shape, a cast to its own dtype."""
    return in_shape is not None and in_shape == out_shape and in_dtype is not None and in_dtype == out_dtype


def _identity_permutation(in_shape, in_dtype, out_shape, out_dtype, attrs):
    return tuple(attrs["dims"]) == tuple(range(len(attrs["dims"])))


def _reduces_nothing(in_shape, in_dtype, out_shape, out_dtype, attrs):
    """A reduction over no dims (the primitive's dims=() keeps every element) that keeps the dtype."""
    return not attrs.get("dims") and _unchanged(in_shape, in_dtype, out_shape, out_dtype, attrs)


# ---------------------------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------------------------

def _elementwise(name, forward, template, dtype_rule=_promote, vjp=(), saves=(), cast_inputs=None, divisor=None):
    arity = 1 + max(int(k) for k in re.findall(r"\{(\d)\}", template))
    return _register(OpDef(name, Kind.ELEMENTWISE, arity, forward, _broadcast_rule, dtype_rule,
                           template=template, vjp=tuple(vjp), saves=tuple(saves), cast_inputs=cast_inputs,
                           divisor=divisor))


def _integer_division(fn):
    """numpy's integer // and % give 0 for a zero divisor; torch raises: so does this forward."""

    def divide(x, y):
        if np.result_type(x, y).kind in "iu" and np.any(np.asarray(y) == 0):
            raise RuntimeError("ZeroDivisionError")
        return fn(x, y)

    divide.__name__ = getattr(fn, "__name__", "divide")
    return divide


E = _elementwise
# binary arithmetic
E("add", np.add, "({0} + {1})", vjp=(lambda g, out, x, y: g, lambda g, out, x, y: g))
E("sub", np.subtract, "({0} - {1})", _no_bool(_promote, "Subtraction"),
  vjp=(lambda g, out, x, y: g, lambda g, out, x, y: -g))
E("mul", np.multiply, "({0} * {1})", vjp=(lambda g, out, x, y: g * y, lambda g, out, x, y: g * x),
  saves=(0, 1))
E("div", _quiet(np.true_divide), "({0} / {1})", _to_float,
  vjp=(lambda g, out, x, y: g / y, lambda g, out, x, y: -g * x / (y * y)), saves=(0, 1))
E("pow", _quiet(np.power), "({0} ** {1})", vjp=(_pow_vjp_base, _pow_vjp_exponent), saves=(0, 1, "out"))
E("maximum", np.maximum, "max({0}, {1})",
  vjp=(lambda g, out, x, y: _maximum_vjp(g, x, y), lambda g, out, x, y: _maximum_vjp(g, y, x)), saves=(0, 1))
E("minimum", np.minimum, "min({0}, {1})",
  vjp=(lambda g, out, x, y: _maximum_vjp(g, y, x), lambda g, out, x, y: _maximum_vjp(g, x, y)), saves=(0, 1))
# floor division is piecewise constant: its gradient is zero (torch's div(rounding_mode='floor') has the same rule)
E("floordiv", _integer_division(_quiet(np.floor_divide)), "({0} // {1})", divisor=1,
  vjp=(_zero_vjp, lambda g, out, x, y: g.new_zeros(y.shape)))
E("remainder", _integer_division(_quiet(np.remainder)), "({0} % {1})",
  vjp=(lambda g, out, x, y: g, lambda g, out, x, y: -g * (x // y)), saves=(0, 1), divisor=1)
# comparisons and logic
E("eq", np.equal, "({0} == {1})", _compare)
E("ne", np.not_equal, "({0} != {1})", _compare)
E("lt", np.less, "({0} < {1})", _compare)
E("le", np.less_equal, "({0} <= {1})", _compare)
E("gt", np.greater, "({0} > {1})", _compare)
E("ge", np.greater_equal, "({0} >= {1})", _compare)
E("logical_and", np.logical_and, "({0} and {1})", _logical)
E("logical_or", np.logical_or, "({0} or {1})", _logical)
E("logical_xor", np.logical_xor, "({0} != {1})", _logical)
E("logical_not", np.logical_not, "(not {0})", _logical)
E("bitwise_not", np.invert, "(~{0})", _integral)
E("bitwise_and", np.bitwise_and, "({0} & {1})", _integral)
E("bitwise_or", np.bitwise_or, "({0} | {1})", _integral)
E("bitwise_xor", np.bitwise_xor, "({0} ^ {1})", _integral)
# unary math
E("neg", np.negative, "(-{0})", _no_bool(_keep, "Negation"), vjp=(lambda g, out, x: -g,))
E("abs", np.abs, "abs({0})", lambda op, operands, attrs: (None, operands[0].dtype.to_real()),
  vjp=(lambda g, out, x: g * (_sgn(x) if x.dtype.is_complex else x.sign()),), saves=(0,))
E("sign", _np_sign, "sign({0})", _keep, vjp=(_zero_vjp,))
E("floor", np.floor, "floor({0})", _keep, vjp=(_zero_vjp,))
E("exp", _quiet(np.exp), "exp({0})", _to_float, vjp=(lambda g, out, x: g * out,), saves=("out",))
E("log", _quiet(np.log), "log({0})", _to_float, vjp=(lambda g, out, x: g / x,), saves=(0,))
E("log1p", _quiet(np.log1p), "log1p({0})", _to_float, vjp=(lambda g, out, x: g / (x + 1),), saves=(0,))
E("sqrt", _quiet(np.sqrt), "sqrt({0})", _to_float, vjp=(lambda g, out, x: g / (out * 2),), saves=("out",))
E("rsqrt", _quiet(_np_rsqrt), "(1.0 / sqrt({0}))", _to_float,
  vjp=(lambda g, out, x: g * out * out * out * -0.5,), saves=("out",))
E("reciprocal", _quiet(np.reciprocal), "(1.0 / {0})", _to_float,
  vjp=(lambda g, out, x: -g * out * out,), saves=("out",))
E("sin", np.sin, "sin({0})", _to_float, vjp=(lambda g, out, x: g * x.cos(),), saves=(0,))
E("cos", np.cos, "cos({0})", _to_float, vjp=(lambda g, out, x: -g * x.sin(),), saves=(0,))
E("tanh", np.tanh, "tanh({0})", _to_float, vjp=(lambda g, out, x: g * (1 - out * out),), saves=("out",))
E("sigmoid", _np_sigmoid, "sigmoid({0})", _to_float, vjp=(lambda g, out, x: g * out * (1 - out),),
  saves=("out",))
E("relu", _np_relu, "max({0}, 0)", _keep, vjp=(lambda g, out, x: g.where(out > 0, 0.0),), saves=("out",))
E("erf", _np_erf, "erf({0})", _to_float,
  vjp=(lambda g, out, x: g * SQRT_2_OVER_PI * (-(x * x)).exp(),), saves=(0,))
E("where", _np_where, "({1} if {0} else {2})", _where_dtype,
  vjp=(None, lambda g, out, c, x, y: g.where(c, 0.0), lambda g, out, c, x, y: g.where(~c, 0.0)), saves=(0,),
  cast_inputs=(1, 2))
_register(OpDef("clamp", Kind.ELEMENTWISE, 1, _np_clamp, _same_shape_rule, _clamp_dtype, template="clamp({0})",
                vjp=(_clamp_vjp,), saves=(0,), attr_names=("min", "max")))
_register(OpDef("cast", Kind.ELEMENTWISE, 1, _np_cast, _same_shape_rule, _cast_dtype, template="{dtype}({0})",
                vjp=(lambda g, out, x, dtype: g,), attr_names=("dtype",), noop=_unchanged))
_register(OpDef("clone", Kind.ELEMENTWISE, 1, _np_copy, _same_shape_rule, _keep, template="{0}",
                vjp=(lambda g, out, x: g,)))
_register(OpDef("detach", Kind.ELEMENTWISE, 1, _np_detach, _same_shape_rule, _keep, template="{0}",
                is_view=True))

# reductions: attrs dims (a tuple of non-negative dims) and keepdim
_R = dict(kind=Kind.REDUCTION, arity=1, shape_rule=_reduce_rule, attr_names=("dims", "keepdim"), noop=_reduces_nothing)
_register(OpDef("sum", forward=_np_sum, dtype_rule=_sum_dtype, saves=(), reducer=_SUM,
                vjp=(lambda g, out, x, dims, keepdim: _unreduce(g, x, dims, keepdim),), **_R))
_register(OpDef("prod", forward=_np_prod, dtype_rule=_sum_dtype, vjp=(_prod_vjp,), saves=(0, "out"), reducer=_PROD,
                **_R))
_X = dict(_R, shape_rule=_extremum_rule)
_register(OpDef("amax", forward=_np_amax, dtype_rule=_keep, vjp=(_extremum_vjp,), saves=(0, "out"), reducer=_AMAX,
                **_X))
_register(OpDef("amin", forward=_np_amin, dtype_rule=_keep, vjp=(_extremum_vjp,), saves=(0, "out"), reducer=_AMIN,
                **_X))
_register(OpDef("all", forward=_np_all, dtype_rule=_logical, reducer=_ALL, **_R))
_register(OpDef("any", forward=_np_any, dtype_rule=_logical, reducer=_ANY, **_R))
_A = dict(kind=Kind.REDUCTION, arity=1, shape_rule=_arg_reduce_rule, dtype_rule=_arg_dtype,
          attr_names=("dim", "keepdim"))
_register(OpDef("argmax", forward=_arg_reduce(np.argmax), **_A))
_register(OpDef("argmin", forward=_arg_reduce(np.argmin), **_A))
# which entries win reads values; public topk and sort gather their values with these (gather's rule scatters the
# gradient back), so the choice is an op of the graph, not a constant read from an eager tensor
_register(OpDef("topk_indices", Kind.OTHER, 1, _np_topk_indices, _topk_rule, _arg_dtype,
                attr_names=("k", "dim", "largest")))
_register(OpDef("sort_indices", Kind.OTHER, 1, _np_sort_indices, _first_input_rule,
                _order_dtype, attr_names=("dim", "descending")))

# matmul (2-D or batched; the public matmul handles 1-D operands around it)
_register(OpDef("matmul", Kind.MATMUL, 2, np.matmul, _matmul_rule, _same_required,
                vjp=(lambda g, out, x, y: g @ y.mT, lambda g, out, x, y: x.mT @ g), saves=(0, 1)))

# linear: x @ w^T with w stored (out, in), as torch's weights are. A primitive of its own so the weight
# gradient comes out in the weight's own layout (no transposed copy) and a layer costs one dispatch.
_register(OpDef("linear", Kind.MATMUL, 2, _np_linear, _linear_rule, _same_required,
                vjp=(lambda g, out, x, w: g @ w,
                     lambda g, out, x, w: g.reshape(-1, w.shape[0]).mT @ x.reshape(-1, w.shape[1])),
                saves=(0, 1)))

# shape and view ops
_register(OpDef("reshape", Kind.SHAPE, 1, _np_reshape, _reshape_rule, _keep, is_view=True,
                vjp=(lambda g, out, x, shape: g.reshape(x.shape),), attr_names=("shape",), noop=_unchanged))
_register(OpDef("permute", Kind.SHAPE, 1, _np_permute, _permute_rule, _keep, is_view=True,
                vjp=(lambda g, out, x, dims: g.permute(tuple(np.argsort(dims).tolist())),), attr_names=("dims",),
                noop=_identity_permutation))
_register(OpDef("expand", Kind.SHAPE, 1, _np_expand, _expand_rule, _keep, is_view=True,
                vjp=(lambda g, out, x, shape: g.sum_to_size(x.shape),), attr_names=("shape",), noop=_unchanged,
                broadcasts=True))
_register(OpDef("getitem", Kind.SHAPE, None, _np_getitem, _getitem_rule, _keep, is_view=True,
                vjp=(lambda g, out, x, *idx, key, index: (
                    apply("index_put", g.new_zeros(x.shape), g, *idx, key=key, accumulate=bool(idx))
                    if index == 0 else None),),
                attr_names=("key",)))
_register(OpDef("index_put", Kind.OTHER, None, _np_index_put, _first_input_rule, _index_put_dtype, cast_inputs=(0, 1),
                vjp=(lambda g, out, x, v, *idx, key, accumulate, index: (
                    (g if accumulate else apply("index_put", g, g.new_zeros(()), *idx, key=key, accumulate=False))
                    if index == 0 else apply("getitem", g, *idx, key=key) if index == 1 else None),),
                attr_names=("key", "accumulate")))
_register(OpDef("cat", Kind.SHAPE, None, _np_cat, _cat_rule, _cat_dtype, vjp=(_cat_vjp,), attr_names=("dim",)))
_register(OpDef("gather", Kind.OTHER, 2, _np_gather, _gather_rule, _gather_dtype,
                vjp=(lambda g, out, x, index, dim: apply("scatter_add", g.new_zeros(x.shape), index, g, dim=dim),
                     None),
                saves=(1,), attr_names=("dim",)))
_register(OpDef("scatter_add", Kind.OTHER, 3, _np_scatter_add, _first_input_rule, _scatter_dtype, cast_inputs=(0, 2),
                vjp=(lambda g, out, x, index, src, dim: g, None,
                     lambda g, out, x, index, src, dim: apply("gather", g, index, dim=dim)),
                saves=(1,), attr_names=("dim",)))
_register(OpDef("scatter_extremum", Kind.OTHER, 3, _np_scatter_extremum, _first_input_rule, _scatter_dtype,
                cast_inputs=(0, 2), vjp=(_scatter_extremum_self_vjp, None, _scatter_extremum_src_vjp),
                saves=(0, 1, 2, "out"), attr_names=("dim", "reduce", "include_self")))
# log_softmax, nll_loss and nll_loss's backward: fused ops (as in torch's ATen), so that eager cross-entropy costs
# a few dispatches instead of a dozen; nnc expands each into the primitives above (`decomposition`).
_NLL_ATTRS = ("dim", "reduction", "ignore_index")
_register(OpDef("log_softmax", Kind.OTHER, 1, _np_log_softmax, _same_shape_rule, _to_float,
                vjp=(lambda g, out, x, dim: apply("log_softmax_backward", g, out, dim=dim),), saves=("out",),
                attr_names=("dim",), decomposition=_log_softmax_decomposition))
# g - exp(out) * sum(g): its own op for the same reason; the rules below differentiate that expression
_register(OpDef("log_softmax_backward", Kind.OTHER, 2, _np_log_softmax_backward, _same_shape_rule, _promote,
                vjp=(lambda gg, y, g, out, dim: gg - (gg * out.exp()).sum(dim, keepdim=True),
                     lambda gg, y, g, out, dim: -(gg * out.exp()) * g.sum(dim, keepdim=True)),
                saves=(0, 1), attr_names=("dim",), decomposition=_log_softmax_backward_decomposition))
_register(OpDef("nll_loss", Kind.OTHER, 2, _np_nll_loss, _nll_rule, _nll_dtype,
                vjp=(lambda g, out, logp, target, **attrs: apply("nll_loss_backward", g, logp, target, **attrs),
                     None),
                saves=(0, 1), attr_names=_NLL_ATTRS, decomposition=_nll_loss_decomposition))
# linear in g; its adjoint is nll_loss itself, which gives double backward
_register(OpDef("nll_loss_backward", Kind.OTHER, 3, _np_nll_loss_backward, _second_input_rule, _nll_backward_dtype,
                vjp=(lambda gg, out, g, logp, target, **attrs: apply("nll_loss", gg, target, **attrs),
                     lambda *values, **attrs: None, None),  # no gradient for logp: only its shape is read
                saves=(2,), attr_names=_NLL_ATTRS, decomposition=_nll_loss_backward_decomposition))
_register(OpDef("full", Kind.OTHER, 0, _np_full, _full_rule, _full_dtype, attr_names=("shape", "value", "dtype")))
# Integer ranges whose bounds a compiler keeps symbolic (runtime.arange makes its values with numpy directly).
_register(OpDef("arange", Kind.OTHER, 0, _np_arange, _arange_rule, _full_dtype,
                attr_names=("start", "end", "step", "dtype")))


# ---------------------------------------------------------------------------------------------
# Elementwise math that code generation has no template for (yet): kind OTHER, so nnc runs each call as an opaque
# node with the numpy forward. Derivative rules as for any op.
# ---------------------------------------------------------------------------------------------

def _math(name, forward, vjp=(), saves=(), dtype_rule=_to_float, arity=1):
    return _register(OpDef(name, Kind.OTHER, arity, _quiet(forward), _broadcast_rule, dtype_rule, vjp=tuple(vjp),
                           saves=tuple(saves)))


def _np_erfinv(y):
    from scipy.special import erfinv

    return erfinv(y).astype(y.dtype, copy=False)


def _np_lgamma(x):
    from scipy.special import gammaln

    return gammaln(x).astype(x.dtype, copy=False)


def _np_digamma(x):
    from scipy.special import psi

    # NOTE: torch gives -inf at 0 (scipy: nan at non-positive integers only from the negative side)
    out = psi(x)
    return np.where(x == 0, -np.inf, out).astype(x.dtype, copy=False)


def _np_trigamma(x):
    # NOTE: the textbook method torch uses too (so the two agree to the last digits): reflection below 1/2, the
    # recurrence psi1(x) = psi1(x + 1) + 1/x^2 six times, then the asymptotic series to the x^-7 term
    z = x.astype(np.float64)
    sign = np.where(z < 0.5, -1.0, 1.0)
    result = np.where(z < 0.5, -(np.pi / np.sin(np.pi * z)) ** 2, 0.0)
    z = np.where(z < 0.5, 1 - z, z)
    for _ in range(6):
        result += 1 / (z * z)
        z = z + 1
    ixx = 1 / (z * z)
    result += (1 + 1 / (2 * z) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / z
    return (sign * result).astype(x.dtype, copy=False)


def _np_erfc(x):
    from scipy.special import erfc

    return erfc(x).astype(x.dtype, copy=False)


def _np_i1(x):
    from scipy.special import i1

    return i1(x).astype(x.dtype, copy=False)


def _np_trunc(x):
    return np.trunc(x) if x.dtype.kind == "f" else x.copy()


_math("tan", np.tan, (lambda g, out, x: g * (1 + out * out),), ("out",))
_math("asin", np.arcsin, (lambda g, out, x: g * (1 - x * x).rsqrt(),), (0,))
_math("acos", np.arccos, (lambda g, out, x: -g * (1 - x * x).rsqrt(),), (0,))
_math("atan", np.arctan, (lambda g, out, x: g / (1 + x * x),), (0,))
_math("sinh", np.sinh, (lambda g, out, x: g * x.cosh(),), (0,))
_math("cosh", np.cosh, (lambda g, out, x: g * x.sinh(),), (0,))
_math("asinh", np.arcsinh, (lambda g, out, x: g * (x * x + 1).rsqrt(),), (0,))
_math("acosh", np.arccosh, (lambda g, out, x: g * (x * x - 1).rsqrt(),), (0,))
_math("atanh", np.arctanh, (lambda g, out, x: g / (1 - x * x),), (0,))
_math("expm1", np.expm1, (lambda g, out, x: g * (out + 1),), ("out",))
_math("erfc", _np_erfc, (lambda g, out, x: -g * SQRT_2_OVER_PI * (-(x * x)).exp(),), (0,))
_math("erfinv", _np_erfinv, (lambda g, out, x: g * (math.sqrt(math.pi) / 2) * (out * out).exp(),), ("out",))
_math("lgamma", _np_lgamma, (lambda g, out, x: g * apply("digamma", x),), (0,))
_math("digamma", _np_digamma, (lambda g, out, x: g * apply("trigamma", x),), (0,))
_math("trigamma", _np_trigamma)


def _np_polygamma(x, n):
    from scipy.special import polygamma

    # NOTE: torch gives +-inf at the poles (0 and the negative integers), where scipy gives nan
    out = polygamma(n, x)
    pole = (x <= 0) & (x == np.floor(x))
    return np.where(pole, np.inf if n % 2 else -np.inf, out).astype(x.dtype, copy=False)


# polygamma(n, x) for n >= 2 (0 and 1 are digamma and trigamma): its derivative is the next order
_register(OpDef("polygamma", Kind.OTHER, 1, _quiet(_np_polygamma), _broadcast_rule, _to_float,
                vjp=(lambda g, out, x, n: g * apply("polygamma", x, n=n + 1),), saves=(0,), attr_names=("n",)))
_math("trunc", _np_trunc, (_zero_vjp,), dtype_rule=_keep)
_math("i0", np.i0, (lambda g, out, x: g * apply("i1", x),), (0,))
_math("i1", _np_i1)
_math("atan2", np.arctan2, (lambda g, out, y, x: g * x / (x * x + y * y),
                            lambda g, out, y, x: -g * y / (x * x + y * y)), (0, 1), arity=2)
_math("fmod", _integer_division(np.fmod), (lambda g, out, x, y: g, lambda g, out, x, y: -g * (x / y).trunc()),
      (0, 1), dtype_rule=_promote, arity=2)
_math("copysign", np.copysign, (lambda g, out, x, y: g * x.sign() * out.sign(), _zero_vjp_second), (0, "out"),
      arity=2)
_math("nextafter", np.nextafter, dtype_rule=_promote, arity=2)
_math("heaviside", np.heaviside, dtype_rule=_same_required, arity=2)
_math("gcd", np.gcd, dtype_rule=_integral, arity=2)
_math("lcm", np.lcm, dtype_rule=_integral, arity=2)
_math("bitwise_left_shift", np.left_shift, dtype_rule=_integral, arity=2)
_math("bitwise_right_shift", np.right_shift, dtype_rule=_integral, arity=2)


# ---------------------------------------------------------------------------------------------
# Scans along one dim.
# ---------------------------------------------------------------------------------------------

def _scan_accumulator(x):
    """The dtype a scan accumulates in, as torch's CPU kernels: int64 for integers and bools, double precision for
    narrower floats (a float32 cumsum of [1e8, 1, -1e8] ends in 1, not 0); the result is cast back."""
    if x.dtype.kind in "biu":
        return np.int64
    if x.dtype.kind == "f" and x.dtype.itemsize < 8:
        return np.float64
    return None


def _np_cumsum(x, dim):
    return np.cumsum(x, axis=dim, dtype=_scan_accumulator(x))


def _np_cumprod(x, dim):
    return np.cumprod(x, axis=dim, dtype=_scan_accumulator(x))


def _reverse_cumsum(g, dim):
    return apply("cumsum", g.flip(dim), dim=dim).flip(dim)


def _cumprod_vjp(g, out, x, dim):
    # NOTE: sum_{j>=i} g_j out_j / x_i: exact where x has no zeros (torch has a slower rule for zeros; this one gives
    # nan there)
    return _reverse_cumsum(g * out, dim) / x


def _scan_rule(op, shapes, attrs, dtypes):
    d = attrs["dim"]
    if not 0 <= d < max(len(shapes[0]), 1):
        raise IndexError(f"{op.name}: dimension {d} out of range for a tensor of shape {_fmt(shapes[0])}")
    return shapes[0]


_register(OpDef("cumsum", Kind.OTHER, 1, _np_cumsum, _scan_rule, _sum_dtype, attr_names=("dim",),
                vjp=(lambda g, out, x, dim: _reverse_cumsum(g, dim),)))
_register(OpDef("cumprod", Kind.OTHER, 1, _np_cumprod, _scan_rule, _sum_dtype, attr_names=("dim",),
                vjp=(_cumprod_vjp,), saves=(0, "out")))


# ---------------------------------------------------------------------------------------------
# Linear algebra on the last two dims (numpy's LAPACK): kind OTHER, opaque to nnc's fusion.
# ---------------------------------------------------------------------------------------------

def _square_rule(op, shapes, attrs, dtypes):
    a = shapes[0]
    if len(a) < 2 or a[-1] != a[-2]:
        raise RuntimeError(f"linalg.{op.name}: A must be batches of square matrices, but they are "
                           f"{a[-2] if len(a) > 1 else a[-1] if a else 1} by {a[-1] if a else 1} matrices")
    return a


def _square_reduced_rule(op, shapes, attrs, dtypes):
    return _square_rule(op, shapes, attrs, dtypes)[:-2]


def _eigvals_rule(op, shapes, attrs, dtypes):
    return _square_rule(op, shapes, attrs, dtypes)[:-1]


def _solve_rule(op, shapes, attrs, dtypes):
    a, b = _square_rule(op, shapes, attrs, dtypes), shapes[1]
    if len(b) < 2 or b[-2] != a[-1]:
        raise RuntimeError(f"linalg.solve: Incompatible shapes of A and B for the equation AX = B "
                           f"({'x'.join(map(str, a[-2:]))} and {'x'.join(map(str, b[-2:]))})")
    return broadcast_shapes(a[:-2], b[:-2]) + b[-2:]


def _float_linalg(op, operands, attrs):
    d = result_type(operands)
    if not d.is_floating_point or d is dt.float16:
        raise RuntimeError(f"linalg.{op.name}: Expected a floating point tensor as input. Got {d.name}")
    return d, d


def _lapack(fn, what):
    def forward(*arrays):
        try:
            with np.errstate(all="ignore"):
                return fn(*arrays)
        except np.linalg.LinAlgError:
            raise RuntimeError(f"linalg.{what}: The factorization could not be completed because the input is not "
                               f"{'positive-definite' if what == 'cholesky' else 'invertible'}") from None

    forward.__name__ = f"_np_{what}"
    return forward


def _np_logabsdet(a):
    return np.linalg.slogdet(a)[1]


def _symmetric(fn):
    """fn of A's symmetric part: the value for the symmetric matrices these ops take, and a function whose
    derivative is the symmetric one the rules give (so finite differences check them)."""

    def forward(a):
        return fn((a + np.swapaxes(a, -1, -2)) / 2)

    forward.__name__ = fn.__name__
    return forward


def _np_eigh_vectors(a):
    return np.linalg.eigh(a)[1]


def _np_solve(a, b):
    a, b = np.broadcast_arrays(a, b) if a.ndim == b.ndim and a.shape[:-2] != b.shape[:-2] else (a, b)
    return np.linalg.solve(a, b)


def _inv_t(a):
    return apply("inv", a).mT


def _cholesky_vjp(g, L, a):
    # NOTE: the rule of Murray (2016): A's gradient is L^-T Phi(L^T gL) L^-1, symmetrised, where Phi keeps the lower
    # triangle and halves the diagonal
    n = L.shape[-1]
    lower = L.new_tensor(np.tril(np.ones((n, n)), -1) + 0.5 * np.eye(n))
    phi = (L.mT @ g) * lower
    linv = apply("inv", L)
    grad = linv.mT @ phi @ linv
    return (grad + grad.mT) * 0.5


def _eigh_vectors_vjp(g, V, a):
    # NOTE: for distinct eigenvalues: V (F * (V^T gV)) V^T with F_ij = 1 / (w_j - w_i) off the diagonal, 0 on it
    w = apply("eigvalsh", a)
    diff = w.unsqueeze(-2) - w.unsqueeze(-1)
    n = w.shape[-1]
    off = g.new_tensor(~np.eye(n, dtype=bool), dtype=dt.bool_)
    f = (1 / diff.where(off, 1.0)).where(off, 0.0)
    inner = f * (V.mT @ g)
    grad = V @ inner @ V.mT
    return (grad + grad.mT) * 0.5


def _linalg(name, forward, shape_rule, vjp=(), saves=(), arity=1):
    return _register(OpDef(name, Kind.OTHER, arity, _lapack(forward, name), shape_rule, _float_linalg,
                           vjp=tuple(vjp), saves=tuple(saves)))


_linalg("inv", np.linalg.inv, _square_rule, (lambda g, out, a: -(out.mT @ g @ out.mT),), ("out",))
_linalg("det", np.linalg.det, _square_reduced_rule,
        (lambda g, out, a: (g * out).unsqueeze(-1).unsqueeze(-1) * _inv_t(a),), (0, "out"))
_linalg("logabsdet", _np_logabsdet, _square_reduced_rule,
        (lambda g, out, a: g.unsqueeze(-1).unsqueeze(-1) * _inv_t(a),), (0,))
_linalg("solve", _np_solve, _solve_rule,
        (lambda g, out, a, b: -(apply("solve", a.mT, g) @ out.mT), lambda g, out, a, b: apply("solve", a.mT, g)),
        (0, "out"), arity=2)
_linalg("cholesky", _symmetric(np.linalg.cholesky), _square_rule, (lambda g, out, a: _cholesky_vjp(g, out, a),),
        ("out",))
def _np_matrix_exp(a):
    from scipy.linalg import expm

    if not a.size:
        return a.copy()
    return np.stack([expm(m) for m in a.reshape(-1, *a.shape[-2:])]).reshape(a.shape)


def _matrix_exp_vjp(g, a):
    """The adjoint of exp's derivative at A applied to G: the top-right block of exp([[A^H, G], [0, A^H]])."""
    n, last = a.shape[-1], a.ndim - 1
    ah = a.mH
    top = apply("cat", ah, g, dim=last)
    bottom = apply("cat", ah.new_zeros(tuple(ah.shape)), ah, dim=last)
    return apply("matrix_exp", apply("cat", top, bottom, dim=last - 1))[..., :n, n:]


_linalg("matrix_exp", _np_matrix_exp, _square_rule, (lambda g, out, a: _matrix_exp_vjp(g, a),), (0,))
_linalg("eigvalsh", _symmetric(np.linalg.eigvalsh), _eigvals_rule,
        (lambda g, out, a: (lambda v: (v * g.unsqueeze(-2)) @ v.mT)(apply("eigh_vectors", a)),), (0,))
_linalg("eigh_vectors", _symmetric(_np_eigh_vectors), _square_rule, (lambda g, out, a: _eigh_vectors_vjp(g, out, a),),
        (0, "out"))

# ---------------------------------------------------------------------------------------------
# Constant padding (torch's constant_pad_nd; also the zeros a transposed convolution's stride puts between
# neighbours). Attribute `pads`: one (before, after, between) per dim, `between` values inserted between
# neighbours, and a negative `before`/`after` crops that edge instead. A fused op: eager writes the result in one
# pass, and the gradient is a tensor of its own, C-contiguous as torch's, where the cats it decomposes into (for nnc
# and CUDA) would give a strided slice of the result's gradient.
# ---------------------------------------------------------------------------------------------

def _pad_layout(shape, pads):
    """(source key, destination key, (first, cut) per dim): x[source] is written to out[destination] with
    `between` values apart; `first` and `cut` count the elements cropped away at either edge."""
    source, destination, crops = [], [], []
    for n, (before, after, between) in zip(shape, pads):
        step = between + 1
        first = min(-(before // step) if before < 0 else 0, n)
        cut = min(-(after // step) if after < 0 else 0, n - first)
        count, start = n - first - cut, before + first * step
        source.append(("slice", first, n - cut, None))
        destination.append(("slice", start, start + (count - 1) * step + 1, step) if count > 0
                           else ("slice", 0, 0, None))
        crops.append((first, cut))
    return tuple(source), tuple(destination), tuple(crops)


def _padded_shape(shape, pads) -> tuple:
    return tuple(n + before + after + (n - 1) * between if n else before + after
                 for n, (before, after, between) in zip(shape, pads))


def _constant_pad_rule(op, shapes, attrs, dtypes):
    shape, pads = shapes[0], attrs["pads"]
    if len(pads) != len(shape):
        raise ShapeError(f"constant_pad: expected (before, after, between) for each of the {len(shape)} dims of "
                         f"{_fmt(shape)}, got {len(pads)}")
    out = _padded_shape(shape, pads)
    if any(n < 0 for n in out):
        raise ShapeError(f"constant_pad: padding {pads} crops {_fmt(shape)} to the negative size {_fmt(out)}")
    return out


def _np_constant_pad(x, pads, value):
    source, destination, _ = _pad_layout(x.shape, pads)
    out = np.full(_padded_shape(x.shape, pads), value, x.dtype)
    out[decode_key(destination, [])] = x[decode_key(source, [])]
    return out


def _constant_pad_vjp(g, out, x, pads, value):
    _, destination, crops = _pad_layout(x.shape, pads)
    kept = apply("getitem", g, key=destination)
    if any(first or cut for first, cut in crops):
        return apply("constant_pad", kept, pads=tuple((first, cut, 0) for first, cut in crops), value=0)
    return kept.clone()


def _spread(x, d, between, value):
    """x with `between` values inserted between neighbours along dim d."""
    shape = tuple(x.shape)
    gaps = x.new_full(shape[:d + 1] + (between,) + shape[d + 1:], value)
    stacked = apply("cat", x.unsqueeze(d + 1), gaps, dim=d + 1)  # (..., n, between + 1, ...)
    merged = stacked.reshape(shape[:d] + (shape[d] * (between + 1),) + shape[d + 1:])
    return merged.narrow(d, 0, (shape[d] - 1) * (between + 1) + 1)


def _pad_edges(x, d, before, after, value):
    """x padded (or, for negative amounts, cropped) at both edges of dim d."""
    if before < 0 or after < 0:
        start = max(-before, 0)
        x = x.narrow(d, start, x.shape[d] - max(-after, 0) - start)
        before, after = max(before, 0), max(after, 0)
    if before == 0 and after == 0:
        return x
    shape, parts = list(x.shape), [x]
    if before:
        shape[d] = before
        parts.insert(0, x.new_full(tuple(shape), value))
    if after:
        shape[d] = after
        parts.append(x.new_full(tuple(shape), value))
    return apply("cat", *parts, dim=d)


def _constant_pad_decomposition(x, pads, value):
    for d, (before, after, between) in enumerate(pads):
        if between and x.shape[d] > 1:
            x = _spread(x, d, between, value)
        x = _pad_edges(x, d, before, after, value)
    return x


_register(OpDef("constant_pad", Kind.OTHER, 1, _np_constant_pad, _constant_pad_rule, _keep,
                vjp=(_constant_pad_vjp,), attr_names=("pads", "value"), decomposition=_constant_pad_decomposition))


# ---------------------------------------------------------------------------------------------
# Sliding windows: convolution and pooling. Attributes per spatial dim: kernel, stride, dilation (tuples) and
# padding ((left, right) pairs). im2col gathers every window of a zero-padded input (N, C, *spatial) as a column of
# a (C*K, N*L) matrix, K the window's size and L the output positions (one BLAS product per convolution, not one per
# sample); col2im is its adjoint (columns summed back into the input). Convolution is im2col -> matmul, average
# pooling im2col -> sum; max pooling has its own forward and backward (the gradient
# goes to the first maximal element of each window, as torch's does). nnc generates each as a "window" kernel.
# ---------------------------------------------------------------------------------------------

def window_output_sizes(spatial, kernel, stride, padding, dilation) -> tuple:
    """The output positions per spatial dim of windows over an input padded by (left, right) pairs."""
    return tuple((n + lo + hi - d * (k - 1) - 1) // s + 1
                 for n, k, s, (lo, hi), d in zip(spatial, kernel, stride, padding, dilation))


def _np_padded(x, padding, value):
    if not any(lo or hi for lo, hi in padding):
        return x
    out = np.full(x.shape[:2] + tuple(n + lo + hi for n, (lo, hi) in zip(x.shape[2:], padding)), value, x.dtype)
    out[(slice(None),) * 2 + tuple(slice(lo, lo + n) for n, (lo, _) in zip(x.shape[2:], padding))] = x
    return out


def _window_slices(kernel, stride, dilation, out_sizes):
    """(flat kernel offset, the strided slice of the padded input's spatial dims that offset reads), per offset."""
    import itertools

    for k, offsets in enumerate(itertools.product(*(range(n) for n in kernel))):
        yield k, (slice(None),) * 2 + tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                                            for o, d, s, n in zip(offsets, dilation, stride, out_sizes))


def _np_im2col(x, kernel, stride, padding, dilation):
    out_sizes = window_output_sizes(x.shape[2:], kernel, stride, padding, dilation)
    xp = _np_padded(x, padding, 0)
    nd = len(kernel)
    st = xp.strides
    windows = np.lib.stride_tricks.as_strided(  # (C, *kernel, N, *out)
        xp, (xp.shape[1],) + tuple(kernel) + (xp.shape[0],) + out_sizes,
        (st[1],) + tuple(st[2 + i] * dilation[i] for i in range(nd)) + (st[0],)
        + tuple(st[2 + i] * stride[i] for i in range(nd)), writeable=False)
    n, c = x.shape[:2]
    return np.ascontiguousarray(windows).reshape(c * math.prod(kernel), n * math.prod(out_sizes))


def _clipped_range(offset, stride, size, out):
    """(output positions, input positions) as slices, for the windows' elements at `offset` from each window's start
    (in padded coordinates, the left padding already subtracted) that fall inside an input of `size`; None if none."""
    first = max(0, -(offset // stride))  # ceil(-offset / stride) for a negative offset
    last = min(out - 1, (size - 1 - offset) // stride)
    if first > last:
        return None
    return slice(first, last + 1), slice(offset + stride * first, offset + stride * last + 1, stride)


def _clipped_window_slices(kernel, stride, padding, dilation, size, out_sizes):
    """(flat kernel offset, output positions' key, unpadded input's key), per kernel offset that reads the input: the
    windows' elements that fall in the padding are left out, so a scatter writes an unpadded result in place."""
    import itertools

    for k, offsets in enumerate(itertools.product(*(range(n) for n in kernel))):
        ranges = [_clipped_range(o * d - lo, s, n, m)
                  for o, d, (lo, _), s, n, m in zip(offsets, dilation, padding, stride, size, out_sizes)]
        if None not in ranges:
            yield k, (slice(None),) * 2 + tuple(r[0] for r in ranges), (slice(None),) * 2 + tuple(r[1] for r in ranges)


def _np_col2im(cols, size, kernel, stride, padding, dilation):
    out_sizes = window_output_sizes(size, kernel, stride, padding, dilation)
    ck, nl = cols.shape
    c, n = ck // math.prod(kernel), nl // math.prod(out_sizes)
    out = np.zeros((n, c) + tuple(size), cols.dtype)
    blocks = cols.reshape((c, math.prod(kernel), n) + out_sizes)
    for k, from_key, to_key in _clipped_window_slices(kernel, stride, padding, dilation, size, out_sizes):
        out[to_key] += blocks[:, k].swapaxes(0, 1)[from_key]
    return out


def _pool_fill(dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _np_max_pool(x, kernel, stride, padding, dilation):
    out_sizes = window_output_sizes(x.shape[2:], kernel, stride, padding, dilation)
    xp = _np_padded(x, padding, _pool_fill(x.dtype))
    out = None
    for _, key in _window_slices(kernel, stride, dilation, out_sizes):
        out = xp[key].copy() if out is None else np.maximum(out, xp[key], out=out)
    return out


def _np_window_argmax(x, kernel, stride, padding, dilation):
    """(each window's position of its maximum, the output sizes): the first maximum wins; a nan wins (the last
    one), as in torch."""
    out_sizes = window_output_sizes(x.shape[2:], kernel, stride, padding, dilation)
    xp = _np_padded(x, padding, _pool_fill(x.dtype))
    best, arg = None, None
    for k, key in _window_slices(kernel, stride, dilation, out_sizes):
        v = xp[key]
        if best is None:
            best, arg = v.copy(), np.zeros(v.shape, np.int64)
            continue
        better = v > best
        if x.dtype.kind == "f":
            better |= np.isnan(v)
        np.copyto(best, v, where=better)
        arg[better] = k
    return arg, out_sizes


def _np_max_pool_backward(g, x, kernel, stride, padding, dilation):
    arg, out_sizes = _np_window_argmax(x, kernel, stride, padding, dilation)
    out = np.zeros(x.shape, g.dtype)
    for k, from_key, to_key in _clipped_window_slices(kernel, stride, padding, dilation, x.shape[2:], out_sizes):
        out[to_key] += np.where(arg[from_key] == k, g[from_key], 0)
    return out


def _np_max_pool_pick(gg, x, kernel, stride, padding, dilation):
    """The adjoint of max_pool_backward in its gradient: each window's value of gg (x's shape) at x's maximum."""
    arg, out_sizes = _np_window_argmax(x, kernel, stride, padding, dilation)
    ggp = _np_padded(gg, padding, 0)
    out = np.zeros(arg.shape, gg.dtype)
    for k, key in _window_slices(kernel, stride, dilation, out_sizes):
        np.copyto(out, ggp[key], where=arg == k)
    return out


def _check_window_input(op, shape, kernel):
    if len(shape) != len(kernel) + 2:
        raise ShapeError(f"{op.name}: expected an input of {len(kernel) + 2} dims (N, C, spatial...), "
                         f"got {_fmt(shape)}")


def _window_rule(op, shapes, attrs, dtypes):
    """im2col: (N, C, *spatial) -> (C * K, N * L); max_pool: (N, C, *spatial) -> (N, C, *out)."""
    shape, kernel = shapes[0], attrs["kernel"]
    _check_window_input(op, shape, kernel)
    out = window_output_sizes(shape[2:], kernel, attrs["stride"], attrs["padding"], attrs["dilation"])
    if any(o < 1 for o in out):
        raise ShapeError(f"{op.name}: input {_fmt(shape)} is too small for windows of {_fmt(kernel)}")
    if op.name == "im2col":
        return (shape[1] * math.prod(kernel), shape[0] * math.prod(out))
    return tuple(shape[:2]) + out


def _col2im_rule(op, shapes, attrs, dtypes):
    shape, kernel, size = shapes[0], attrs["kernel"], attrs["size"]
    k = math.prod(kernel)
    out = math.prod(window_output_sizes(size, kernel, attrs["stride"], attrs["padding"], attrs["dilation"]))
    if len(shape) != 2 or shape[0] % k or shape[1] % out:
        raise ShapeError(f"col2im: expected columns (C * {k}, N * {out}), got {_fmt(shape)}")
    return (shape[1] // out, shape[0] // k) + tuple(size)


def _max_pool_backward_rule(op, shapes, attrs, dtypes):
    g, x = shapes
    _check_window_input(op, x, attrs["kernel"])
    out = window_output_sizes(x[2:], attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"])
    if tuple(g) != tuple(x[:2]) + out:
        raise ShapeError(f"max_pool_backward: gradient {_fmt(g)} does not match the pooled {_fmt(x)}")
    return tuple(x)


def _max_pool_pick_rule(op, shapes, attrs, dtypes):
    gg, x = shapes
    _check_window_input(op, x, attrs["kernel"])
    if tuple(gg) != tuple(x):
        raise ShapeError(f"max_pool_pick: values {_fmt(gg)} do not match the pooled input {_fmt(x)}")
    return tuple(x[:2]) + window_output_sizes(x[2:], attrs["kernel"], attrs["stride"], attrs["padding"],
                                              attrs["dilation"])


def _window_attrs(**attrs):
    return {k: attrs[k] for k in ("kernel", "stride", "padding", "dilation")}


_WINDOW = ("kernel", "stride", "padding", "dilation")
_register(OpDef("im2col", Kind.OTHER, 1, _np_im2col, _window_rule, _keep, attr_names=_WINDOW, kernel_kind="window",
                vjp=(lambda g, out, x, **a: apply("col2im", g, size=tuple(x.shape[2:]), **_window_attrs(**a)),)))
_register(OpDef("col2im", Kind.OTHER, 1, _np_col2im, _col2im_rule, _keep, attr_names=("size",) + _WINDOW,
                kernel_kind="window", vjp=(lambda g, out, cols, size, **a: apply("im2col", g, **_window_attrs(**a)),)))
_register(OpDef("max_pool", Kind.OTHER, 1, _np_max_pool, _window_rule, _keep, attr_names=_WINDOW, kernel_kind="window",
                vjp=(lambda g, out, x, **a: apply("max_pool_backward", g, x, **_window_attrs(**a)),), saves=(0,)))
# linear in g: its adjoint (max_pool_pick) picks g at each window's maximum, and the two are each other's rules, so
# max pooling has a double backward; both are piecewise constant in x (a zero derivative)
_register(OpDef("max_pool_backward", Kind.OTHER, 2, _np_max_pool_backward, _max_pool_backward_rule, _promote,
                attr_names=_WINDOW, kernel_kind="window", cast_inputs=(0,), saves=(1,),
                vjp=(lambda gg, out, g, x, **a: apply("max_pool_pick", gg, x, **_window_attrs(**a)),
                     lambda gg, out, g, x, **a: gg.new_zeros(x.shape))))
_register(OpDef("max_pool_pick", Kind.OTHER, 2, _np_max_pool_pick, _max_pool_pick_rule, _promote,
                attr_names=_WINDOW, cast_inputs=(0,), saves=(1,),
                vjp=(lambda g, out, gg, x, **a: apply("max_pool_backward", g, x, **_window_attrs(**a)),
                     lambda g, out, gg, x, **a: g.new_zeros(x.shape))))


# Winograd convolution (runtime/_winograd.py): a 3x3, stride-1 convolution as filter, input and output transforms
# around T*T batched products, T = tile + 2. Eager conv2d keeps im2col; nnc's winograd pass rewrites into these.
# Each is linear, and its derivative is its adjoint (the `*_backward` op), whose derivative is the op again.
def _winograd_check(op, shape, ndim, tile):
    if len(shape) != ndim:
        raise ShapeError(f"{op.name}: expected {ndim} dims, got {_fmt(shape)}")
    if tile not in _wg.TILES:
        raise ShapeError(f"{op.name}: output tiles of {tile} x {tile} are not built (only {_wg.TILES})")


def _winograd_input_rule(op, shapes, attrs, dtypes):
    """x (N, C, H, W) -> V (T*T, C, N * tiles)."""
    (shape,), tile = shapes, attrs["tile"]
    _winograd_check(op, shape, 4, tile)
    out = _wg.output_sizes(shape[2:], attrs["padding"])
    if any(o < 1 for o in out):
        raise ShapeError(f"{op.name}: input {_fmt(shape)} is too small for a 3 x 3 window")
    th, tw = _wg.tile_counts(out, tile)
    return ((tile + 2) ** 2, shape[1], shape[0] * th * tw)


def _winograd_input_backward_rule(op, shapes, attrs, dtypes):
    """dV (T*T, C, N * tiles) -> dx (N, C, *size)."""
    (shape,), tile, size = shapes, attrs["tile"], tuple(attrs["size"])
    _winograd_check(op, shape, 3, tile)
    tiles = math.prod(_wg.tile_counts(_wg.output_sizes(size, attrs["padding"]), tile))
    if shape[0] != (tile + 2) ** 2 or shape[2] % tiles:
        raise ShapeError(f"{op.name}: expected ({(tile + 2) ** 2}, C, N * {tiles}), got {_fmt(shape)}")
    return (shape[2] // tiles, shape[1]) + size


def _winograd_filter_rule(op, shapes, attrs, dtypes):
    """w (O, C, 3, 3) -> U (T*T, O, C)."""
    (shape,), tile = shapes, attrs["tile"]
    _winograd_check(op, shape, 4, tile)
    if tuple(shape[2:]) != (3, 3):
        raise ShapeError(f"{op.name}: expected a 3 x 3 filter (O, C, 3, 3), got {_fmt(shape)}")
    return ((tile + 2) ** 2, shape[0], shape[1])


def _winograd_filter_backward_rule(op, shapes, attrs, dtypes):
    """dU (T*T, O, C) -> dw (O, C, 3, 3)."""
    (shape,), tile = shapes, attrs["tile"]
    _winograd_check(op, shape, 3, tile)
    if shape[0] != (tile + 2) ** 2:
        raise ShapeError(f"{op.name}: expected ({(tile + 2) ** 2}, O, C), got {_fmt(shape)}")
    return (shape[1], shape[2], 3, 3)


def _winograd_output_rule(op, shapes, attrs, dtypes):
    """M (T*T, O, N * tiles) -> Y (O, N * Ho * Wo)."""
    (shape,), tile, size = shapes, attrs["tile"], tuple(attrs["size"])
    _winograd_check(op, shape, 3, tile)
    tiles = math.prod(_wg.tile_counts(size, tile))
    if shape[0] != (tile + 2) ** 2 or shape[2] % tiles:
        raise ShapeError(f"{op.name}: expected ({(tile + 2) ** 2}, O, N * {tiles}), got {_fmt(shape)}")
    return (shape[1], shape[2] // tiles * math.prod(size))


def _winograd_output_backward_rule(op, shapes, attrs, dtypes):
    """dY (O, N * Ho * Wo) -> dM (T*T, O, N * tiles)."""
    (shape,), tile, size = shapes, attrs["tile"], tuple(attrs["size"])
    _winograd_check(op, shape, 2, tile)
    if shape[1] % math.prod(size):
        raise ShapeError(f"{op.name}: expected (O, N * {math.prod(size)}), got {_fmt(shape)}")
    return ((tile + 2) ** 2, shape[0], shape[1] // math.prod(size) * math.prod(_wg.tile_counts(size, tile)))


def _winograd_output_bias_rule(op, shapes, attrs, dtypes):
    """M (T*T, O, N * tiles), bias (O,) -> Y (N, O, Ho, Wo)."""
    (shape, bias), size = shapes, tuple(attrs["size"])
    o, nl = _winograd_output_rule(op, (shape,), attrs, dtypes)
    if tuple(bias) != (o,):
        raise ShapeError(f"{op.name}: expected a bias of ({o},), got {_fmt(bias)}")
    return (nl // math.prod(size), o) + size


def _winograd_output_bias_grad(g, out, relu):
    """The gradient before the relu (zero where it clipped)."""
    return g.where(out > 0, 0.0) if relu else g


def _winograd_output_bias_dy(g, out, relu):
    """The gradient before the relu in the product layout (O, N * Ho * Wo), as winograd_output_backward reads it.

    NOTE: the bias's gradient sums it along its rows too: summed over dims (0, 2, 3) of (N, O, Ho, Wo) instead, as
    one kernel with the relu's mask, it took 3.2 ms of the MNIST CNN's training step against 0.4 ms."""
    return _winograd_output_bias_grad(g, out, relu).permute(1, 0, 2, 3).reshape(out.shape[1], -1)


def _winograd_output_bias_vjp_m(g, out, m, bias, tile, size, relu):
    return apply("winograd_output_backward", _winograd_output_bias_dy(g, out, relu), tile=tile, size=size)


def _winograd(name, forward, rule, attr_names, vjp):
    _register(OpDef(name, Kind.OTHER, 1, forward, rule, _keep, attr_names=attr_names, kernel_kind="winograd",
                    vjp=(vjp,)))


_winograd("winograd_input", _wg.np_input, _winograd_input_rule, ("tile", "padding"),
          lambda g, out, x, tile, padding: apply("winograd_input_backward", g, size=tuple(x.shape[2:]), tile=tile,
                                                 padding=padding))
_winograd("winograd_input_backward", _wg.np_input_backward, _winograd_input_backward_rule, ("size", "tile", "padding"),
          lambda g, out, dv, size, tile, padding: apply("winograd_input", g, tile=tile, padding=padding))
_winograd("winograd_filter", _wg.np_filter, _winograd_filter_rule, ("tile",),
          lambda g, out, w, tile: apply("winograd_filter_backward", g, tile=tile))
_winograd("winograd_filter_backward", _wg.np_filter_backward, _winograd_filter_backward_rule, ("tile",),
          lambda g, out, du, tile: apply("winograd_filter", g, tile=tile))
_winograd("winograd_output", _wg.np_output, _winograd_output_rule, ("tile", "size"),
          lambda g, out, m, tile, size: apply("winograd_output_backward", g, tile=tile, size=size))
_winograd("winograd_output_backward", _wg.np_output_backward, _winograd_output_backward_rule, ("tile", "size"),
          lambda g, out, dy, tile, size: apply("winograd_output", g, tile=tile, size=size))
# affine, not linear: its derivative for M is the output transform's adjoint after the relu's mask
_register(OpDef("winograd_output_bias", Kind.OTHER, 2, _wg.np_output_bias, _winograd_output_bias_rule, _keep,
                attr_names=("tile", "size", "relu"), kernel_kind="winograd", saves=("out",),
                vjp=(_winograd_output_bias_vjp_m,
                     lambda g, out, m, bias, tile, size, relu: _winograd_output_bias_dy(g, out, relu).sum(dim=1))))


del E


# ---------------------------------------------------------------------------------------------
# Counter-based random numbers (Philox-4x32-10, runtime/_philox.py), for compilers: a random draw is
# `random_seed()` (a 64-bit seed from runtime's generator, drawn anew by every call) and an elementwise op of it and
# of each element's index, so a kernel computes any element on its own, and a backward regenerates a dropout mask
# from the seed instead of saving it. Eager runtime.rand keeps numpy's stream; nnc's decompose uses these.
# ---------------------------------------------------------------------------------------------

def _np_random_seed():
    from .random import default_generator

    return np.array(default_generator.numpy.integers(0, 2 ** 63, dtype=np.int64), dtype=np.int64)


def _seed_dtype(op, operands, attrs):
    return None, dt.int64


def _draw_dtype(op, operands, attrs):
    if operands[0].dtype is not dt.int64 or operands[0].ndim != 0:
        raise TypeError(f"{op.name}(): the seed must be a 0-dim int64 tensor, got {operands[0].dtype} with "
                        f"{operands[0].ndim} dims")
    if attrs["dtype"] not in (dt.float32, dt.float64):
        raise TypeError(f"{op.name}(): draws float32 or float64 values, not {attrs['dtype']}")
    return None, attrs["dtype"]


def _philox_draw(distribution):
    def forward(seed, shape, dtype, stream):
        return _philox.draw(int(seed), shape, stream, dtype.np, distribution)

    forward.__name__ = f"_np_philox_{distribution}"
    return forward


_register(OpDef("random_seed", Kind.OTHER, 0, _np_random_seed, lambda op, shapes, attrs, dtypes: (), _seed_dtype,
                draws_random=True))
# uniform in [0, 1) and standard normal; `stream` tells apart the draws of one graph under one seed
for _distribution in ("uniform", "normal"):
    _register(OpDef(f"philox_{_distribution}", Kind.ELEMENTWISE, 1, _philox_draw(_distribution), _full_rule,
                    _draw_dtype, template=f"philox_{_distribution}({{0}}, {{1}})", vjp=(None,), cast_inputs=(),
                    attr_names=("shape", "dtype", "stream"), needs_index=True))


# ---------------------------------------------------------------------------------------------
# Complex numbers: which ops take complex64/complex128 tensors, the ops of their own, and torch's gradient
# convention. For a real loss L of z = x + iy torch's gradient is dL/dx + i dL/dy; for an op holomorphic in its
# inputs that makes an input's gradient g * conj(f'(z)), so the real rules above, g * f'(z) with real coefficients,
# serve complex inputs when they read conj(z) (`_conjugating`). Ops off these lists raise for complex tensors.
# ---------------------------------------------------------------------------------------------

HOLOMORPHIC = frozenset("""mul div pow exp log log1p sqrt rsqrt reciprocal sin cos tanh sigmoid tan sinh cosh expm1
    matmul linear prod cumprod""".split())
COMPLEX_OPS = HOLOMORPHIC | frozenset("""add sub neg eq ne logical_not logical_and logical_or all any where cast clone
    detach sum reshape permute expand getitem cat index_put gather scatter_add full constant_pad cumsum abs conj
    real imag complex view_as_real view_as_complex angle fft_c2c fft_r2c fft_c2r""".split())


def check_complex(op: OpDef) -> None:
    """torch's error for an op that does not take complex tensors (it has no order, or no rule here yet)."""
    if op.name not in COMPLEX_OPS:
        raise TypeError(f"{op.name}: complex tensors are not supported by this op")


def _conj(x):
    if is_tensor_like(x):
        return apply("conj", x) if x.dtype.is_complex else x
    return x.conjugate() if type(x) is complex else x


def _conjugating(rule):
    """A holomorphic op's rule g * f'(z) as the complex rule g * conj(f'(z)): f' has real coefficients, so
    f'(conj z) = conj(f'(z)), and the rule reads the conjugates of the op's inputs and output."""

    def complex_rule(g, out, *inputs, **attrs):
        if not any(is_tensor_like(x) and x.dtype.is_complex or type(x) is complex for x in (out,) + inputs):
            return rule(g, out, *inputs, **attrs)
        return rule(g, _conj(out), *[_conj(x) for x in inputs], **attrs)

    return complex_rule


# the holomorphic ops' rules conjugate what they read when complex values come (wrapped once, here)
for _name in HOLOMORPHIC:
    OPS[_name] = replace(OPS[_name], vjp=tuple(r and _conjugating(r) for r in OPS[_name].vjp))


def _sgn(z):
    """z / |z|, 0 where z is 0: the gradient of |z|."""
    magnitude = apply("abs", z)
    return (z / magnitude.where(magnitude != 0, 1.0)).where(magnitude != 0, 0.0)


def _part_dtype(op, operands, attrs):
    d = operands[0].dtype
    if not d.is_complex:
        raise RuntimeError(f"{op.name}: expected a complex tensor, got {d}")
    return None, d.to_real()


def _angle_dtype(op, operands, attrs):
    d = operands[0].dtype
    if d.is_complex:
        return None, d.to_real()
    return _to_float(op, operands, attrs)


def _complex_dtype(op, operands, attrs):
    a, b = (x.dtype if is_tensor_like(x) else None for x in operands)
    if a is not b or a not in (dt.float32, dt.float64):
        raise RuntimeError(f"complex(): expected both inputs to be float or double tensors of one dtype, "
                           f"got {a} and {b}")
    return None, a.to_complex()


def _view_as_complex_dtype(op, operands, attrs):
    d = operands[0].dtype
    if d not in (dt.float32, dt.float64):
        raise RuntimeError(f"view_as_complex is only supported for float and double tensors, but got a tensor of "
                           f"dtype {d}")
    return None, d.to_complex()


def _view_as_real_rule(op, shapes, attrs, dtypes):
    return tuple(shapes[0]) + (2,)


def _view_as_complex_rule(op, shapes, attrs, dtypes):
    shape = tuple(shapes[0])
    if not shape or shape[-1] != 2:
        raise ShapeError(f"view_as_complex: Tensor must have a last dimension of size 2, got shape {_fmt(shape)}")
    return shape[:-1]


def _np_complex(real, imag):
    out = np.empty(np.broadcast_shapes(np.shape(real), np.shape(imag)), dtype=np.result_type(real, imag, 1j))
    out.real, out.imag = real, imag
    return out


def _np_view_as_real(z):
    parts = z.real  # float values at z's strides: the real parts, each followed by its imaginary part
    return np.lib.stride_tricks.as_strided(parts, z.shape + (2,), parts.strides + (parts.itemsize,))


def _np_view_as_complex(x):
    if x.strides[-1] != x.itemsize:
        raise RuntimeError("view_as_complex: Tensor must have a last dimension with stride 1")
    if any(st % (2 * x.itemsize) for st, size in zip(x.strides[:-1], x.shape[:-1]) if size > 1):
        raise RuntimeError("view_as_complex: Tensor must have a stride divisible by 2 for all but last dimension")
    return x.view(np.complex64 if x.dtype == np.float32 else np.complex128)[..., 0]


def _angle_vjp(g, out, z):
    if not z.dtype.is_complex:
        return g.new_zeros(z.shape)
    return (g * z * 1j / (apply("abs", z) ** 2)).where(z != 0, 0.0)


# NOTE: kind other, not elementwise: no code generator has complex arithmetic (nnc runs complex values in numpy)
_register(OpDef("conj", Kind.OTHER, 1, np.conjugate, _same_shape_rule, _keep,
                vjp=(lambda g, out, z: apply("conj", g),)))
_register(OpDef("complex", Kind.OTHER, 2, _np_complex, _broadcast_rule, _complex_dtype,
                vjp=(lambda g, out, re, im: apply("real", g), lambda g, out, re, im: apply("imag", g))))
_register(OpDef("angle", Kind.OTHER, 1, np.angle, _same_shape_rule, _angle_dtype, vjp=(_angle_vjp,),
                saves=(0,)))
# the parts and the pair view share the complex tensor's memory, as torch's do; real's gradient is real, which
# the input's complex dtype takes as it is, and imag's is i times it
_register(OpDef("real", Kind.OTHER, 1, np.real, _same_shape_rule, _part_dtype, is_view=True,
                vjp=(lambda g, out, z: g,)))
_register(OpDef("imag", Kind.OTHER, 1, np.imag, _same_shape_rule, _part_dtype, is_view=True,
                vjp=(lambda g, out, z: g * 1j,)))
_register(OpDef("view_as_real", Kind.OTHER, 1, _np_view_as_real, _view_as_real_rule, _part_dtype, is_view=True,
                vjp=(lambda g, out, z: apply("complex", g[..., 0], g[..., 1]),)))
_register(OpDef("view_as_complex", Kind.OTHER, 1, _np_view_as_complex, _view_as_complex_rule,
                _view_as_complex_dtype, is_view=True, vjp=(lambda g, out, x: apply("view_as_real", g),)))


# Discrete Fourier transforms over `dims` (numpy's pocketfft), torch's three primitives: complex to complex (forward or
# inverse), real to the half spectrum along the last of dims, and a half spectrum back to real values of `last_size`
# along it. `norm` scales as numpy's and torch's do ("backward": the inverse by 1/n, "forward": the forward by 1/n,
# "ortho": both by 1/sqrt(n)). Each is linear, and its rule is its adjoint: the transform the other way under the
# dual norm (`_DUAL_NORM`), through the half spectrum's zero padding or its doubled interior bins for the real ones.
_DUAL_NORM = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


def _fft_c2c_dtype(op, operands, attrs):
    d = operands[0].dtype
    if not d.is_complex:
        raise RuntimeError(f"{op.name}: expected a complex input, got {d}")
    return None, d


def _fft_r2c_dtype(op, operands, attrs):
    d = operands[0].dtype
    if d not in (dt.float32, dt.float64):
        raise RuntimeError(f"{op.name}: expected a float or double input, got {d}")
    return None, d.to_complex()


def _fft_r2c_rule(op, shapes, attrs, dtypes):
    shape, last = list(shapes[0]), attrs["dims"][-1]
    shape[last] = shape[last] // 2 + 1
    return tuple(shape)


def _fft_c2r_rule(op, shapes, attrs, dtypes):
    shape, last = list(shapes[0]), attrs["dims"][-1]
    if shape[last] != attrs["last_size"] // 2 + 1:
        raise ShapeError(f"fft_c2r: a half spectrum of {attrs['last_size']} values has {attrs['last_size'] // 2 + 1} "
                         f"bins along dim {last}, got {shape[last]}")
    shape[last] = attrs["last_size"]
    return tuple(shape)


def _np_fft_c2c(x, dims, norm, forward):
    return (np.fft.fftn if forward else np.fft.ifftn)(x, axes=dims, norm=norm)


def _np_fft_r2c(x, dims, norm):
    return np.fft.rfftn(x, axes=dims, norm=norm)


def _np_fft_c2r(x, dims, norm, last_size):
    sizes = [x.shape[d] for d in dims[:-1]] + [last_size]
    return np.fft.irfftn(x, s=sizes, axes=dims, norm=norm)


def _fft_c2c_vjp(g, out, x, dims, norm, forward):
    return apply("fft_c2c", g, dims=dims, norm=_DUAL_NORM[norm], forward=not forward)


def _fft_r2c_vjp(g, out, x, dims, norm):
    """The inverse transform of the half spectrum's gradient padded with zeros to the whole spectrum, real part."""
    last = dims[-1]
    pads = tuple((0, x.shape[last] - g.shape[last], 0) if d == last else (0, 0, 0) for d in range(g.ndim))
    whole = apply("constant_pad", g, pads=pads, value=0)
    return apply("real", apply("fft_c2c", whole, dims=dims, norm=_DUAL_NORM[norm], forward=False))


def _fft_c2r_vjp(g, out, x, dims, norm, last_size):
    """The half spectrum of the gradient, its interior bins doubled: each stands for itself and its conjugate."""
    last, bins = dims[-1], x.shape[dims[-1]]
    spectrum = apply("fft_r2c", g, dims=dims, norm=_DUAL_NORM[norm])
    edges = 1 + (last_size % 2 == 0 and bins > 1)  # the zero bin, and the Nyquist bin of an even length
    pieces = [g.new_full((1,), 1.0)] + ([g.new_full((bins - edges,), 2.0)] if bins > edges else [])
    pieces += [g.new_full((1,), 1.0)] if edges == 2 else []
    weights = apply("cat", *pieces, dim=0).reshape(tuple(bins if d == last else 1 for d in range(g.ndim)))
    return spectrum * weights


_register(OpDef("fft_c2c", Kind.OTHER, 1, _np_fft_c2c, _same_shape_rule, _fft_c2c_dtype, vjp=(_fft_c2c_vjp,),
                attr_names=("dims", "norm", "forward")))
_register(OpDef("fft_r2c", Kind.OTHER, 1, _np_fft_r2c, _fft_r2c_rule, _fft_r2c_dtype, vjp=(_fft_r2c_vjp,),
                attr_names=("dims", "norm")))
_register(OpDef("fft_c2r", Kind.OTHER, 1, _np_fft_c2r, _fft_c2r_rule, _part_dtype, vjp=(_fft_c2r_vjp,),
                attr_names=("dims", "norm", "last_size")))
