"""Functionalization: in-place writes become pure ops, and writes into inputs and buffers extra graph outputs.

Pure ops are recorded in decompose; the extra outputs are made by the pipeline's functionalize stage.

As torch's functionalization does, every MetaValue belongs to a *storage*: the value it was computed as, or, for
a view (reshape, permute, expand, basic indexing, detach, wherever numpy makes a view), the value it views. A
storage's current value is a graph node. An in-place op `x.add_(y)` records `add(x, y)` (cast to x's dtype,
broadcast to its shape) and makes it x's current value; through a view, the new value is scattered back into the
base (`index_put` for an indexed view, the inverse permute or reshape otherwise). Every other MetaValue of that
storage sees the write on its next read: a view is regenerated from the new base by replaying its view ops. So
the decomposed graph is pure, and CSE, DCE, fusion and memory planning never see a mutation.

A written storage whose root is a graph input or a parameter/buffer ends in a `write_back(dest, value)` node.
The functionalize stage turns those into extra outputs: the graph returns (outputs, final values), and the
compiled module copies each value into its tensor after the run (same memory, version bumped and, while
recording, the new history), as eager's in-place op would have. BatchNorm's running statistics are written so.

What cannot be expressed (a write into an expanded view, an in-place op that would change the dtype category or
the shape, a random in-place fill, a trainable parameter written while recording) raises FunctionalizeError,
which decompose does not turn into an opaque node: the compile fails and the module runs eagerly, which raises
the user's error or does the right thing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime import api, factories
from runtime.autograd import grad_mode, no_grad
from runtime.ops import OPS, apply
from runtime.tensor import Tensor

from ..graph import fetch_attr, has_side_effect
from ..symbolic import Shape, hint_of
from ..trace import INPLACE_METHODS


class FunctionalizeError(RuntimeError):
    """A mutation the compiler cannot turn into pure ops (the whole compile falls back to eager)."""


class Storage:
    """The memory a base value and its views share: its current value (a node), its root and a version."""

    __slots__ = ("root", "node", "version", "layout", "views", "written_with_grad", "gradless", "read_as_attribute")

    def __init__(self, node):
        self.root = node      # the node that first computed this memory (a placeholder, get_attr or any op)
        self.node = node      # its current value
        self.version = 0      # bumped by every write
        # NOTE: a byte array of the root's shape, never touched (np.empty maps no pages): replaying view ops on it
        # tells whether numpy makes a view or a copy, exactly as eager decides for the real arrays.
        self.layout = None
        self.views = 0        # views taken of it so far
        self.written_with_grad = False  # written by a node not recorded under no_grad
        self.gradless = False  # carries no history: made under no_grad or a constant, since written under no_grad only
        self.read_as_attribute = None  # an opaque attribute read (`x.some_view`): its memory may be another value's

    @property
    def written(self) -> bool:
        return self.version > 0

    def layout_array(self) -> np.ndarray:
        if self.layout is None:
            # NOTE: symbolic sizes (nnc.symbolic) at their hints: with every dynamic size >= 2, whether numpy views
            # or copies depends on which dims are merged or moved, not on their sizes
            # NOTE: of the root's dtype (memory untouched), so that views reinterpreting it (view_as_real of a
            # complex value, view_as_complex) see its element size
            self.layout = np.empty(hint_of(self.root.meta["shape"]), dtype=self.root.meta["dtype"].np)
        return self.layout


def track_view(result, op, inputs, attrs) -> None:
    """Make `result` (just emitted) a view of inputs[0]'s storage when eager's op would return a view."""
    source = inputs[0] if inputs else None
    if not op.is_view or not hasattr(source, "storage") or source.storage is None:
        return
    if op.name == "getitem" and len(inputs) > 1:  # indexing with tensors copies, in numpy as in torch
        return
    step = (op, dict(attrs))
    parent_layout = _layout_of(source)
    child_layout = op.forward(parent_layout, **hint_of(attrs))
    if not np.may_share_memory(child_layout, parent_layout):
        return  # numpy copies here (a reshape of a non-contiguous view): a value of its own
    result.storage, result.chain, result.seen = source.storage, source.chain + (step,), source.storage.version
    source.storage.views += 1


def _layout_of(value) -> np.ndarray:
    layout = value.storage.layout_array()
    for op, attrs in value.chain:
        layout = op.forward(layout, **hint_of(attrs))
    return layout


def current_node(value):
    """The node holding `value`'s current contents: its storage's value, through its view ops (and detached when
    detach_ was called on it)."""
    if value.own_history:
        # NOTE: torch keeps such an alias's own history (the write's) while its data follows the base: not a
        # value the graph can express
        raise FunctionalizeError("a .detach() alias written in place, then its memory written again; it runs "
                                 "eagerly")
    builder = value.builder
    node = value.storage.node
    for op, attrs in value.chain:
        node = builder.emit_node(op, (node,), attrs)
    if value.detached:
        node = builder.emit_node(OPS["detach"], (node,), {})
    return node


def write(target, new) -> object:
    """target's contents become `new` (cast to its dtype, broadcast to its shape); returns target. Under no_grad the
    values change and the history does not, as in eager: the tracer lets such a write reach only values without
    history (buffers, constants, values made under no_grad), so `new` is written detached."""
    builder = target.builder
    storage = target.storage
    if storage.read_as_attribute is not None:
        raise FunctionalizeError(f"an in-place write into `{storage.read_as_attribute}`, an attribute the graph reads "
                                 f"opaquely: it may share another tensor's memory, so the write runs eagerly")
    new = _as_written(target, new)
    if builder.origin is not None and builder.origin.meta.get("no_grad"):
        if storage.written_with_grad:
            raise FunctionalizeError("an in-place write under no_grad into a value written earlier with gradients "
                                     "recorded; it runs eagerly")
        new = api.detach(new)
    else:
        storage.written_with_grad, storage.gradless = True, False
    if not target.chain:
        storage.node = builder.graph_arg(new)
    else:
        storage.node = _scatter(target, new)
    storage.version += 1
    builder.writes += 1
    target._node, target.seen = builder.graph_arg(new), storage.version
    target.detached = False  # as eager: a write after detach_ rebases the tensor onto the write's history
    target.own_history = any(op.name == "detach" for op, _ in target.chain)
    return target


def _as_written(target, new):
    """`new` as eager writes it into target's memory: same dtype (a same-category cast), same shape."""
    if not isinstance(new, Tensor) and not hasattr(new, "node"):
        new = factories.tensor(new, dtype=target.dtype)  # a constant, broadcast below
    if new.dtype is not target.dtype:
        if new.dtype.category > target.dtype.category:
            raise FunctionalizeError(f"result type {new.dtype.name} can't be cast to the desired output type "
                                     f"{target.dtype.name}")
        new = api.to_dtype(new, target.dtype)
    if Shape(new.shape) != Shape(target.shape):
        try:
            new = api.expand(new, tuple(target.shape))
        except Exception as error:
            raise FunctionalizeError(f"in-place result of shape {list(new.shape)} does not fit a tensor of shape "
                                     f"{list(target.shape)}") from error
    return new


