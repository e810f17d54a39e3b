"""Activation checkpointing (torch.utils.checkpoint): save less in forward, recompute it in backward."""
from __future__ import annotations

import contextlib
import warnings

from .. import ops
from .. import random as _random
from ..autograd import engine, grad_mode
from ..autograd.function import Function
from ..autograd.saved_hooks import saved_tensors_hooks
from ..tensor import Tensor

__all__ = ["checkpoint", "checkpoint_sequential", "CheckpointError", "noop_context_fn", "set_checkpoint_early_stop"]

DETERMINISM_CHECKS = ("default", "none")


class CheckpointError(RuntimeError):
    """The recomputation in backward did not save what the forward saved."""


def noop_context_fn():
    return contextlib.nullcontext(), contextlib.nullcontext()


@contextlib.contextmanager
def set_checkpoint_early_stop(enable: bool):
    """Accepted for torch's API: recomputation here always runs the whole checkpointed function."""
    yield


def checkpoint(function, *args, use_reentrant=None, context_fn=noop_context_fn, determinism_check="default",
               debug=False, early_stop=True, **kwargs):
    """function(*args, **kwargs), keeping none of its intermediate values for backward: backward runs it again
    (with the random state it had) to get them. Parameters used inside get their gradients either way."""
    if use_reentrant is None:
        warnings.warn("torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
                      "use_reentrant=False is recommended; without it, checkpoint behaves as with "
                      "use_reentrant=True, as torch's default does.", stacklevel=2)
        use_reentrant = True
    preserve_rng_state = kwargs.pop("preserve_rng_state", True)
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check should be one of {list(DETERMINISM_CHECKS)}, "
                         f"but got {determinism_check}")
    if _traced(args, kwargs):  # a compiler's values: it decides itself what to keep for backward
        return function(*args, **kwargs)
    if use_reentrant:
        if context_fn is not noop_context_fn or debug:
            raise ValueError("Passing `context_fn` or `debug` is only supported when use_reentrant=False.")
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        if grad_mode.is_grad_enabled() and not any(isinstance(a, Tensor) and a.requires_grad for a in args):
            warnings.warn("None of the inputs have requires_grad=True. Gradients will be None", stacklevel=2)
        return CheckpointFunction.apply(function, preserve_rng_state, *args)
    if not grad_mode.is_grad_enabled():
        return function(*args, **kwargs)
    forward_context, recompute_context = context_fn()
    frame = _Frame(function, args, kwargs, preserve_rng_state, recompute_context, determinism_check == "default")
    with saved_tensors_hooks(frame.pack, frame.unpack), forward_context:
        return function(*args, **kwargs)


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """Run a Sequential (or a list of modules) in `segments` pieces, each but the last under checkpoint."""
    if use_reentrant is None:
        warnings.warn("torch.utils.checkpoint.checkpoint_sequential: the use_reentrant parameter should be passed "
                      "explicitly; without it, it behaves as with use_reentrant=True.", stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    functions = list(functions.children()) if hasattr(functions, "children") else list(functions)
    size = len(functions) // segments
    start = 0
    for _ in range(segments - 1):
        if size == 0:
            break
        input = checkpoint(_run_in_order(functions[start:start + size]), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
        start += size
    return _run_in_order(functions[start:])(input)


def _run_in_order(functions):
    def run(value):
        for fn in functions:
            value = fn(value)
        return value

    return run


def _traced(args, kwargs) -> bool:
    values = list(args) + list(kwargs.values())
    return any(ops.is_tensor_like(v) and not isinstance(v, Tensor) for v in values)


@contextlib.contextmanager
def _random_state(state):
    """Run with the generator at `state` (None: as it is), and leave it where it was."""
    if state is None:
        yield
        return
    now = _random.get_rng_state()
    _random.set_rng_state(state)
    try:
        yield
    finally:
        _random.set_rng_state(now)


class _Slot:
    """What the forward saved in place of a tensor: its position among the function's saved tensors."""

    __slots__ = ("frame", "index")

    def __init__(self, frame, index: int):
        self.frame, self.index = frame, index


class _Frame:
    """One non-reentrant checkpointed call: the saved tensors' metadata from the forward, and the tensors a
    recomputation made, which backward takes one by one."""

    def __init__(self, function, args, kwargs, preserve_rng_state, recompute_context, check):
        self.function, self.args, self.kwargs = function, args, kwargs
        self.rng_state = _random.get_rng_state() if preserve_rng_state else None
        self.recompute_context, self.check = recompute_context, check
        self.metadata: list = []  # (shape, dtype, device) of each tensor the forward saved
        self.recomputed: dict = {}

    def pack(self, tensor):
        self.metadata.append(_metadata(tensor))
        return _Slot(self, len(self.metadata) - 1)

    @staticmethod
    def unpack(slot):
        frame = slot.frame
        if slot.index not in frame.recomputed:
            frame.recompute()
        return frame.recomputed.pop(slot.index)

    def recompute(self) -> None:
        made = []

        def keep(tensor):
            made.append(tensor.detach() if tensor.requires_grad else tensor)
            return None

        with _random_state(self.rng_state), grad_mode.enable_grad(), saved_tensors_hooks(keep, _never_unpacked), \
                self.recompute_context:
            self.function(*self.args, **self.kwargs)
        self._check(made)
        self.recomputed = dict(enumerate(made))

    def _check(self, made) -> None:
        if len(made) != len(self.metadata):
            raise CheckpointError(f"torch.utils.checkpoint: A different number of tensors was saved during the "
                                  f"original forward and recomputation.\nNumber of tensors saved during forward: "
                                  f"{len(self.metadata)}\nNumber of tensors saved during recomputation: {len(made)}")
        if not self.check:
            return
        differ = [f"tensor at position {i}:\nsaved metadata: {_describe(want)}\nrecomputed metadata: "
                  f"{_describe(_metadata(t))}" for i, (t, want) in enumerate(zip(made, self.metadata))
                  if _metadata(t) != want]
        if differ:
            raise CheckpointError("torch.utils.checkpoint: Recomputed values for the following tensors have "
                                  "different metadata than during the forward pass.\n" + "\n".join(differ))


def _metadata(tensor):
    return tuple(tensor.shape), tensor.dtype, str(tensor.device)


def _describe(metadata) -> str:
    shape, dtype, device = metadata
    return f"{{'shape': {list(shape)}, 'dtype': {dtype}, 'device': {device}}}"


def _never_unpacked(packed):
    raise RuntimeError("torch.utils.checkpoint: a graph built while recomputing was run backward")


class CheckpointFunction(Function):
    """use_reentrant=True: forward runs without recording; backward runs the function again with recording on
    and backpropagates through that graph (a backward inside backward), so parameters get their gradients then.
    Gradients reach only inputs that require grad, and none at all when no input does (torch's behaviour)."""

    @staticmethod
    def forward(ctx, function, preserve_rng_state, *args):
        ctx.function = function
        ctx.rng_state = _random.get_rng_state() if preserve_rng_state else None
        ctx.tensor_positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.others = list(args)
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_positions))
        return function(*args)

    @staticmethod
    def backward(ctx, *grads):
        if engine.is_capturing():
            raise RuntimeError("When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() or "
                               "passing an `inputs` parameter to .backward(). To resolve this error, you can "
                               "either set use_reentrant=False, or call .backward() without passing the `inputs` "
                               "argument.")
        args = list(ctx.others)
        for i, saved in zip(ctx.tensor_positions, ctx.saved_tensors):
            args[i] = saved.detach().requires_grad_(saved.requires_grad)
        with _random_state(ctx.rng_state), grad_mode.enable_grad():
            outputs = ctx.function(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if isinstance(o, Tensor) and o.requires_grad]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is not necessary")
        from ..autograd import backward

        backward([o for o, _ in pairs], [g for _, g in pairs])
        tensor_grads = [a.grad if isinstance(a, Tensor) else None for a in args]
        return (None, None) + tuple(tensor_grads)
