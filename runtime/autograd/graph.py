"""Autograd graph nodes: OpNode (one recorded primitive), AccumulateGrad (a leaf), and their hooks."""
from __future__ import annotations

import itertools
import sys
import weakref

import runtime.tensor as _tensor_mod  # NOTE: module import: tensor.py imports this module too.

from ..utils.hooks import RemovableHandle
from . import anomaly_mode, grad_mode, saved_hooks
from .saved_hooks import disable_saved_tensors_hooks, save_on_cpu, saved_tensors_hooks  # noqa: F401 (torch's names)

_next_seq = itertools.count().__next__
_ACCUMULATE_FIRST = 1 << 62

FREED_GRAPH_ERROR = (
    "Trying to backward through the graph a second time (or directly access saved tensors after they "
    "have already been freed). Saved intermediate values of the graph are freed when you call "
    ".backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the "
    "graph a second time or if you need to access saved tensors after calling backward.")


class Node:
    """A function in the backward graph. `next_edges[i]` is (node, output_nr) for input i, or None."""

    n_outputs = 1

    def __init__(self, next_edges=()):
        self.next_edges = tuple(next_edges)
        self.seq = _next_seq()
        self.pre_hooks = None  # {handle id: (output_nr, fn)}, the hooks of non-leaf tensors
        self.retained = None  # {output_nr: weakref to the tensor that called retain_grad()}
        if anomaly_mode.state.enabled:
            self.forward_trace = anomaly_mode.forward_trace()

    def name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return f"<{self.name()} object at {id(self):#x}>"

    @property
    def next_functions(self):
        return tuple(e if e is not None else (None, 0) for e in self.next_edges)

    def apply(self, grads: list) -> list:
        """Gradients for each next edge, from the gradients of this node's outputs."""
        raise NotImplementedError

    def release(self) -> None:
        """Free what was saved for backward (called after a backward without retain_graph)."""

    def add_tensor_hook(self, output_nr: int, fn) -> RemovableHandle:
        if self.pre_hooks is None:
            self.pre_hooks = {}
        handle = RemovableHandle(self.pre_hooks)
        self.pre_hooks[handle.id] = (output_nr, fn)
        return handle

    def call_pre_hooks(self, grads: list) -> list:
        """Run tensor hooks (which may replace a gradient), then store retained gradients."""
        if self.pre_hooks:
            for output_nr, fn in list(self.pre_hooks.values()):
                if grads[output_nr] is not None:
                    replaced = fn(grads[output_nr])
                    if replaced is not None:
                        grads[output_nr] = _checked_replacement(grads[output_nr], replaced)
        if self.retained:
            for output_nr, ref in self.retained.items():
                tensor = ref()
                if tensor is not None and grads[output_nr] is not None:
                    _accumulate_into(tensor, grads[output_nr], grad_mode.state.enabled)
        return grads


def _checked_replacement(old, new):
    if not isinstance(new, _tensor_mod.Tensor) or new.shape != old.shape:
        raise RuntimeError(f"hook returned an invalid gradient: expected a tensor of shape {list(old.shape)}, "
                           f"got {new!r}")
    return new


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


DETACHED_SAVED_ERROR = ("Trying to use a saved tensor that has been detached in-place, i.e. with .detach_().If "
                        "you used detach_() on a tensor saved for backward, use detach() instead.")