def _scatter(view, new):
    """The root's new value after writing `new` through view's chain of view ops."""
    builder = view.builder
    values = [view.storage.node]  # the value at each level of the chain, root first
    for op, attrs in view.chain[:-1]:
        values.append(builder.emit_node(op, (values[-1],), attrs))
    current = builder.graph_arg(new)
    for (op, attrs), parent in zip(reversed(view.chain), reversed(values)):
        current = _inverse(builder, op, attrs, parent, current)
    return current


_COMPLEX_PARTS = ("real", "imag")


def _inverse(builder, op, attrs, parent, child):
    """parent's new value when its view `op(parent, **attrs)` now holds `child` (both nodes)."""
    name = op.name
    if name == "reshape":
        return builder.emit_node(op, (child,), {"shape": tuple(parent.meta["shape"])})
    if name == "permute":
        dims = attrs["dims"]
        inverse = tuple(sorted(range(len(dims)), key=dims.__getitem__))
        return builder.emit_node(op, (child,), {"dims": inverse})
    if name == "getitem":
        return builder.emit_node(OPS["index_put"], (parent, child), {"key": attrs["key"], "accumulate": False})
    if name in _COMPLEX_PARTS:  # a complex parent rebuilt from its parts, one of them the child
        real = child if name == "real" else builder.emit_node(OPS["real"], (parent,), {})
        imag = child if name == "imag" else builder.emit_node(OPS["imag"], (parent,), {})
        return builder.emit_node(OPS["complex"], (real, imag), {})
    if name == "view_as_real":
        parts = [builder.emit_node(OPS["getitem"], (child,), {"key": (("ellipsis",), ("int", k))}) for k in (0, 1)]
        return builder.emit_node(OPS["complex"], tuple(parts), {})
    if name == "view_as_complex":
        return builder.emit_node(OPS["view_as_real"], (child,), {})
    if name == "detach":  # the new value, with the gradient path of the old one (autograd never saw the write)
        difference = builder.emit_node(OPS["sub"], (child, parent), {})
        return builder.emit_node(OPS["add"], (parent, builder.emit_node(OPS["detach"], (difference,), {})), {})
    raise FunctionalizeError("unsupported operation: more than one element of the written-to tensor refers to a "
                             "single memory location (a write into an expanded view)")


# -- in-place methods on MetaValue -------------------------------------------------------------------------


