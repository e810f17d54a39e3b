"""Custom autograd functions: subclass Function with static forward(ctx, ...) and backward(ctx, ...)."""
from __future__ import annotations

import numpy as np

import runtime.tensor as _tensor_mod

from . import grad_mode, saved_hooks
from .graph import FREED_GRAPH_ERROR, Node, edge_of, fit_gradient


class FunctionCtx:
    """The `ctx` passed to forward and backward: saved tensors and flags."""

    def __init__(self):
        self._saved = ()
        self._packed = None
        self._freed = False
        self.needs_input_grad = ()
        self.non_differentiable = set()
        self.materialize_grads = True

    def save_for_backward(self, *tensors) -> None:
        self._packed = saved_hooks.pack_all(tensors)
        if self._packed is not None:  # the hooks own what is kept
            self._saved, self._shapes = (), [tuple(t.shape) if t is not None else None for t in tensors]
            return
        self._saved = tuple(tensors)
        self._saved_versions = tuple(t._vc()[0] if t is not None else None for t in tensors)

    @property
    def saved_tensors(self):
        if self._freed:
            raise RuntimeError(FREED_GRAPH_ERROR)
        if self._packed is not None:
            packed, unpack = self._packed
            return tuple(saved_hooks.unpack_all(packed, unpack, self._shapes))
        for t, seen in zip(self._saved, self._saved_versions if self._saved else ()):
            if t is not None and t._vc()[0] != seen:
                raise RuntimeError("one of the variables needed for gradient computation has been modified "
                                   f"by an inplace operation: a tensor saved by save_for_backward is at version "
                                   f"{t._vc()[0]}; expected version {seen} instead.")
        return self._saved

    def mark_non_differentiable(self, *tensors) -> None:
        self.non_differentiable.update(id(t) for t in tensors)

    def mark_dirty(self, *tensors) -> None:
        """Accepted for compatibility; in-place outputs are rebased like any other output."""

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)


class FunctionNode(Node):
    """The backward of one Function.apply call."""

    def __init__(self, fn_cls, ctx, inputs, outputs_meta):
        Tensor = _tensor_mod.Tensor
        super().__init__(edge_of(x) if isinstance(x, Tensor) else None for x in inputs)
        self.fn_cls, self.ctx, self.outputs_meta = fn_cls, ctx, outputs_meta
        self.input_tensors = tuple(x if isinstance(x, Tensor) else None for x in inputs)
        self.n_outputs = len(outputs_meta)

    def name(self) -> str:
        return f"{self.fn_cls.__name__}Backward"

    def apply(self, grads):
        if self.ctx.materialize_grads:
            grads = [g if g is not None else _tensor_mod.Tensor._from_array(np.zeros(shape, dtype=dtype.np))
                     for g, (shape, dtype) in zip(grads, self.outputs_meta)]
        result = self.fn_cls.backward(self.ctx, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        if len(result) < len(self.next_edges):
            raise RuntimeError(f"function {self.name()} returned an incorrect number of gradients "
                               f"(expected {len(self.next_edges)}, got {len(result)})")
        return [self._checked(i, g) for i, g in enumerate(result[:len(self.next_edges)])]

    def _checked(self, i, g):
        x = self.input_tensors[i]
        if g is None or x is None or self.next_edges[i] is None:
            return None
        try:
            return fit_gradient(g, x)
        except RuntimeError:
            raise RuntimeError(f"Function {self.name()} returned an invalid gradient at index {i} - got "
                               f"{list(g.shape)} but expected shape compatible with {list(x.shape)}") from None

    def release(self) -> None:
        self.ctx._freed = True
        self.ctx._saved, self.ctx._packed = (), None


class Function:
    """Base class for custom differentiable functions (torch.autograd.Function)."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom autograd.Function.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement the backward function for custom autograd.Function.")

    @classmethod
    def apply(cls, *args, **kwargs):
        foreign = _foreign_handler(args)
        if foreign is not None:  # a compiler's stand-in for a tensor decides what the call becomes
            return foreign(cls, args, kwargs)
        Tensor = _tensor_mod.Tensor
        ctx = FunctionCtx()
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        with grad_mode.no_grad():
            outputs = cls.forward(ctx, *args, **kwargs)
        if not (grad_mode.state.enabled and any(ctx.needs_input_grad)):
            return outputs
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        outs = tuple(_fresh_output(o, args) for o in outs)
        meta = [(tuple(o.shape), o.dtype) if isinstance(o, Tensor) else ((), None) for o in outs]
        node = FunctionNode(cls, ctx, args, meta)
        for nr, o in enumerate(outs):
            if isinstance(o, Tensor) and o.dtype.is_differentiable and id(o) not in ctx.non_differentiable:
                o._grad_fn, o._out_nr, o._rg = node, nr, True
        return outs[0] if single else outs


def _foreign_handler(args):
    """`_apply_function` of the type of an argument that stands for a tensor but is not one (a tracer's value)."""
    for a in args:
        handler = getattr(type(a), "_apply_function", None)
        if handler is not None and not isinstance(a, _tensor_mod.Tensor):
            return handler
    return None


def _fresh_output(o, inputs):
    """An output that is one of the inputs gets its own tensor object (as torch makes a view)."""
    if isinstance(o, _tensor_mod.Tensor) and any(o is x for x in inputs):
        return _tensor_mod.Tensor._from_array(o._data)
    return o