class OpNode(Node):
    """The backward of one primitive op; its rules come from the op table."""

    def __init__(self, op, inputs, attrs, out_array, out_version, next_edges):
        super().__init__(next_edges)
        self.op = op
        self.attrs = attrs
        self.inputs = inputs
        saves = op.saves
        self.saved_versions = tuple((i, inputs[i]._vc()[0]) for i in saves
                                    if i != "out" and isinstance(inputs[i], _tensor_mod.Tensor))
        # saved inputs that had a history: detach_ on one later makes reading it torch's error
        self.saved_with_history = tuple(i for i, _ in self.saved_versions if inputs[i]._grad_fn is not None)
        if "out" in saves:
            self.out_data, self.out_version, self.out_version_seen = out_array, out_version, out_version[0]
        else:
            self.out_data = None
        self.packed = None
        if saved_hooks.state.stack:  # NOTE: one attribute read per recorded op when no hooks are set
            self._pack_saved()

    def _pack_saved(self) -> None:
        """Under saved-tensor hooks the node keeps what pack_hook returned for each saved tensor, and of its other
        floating inputs only shape and dtype (the hooks own what is kept, as in torch: checkpointing keeps nothing)."""
        Tensor = _tensor_mod.Tensor
        positions = [i for i in self.op.saves if i != "out" and isinstance(self.inputs[i], Tensor)]
        tensors = [self.inputs[i] for i in positions]
        if self.out_data is not None:
            out = Tensor._from_array(self.out_data)
            out._grad_fn, out._rg = self, True
            positions.append("out")
            tensors.append(out)
        packed, unpack = saved_hooks.pack_all(tensors)
        self.packed = (positions, packed, unpack, [tuple(t.shape) for t in tensors])
        # NOTE: integer and bool inputs (indices, masks) stay: rules read them, and they carry no gradient history
        self.inputs = [_Unsaved(x) if isinstance(x, Tensor) and x.dtype.is_differentiable else x for x in self.inputs]
        self.out_data, self.saved_versions, self.saved_with_history = None, (), ()

    def name(self) -> str:
        return _camel(self.op.name) + "Backward0"

    def apply(self, grads):
        inputs = self.inputs
        if inputs is None:
            raise RuntimeError(FREED_GRAPH_ERROR)
        g, attrs, op = grads[0], self.attrs, self.op
        if self.packed is not None:
            values, out = self._from_hooks(inputs)
        else:
            values, out = self._unpacked(inputs, self._saved_out())
        result = []
        for i, edge in enumerate(self.next_edges):
            if edge is None:
                result.append(None)
                continue
            gi = op.vjp_rule(i)(g, out, *values, **attrs)
            if grad_mode.state.enabled and isinstance(gi, _tensor_mod.Tensor) and not gi.requires_grad:
                gi = _linked_to_saved(gi, op, values, out)
            result.append(fit_gradient(gi, inputs[i]))
        return result

    def _from_hooks(self, inputs):
        """The rules' inputs and output: unpack_hook's tensors where tensors were saved."""
        positions, packed, unpack, shapes = self.packed
        values, out = list(inputs), None
        for i, value in zip(positions, saved_hooks.unpack_all(packed, unpack, shapes)):
            if i == "out":
                out = value
            else:
                values[i] = value
        return values, out

    def input_index(self, tensor) -> int:
        """The position of `tensor` among this node's inputs (by identity)."""
        return next(k for k, x in enumerate(self.inputs) if x is tensor or getattr(x, "source_id", None) == id(tensor))

    def _saved_out(self):
        if self.out_data is None:
            return None
        out = _tensor_mod.Tensor._from_array(self.out_data)
        if grad_mode.state.enabled:  # create_graph: the saved output stays connected to this node
            out._grad_fn, out._rg = self, True
        return out

    def _unpacked(self, inputs, out):
        """The rules' inputs and output; a saved one modified in place since is a _Stale, which raises torch's
        error only if a rule that runs reads it (torch saves, per input, only what that input's formula needs)."""
        stale = [i for i, seen in self.saved_versions if inputs[i]._vc()[0] != seen]
        detached = [i for i in self.saved_with_history if inputs[i]._grad_fn is None]
        if self.out_data is not None and self.out_version[0] != self.out_version_seen:
            out = _Stale(out, self._stale_message("its output", self.out_version[0], self.out_version_seen))
        if not stale and not detached:
            return inputs, out
        values = list(inputs)
        for i, seen in self.saved_versions:
            if i in stale:
                values[i] = _Stale(inputs[i], self._stale_message(f"input {i}", inputs[i]._vc()[0], seen))
            elif i in detached:
                values[i] = _Stale(inputs[i], DETACHED_SAVED_ERROR)
        return values, out

    def _stale_message(self, what, now, seen) -> str:
        return (f"one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: {what} of {self.name()} is at version {now}; expected version {seen} instead. "
                f"Hint: use an out-of-place op, or .clone() the tensor before modifying it in place.")

    def release(self) -> None:
        if self.op.saves:
            self.inputs = None
            self.out_data = None
            self.packed = None