def _method(base: str):
    def inplace(self, *args, **kwargs):
        return write(self, api.METHODS[base](self, *args, **kwargs))

    inplace.__name__ = base + "_"
    return inplace


def _addcmul_(self, tensor1, tensor2, *, value=1):
    return write(self, api.addcmul(self, tensor1, tensor2, value=value))


def _addcdiv_(self, tensor1, tensor2, *, value=1):
    return write(self, api.addcdiv(self, tensor1, tensor2, value=value))


def _lerp_(self, end, weight):
    return write(self, api.lerp(self, end, weight))


# NOTE: as eager does, fill_, zero_ and copy_ are `self[...] = value`: the result still depends on self (with a zero
# gradient), so it requires grad when self does.
def _fill_(self, value):
    _setitem(self, Ellipsis, value)
    return self


def _zero_(self):
    return _fill_(self, 0)


def _copy_(self, src, non_blocking=False):
    return _fill_(self, src)


def _fill_diagonal_(self, fill_value, wrap=False):
    _setitem(self, api.fill_diagonal_key(self, wrap), fill_value)
    return self


def _detach_(self):
    """Eager's detach_ changes the tensor object, not its memory: only this value stops carrying gradients (an
    input's is detached after the run too; an attribute's, or a view's, which eager refuses, runs eagerly)."""
    root, storage = self.storage.root, self.storage
    if root.op == "get_attr" or (root.op == "placeholder" and (self.chain or storage.views or storage.written)):
        # NOTE: what eager then does to the input's views and earlier writes (rebases, leaf errors) is torch's
        # view bookkeeping, which the compiled graph does not keep: only a plain input is detached after the run
        raise FunctionalizeError("detach_ of a parameter, a buffer, a view, or an input with views or writes "
                                 "changes state the compiled graph cannot; it runs eagerly")
    if root.op == "placeholder" and not self.detached:
        node = self.builder.node("call_function", detach_back, (root,))
        node.meta["opaque_reason"] = f"detaches the input {root.name} after the run (detach_ in forward)"
    self.detached = True
    self._node = self.builder.emit_node(OPS["detach"], (self._node,), {})
    return self


def _setitem(self, key, value) -> None:
    encoded, index_tensors = api.encode_index(self, key)
    write(self, apply("index_put", self, value, *index_tensors, key=encoded, accumulate=False))


def _drawn_fill(name: str, sample):
    """An in-place random fill (bernoulli_, uniform_, normal_) as a write of a counter-based draw: decompose's
    stand-ins make runtime.rand / runtime.randn philox nodes, so every run draws anew (never a frozen constant)."""

    def fill(self, *args, generator=None, **kwargs):
        if generator is not None or not self.dtype.is_floating_point:
            raise FunctionalizeError(f"in-place {name} with its own generator, or of a {self.dtype} tensor, cannot "
                                     f"be compiled (it runs eagerly)")
        return write(self, sample(self, *args, **kwargs).to(self.dtype))

    fill.__name__ = name
    return fill


def _bernoulli_sample(self, p=0.5):
    return (factories.rand(*self.shape, dtype=self.dtype) < p).to(self.dtype)


def _uniform_sample(self, a=0.0, b=1.0, *, from_=None, to=None):
    low, high = (a, b) if from_ is None else (from_, to)
    return factories.rand(*self.shape, dtype=self.dtype) * (high - low) + low


def _normal_sample(self, mean=0.0, std=1.0):
    return factories.randn(*self.shape, dtype=self.dtype) * std + mean


def _refuse(name: str):
    def refuse(self, *args, **kwargs):
        raise FunctionalizeError(f"in-place {name} cannot be compiled (it draws random numbers or changes "
                                 f"metadata)")

    return refuse


_OVERRIDES = {"detach_": _detach_, "addcmul_": _addcmul_, "addcdiv_": _addcdiv_, "lerp_": _lerp_,
              "fill_": _fill_, "zero_": _zero_, "copy_": _copy_, "fill_diagonal_": _fill_diagonal_,
              "bernoulli_": _drawn_fill("bernoulli_", _bernoulli_sample),
              "uniform_": _drawn_fill("uniform_", _uniform_sample),
              "normal_": _drawn_fill("normal_", _normal_sample)}


def install(cls) -> None:
    """Give MetaValue every in-place method of Tensor, functionalized, plus __setitem__ and the __i*__ family."""
    for name in INPLACE_METHODS:
        if name in _OVERRIDES:
            setattr(cls, name, _OVERRIDES[name])
        elif name[:-1] in api.METHODS:
            setattr(cls, name, _method(name[:-1]))
        else:
            setattr(cls, name, _refuse(name))
    cls.__setitem__ = _setitem
    for dunder, method in (("__iadd__", "add_"), ("__isub__", "sub_"), ("__imul__", "mul_"),
                           ("__itruediv__", "div_")):
        setattr(cls, dunder, getattr(cls, method))