class _Unsaved:
    """An input a node did not save (its hooks own what is saved): its shape and dtype, for the rules and for
    fitting gradients; `source_id` names the tensor it stood for while that tensor is alive."""

    __slots__ = ("shape", "dtype", "ndim", "is_cuda", "source_id")

    def __init__(self, tensor):
        self.shape, self.dtype, self.ndim = tensor.shape, tensor.dtype, tensor.ndim
        self.is_cuda, self.source_id = tensor.is_cuda, id(tensor)

    def __getattr__(self, name):
        raise RuntimeError(f"internal error: a backward rule read {name!r} of an input it did not declare saved")


class _Stale:
    """A saved tensor modified in place after it was saved: a rule may read its shape and dtype; anything that
    reads its values (an op, a method, an operator) raises torch's error."""

    __slots__ = ("shape", "dtype", "ndim", "_message")

    def __init__(self, tensor, message: str):
        self.shape, self.dtype, self.ndim, self._message = tensor.shape, tensor.dtype, tensor.ndim, message

    def _fail(self, *args, **kwargs):
        raise RuntimeError(self._message)

    def __getattr__(self, name):
        self._fail()

    @staticmethod
    def _apply_op(op, inputs, attrs):
        next(x for x in inputs if isinstance(x, _Stale))._fail()


for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv", "rfloordiv", "mod",
              "rmod", "pow", "rpow", "matmul", "rmatmul", "neg", "pos", "abs", "invert", "and", "rand", "or", "ror",
              "xor", "rxor", "eq", "ne", "lt", "le", "gt", "ge", "getitem", "bool", "float", "int", "index", "len",
              "iter", "array"):
    setattr(_Stale, f"__{_name}__", _Stale._fail)
del _name


def fit_gradient(g, x):
    """Reduce a gradient over broadcast dims and cast it to the input's dtype."""
    if g is None:
        return None
    if g._data.shape != tuple(x.shape):
        g = g.sum_to_size(x.shape)
    if g.dtype is not x.dtype:
        g = g.to(x.dtype)
    return g


class CopySlices(Node):
    """A base's history after an in-place op on a view of it (torch's CopySlices). The base's gradient passes to
    its previous history, except in the view's region, which the in-place op overwrote: there it passes through
    that op's node `fn` to the view's old value (fn's input `old_index`); fn's other inputs get theirs."""

    def __init__(self, base_edge, view_fn, fn, old_index: int):
        others = [e for k, e in enumerate(fn.next_edges) if k != old_index]
        super().__init__([base_edge] + others)
        self.view_fn, self.fn, self.old_index = view_fn, fn, old_index

    def apply(self, grads):
        g = grads[0]
        views = [g]  # the view's steps replayed on the gradient: views[-1] is the gradient of the view's region
        for op, extra, attrs in self.view_fn:
            views.append(_tensor_mod.Tensor._apply_op(op, (views[-1],) + extra, attrs))
        fn_grads = self.fn.apply([views[-1]])
        if g.dtype.is_complex:
            return [self._complex_base_grad(g, views, fn_grads[self.old_index])] + \
                [gi for k, gi in enumerate(fn_grads) if k != self.old_index]
        with grad_mode.no_grad():
            region = self._spread(views[-1].new_ones(views[-1].shape), views) != 0
        old = fn_grads[self.old_index]
        base_grad = g.where(~region, 0.0) if old is None else self._spread(old, views).where(region, g)
        return [base_grad] + [gi for k, gi in enumerate(fn_grads) if k != self.old_index]

    def _complex_base_grad(self, g, views, old):
        """A complex base's gradient: a view may hold parts of its elements (real, imag, view_as_real), which no
        elementwise region can mark, so the view's share of g is taken out by the view steps themselves (they
        select, so spreading back what they select is that share) and the old view's gradient put in."""
        base_grad = g - self._spread(views[-1], views)
        return base_grad if old is None else base_grad + self._spread(old, views)

    def _spread(self, t, views):
        """t, shaped like the view, placed where the view lies in its base: the view steps' own rules in reverse."""
        for k in range(len(self.view_fn) - 1, -1, -1):
            op, extra, attrs = self.view_fn[k]
            t = op.vjp_rule(0)(t, views[k + 1], views[k], *extra, **attrs)
        return t

    def release(self) -> None:
        self.fn.release()