# -- write-backs ----------------------------------------------------------------------------------------------


def write_back(dest: Tensor, value: Tensor) -> None:
    """Copy the final value of an input or buffer written in forward into the real tensor, as eager's in-place op
    would have: same memory, version bumped, and (while recording) its history now that of the new value."""
    recording = grad_mode.is_grad_enabled()
    if recording and dest._rg and dest._grad_fn is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    with no_grad():
        if isinstance(dest._data, np.ndarray):
            np.copyto(dest._data, value._data, casting="unsafe")
        else:  # a CUDA tensor: a copy kernel on the device
            from runtime.cuda.dispatch import copy_into

            copy_into(dest._data, value._data)
    if recording and (dest._rg or value._rg):  # eager rebases the written tensor onto the write's history
        dest._grad_fn, dest._out_nr, dest._rg = value._grad_fn, value._out_nr, value._rg
    dest._bump_version()


def add_write_backs(builder) -> None:
    """A write_back node for every written storage whose root is a graph input or a parameter or buffer (it keeps
    the final value alive until the functionalize stage makes it a graph output)."""
    for storage in builder.storages.values():
        root = storage.root
        if not storage.written or root.op not in ("placeholder", "get_attr"):
            continue
        if root.op == "get_attr" and root.target in builder.constants:
            if root.target in builder.fresh_constants:
                continue  # made anew on every call in eager: its writes matter only within the graph
            raise FunctionalizeError(f"forward writes in place into {root.target}, a tensor from outside the model; "
                                     f"it runs eagerly")
        node = builder.node("call_function", write_back, (root, storage.node))
        node.meta["opaque_reason"] = f"writes the new value of {root.name} back (an in-place write in forward)"


def returned_inputs(outputs) -> dict:
    """{output leaf position: placeholder name} for outputs that are an input written in place, returned as it
    is: eager returns that very tensor, so the caller substitutes it after the write."""
    from runtime.utils._pytree import flatten

    leaves, _ = flatten(outputs)
    found = {}
    for position, leaf in enumerate(leaves):
        storage = getattr(leaf, "storage", None)
        if storage is not None and storage.written and not leaf.chain and storage.root.op == "placeholder" \
                and leaf.node is storage.node:
            found[position] = storage.root.name
    return found


def detach_back(dest: Tensor) -> None:
    """An input detach_ed in forward is detached after the run, as eager's detach_ detaches the caller's tensor."""
    dest.detach_()


@dataclass(frozen=True)
class Write:
    """A tensor forward writes in place: an input (its position among the tensor inputs) or an attribute (its
    path); the graph returns its final value after the user's outputs, and the caller copies it in."""

    kind: str          # "input", "attribute", or "detach" (an input detach_ed: no value)
    where: int | str
    name: str


def writes_as_outputs(gm, needs_grad: bool) -> list[Write]:
    """Turn the graph's write_back nodes into extra outputs: the graph returns (outputs, (final values...)).

    A write into a parameter that requires grad while recording is refused (FunctionalizeError: the module runs
    eagerly, which raises torch's leaf error); an input that requires grad gets its new history when written."""
    graph = gm.graph
    inputs = [n for n in graph.placeholders if "shape" in n.meta]
    writes, values = [], []
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target is detach_back]:
        writes.append(Write("detach", inputs.index(node.args[0]), node.args[0].name))
        graph.erase_node(node)
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target is write_back]:
        dest, value = node.args
        if dest.op == "placeholder":
            writes.append(Write("input", inputs.index(dest), dest.name))
        else:
            if needs_grad and fetch_attr(gm, dest.target).requires_grad:
                raise FunctionalizeError(f"forward writes in place into {dest.target}, which requires grad")
            writes.append(Write("attribute", dest.target, dest.name))
        values.append(value)
        graph.erase_node(node)
    if writes:
        output = graph.output_node
        output.args = ((output.args[0], tuple(values)),)
    _check_pure(graph)
    gm.invalidate()
    return writes


def _check_pure(graph) -> None:
    """No node left that writes its arguments, except opaque calls (hooked modules), which run eagerly on values
    no later node shares."""
    for node in graph.nodes:
        if has_side_effect(node) and "opaque_reason" not in node.meta:
            raise FunctionalizeError(f"{node.name} still writes in place after functionalization")


def apply_writes(writes: list[Write], values, tensors: list, root) -> None:
    """Copy each written tensor's final value into it: inputs from `tensors`, attributes found from `root`."""
    values = iter(values)
    for write in writes:
        if write.kind == "detach":
            detach_back(tensors[write.where])
            continue
        dest = tensors[write.where] if write.kind == "input" else fetch_attr(root, write.where)
        write_back(dest, next(values))