def _retains_grad(tensor) -> bool:
    node = tensor._grad_fn
    return bool(node is not None and node.retained and tensor._out_nr in node.retained)


class AccumulateGrad(Node):
    """The sink for a leaf tensor: runs the leaf's hooks, then adds the gradient into `.grad`."""

    def __init__(self, variable):
        super().__init__(())
        self.variable = variable
        # NOTE: the engine runs ready nodes by descending seq; like torch's (sequence_nr UINT64_MAX), an accumulator
        # outranks every op node, so .grad is set (and DDP's hook starts that gradient's all-reduce) as soon as the
        # gradient is complete, not after the rest of backward
        self.seq += _ACCUMULATE_FIRST

    def call_pre_hooks(self, grads):
        hooks = self.variable._backward_hooks
        if hooks:
            for fn in list(hooks.values()):
                replaced = fn(grads[0])
                if replaced is not None:
                    grads[0] = _checked_replacement(grads[0], replaced)
        return grads

    def accumulate(self, grads) -> None:
        _accumulate_into(self.variable, grads[0], grad_mode.state.enabled, stealable=True)
        del grads[:]  # drop our reference so ownership checks see only the gradient's real owners
        hooks = self.variable._post_accumulate_hooks
        if hooks:
            for fn in list(hooks.values()):
                if fn(self.variable) is not None:
                    raise RuntimeError("post accumulate grad hooks cannot return anything")


def _accumulate_into(tensor, g, create_graph: bool, stealable: bool = False) -> None:
    if g is None:
        return
    old = tensor._grad
    if old is None:
        tensor._grad = g if create_graph else _owned_detached(g, stealable)
    elif create_graph:
        tensor._grad = old + g
    elif old.is_cuda:
        from ..cuda import dispatch

        dispatch.add_into(old._data, g._data)
        old._bump_version()
    else:
        old._data += g._data
        old._bump_version()


def _owned_detached(g, stealable: bool):
    """A detached gradient that no one else holds: reuse g's buffer when provably unshared."""
    # NOTE: like torch's AccumulateGrad, steal the incoming buffer when nothing else references
    # it (a copy per parameter per step is measurable: 1 ms for 16 MiB). The references counted:
    # for g, AccumulateGrad's list, _accumulate_into's and this function's parameters and
    # getrefcount's argument; for the array, g's own slot, the local `data` and the argument.
    data = g._data
    if g.is_cuda:
        return _tensor_mod.Tensor._from_array(_tensor_mod.copy_array(data))
    if (stealable and g._grad_fn is None and data.flags.owndata and data.flags.writeable
            and sys.getrefcount(g) <= 4 and sys.getrefcount(data) <= 3):
        return g
    return _tensor_mod.Tensor._from_array(data.copy())


def _linked_to_saved(gi, op, values, out):
    """Under create_graph, a gradient computed from saved tensors that require grad but carrying no history (the
    rule read them only through masks) gets a zero-derivative link to them, as torch's backward kernels have."""
    from ..ops import OPS

    Tensor = _tensor_mod.Tensor
    saved = [out if s == "out" else values[s] for s in op.saves if s == "out" or s < len(values)]
    saved = [t for t in saved if isinstance(t, Tensor) and t.requires_grad and t.dtype.is_differentiable]
    if not saved:
        return gi
    return Tensor._apply_op(OPS["linked"], (gi, *saved), {})


def edge_of(tensor):
    """The backward edge a tensor feeds: its grad_fn, or its leaf accumulator."""
    tensor._refresh_view()
    if tensor._grad_fn is not None:
        return (tensor._grad_fn, tensor._out_nr)
    if tensor._rg:
        return (tensor._accumulator(), 0)
    return None


def accumulator_for(tensor) -> AccumulateGrad:
    ref = tensor._acc_ref
    node = ref() if ref is not None else None
    if node is None:
        node = AccumulateGrad(tensor)
        tensor._acc_ref = weakref.ref(node)
    return node
