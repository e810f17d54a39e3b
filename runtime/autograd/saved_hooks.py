"""Saved-tensor hooks: pack/unpack what autograd saves for backward (torch.autograd.graph.saved_tensors_hooks)."""
from __future__ import annotations

import threading

from . import grad_mode


class _HookState(threading.local):
    stack: tuple = ()  # (pack_hook, unpack_hook) pairs, the innermost last: only that one applies
    disabled: str | None = None  # while hooks are disabled: the error to raise on registering one


state = _HookState()


def current():
    """The (pack_hook, unpack_hook) pair that applies to tensors saved now, or None."""
    return state.stack[-1] if state.stack else None


class saved_tensors_hooks:
    """Inside this context, every tensor an op saves for backward is replaced by pack_hook(tensor), and backward
    reads unpack_hook(packed) instead. The innermost context applies; hooks are per thread, as torch's are."""

    def __init__(self, pack_hook, unpack_hook):
        self.pack_hook, self.unpack_hook = pack_hook, unpack_hook

    def __enter__(self):
        if state.disabled is not None:
            raise RuntimeError(state.disabled)
        state.stack = state.stack + ((self.pack_hook, self.unpack_hook),)
        return self

    def __exit__(self, *exc):
        state.stack = state.stack[:-1]
        return False


class disable_saved_tensors_hooks:
    """Registering saved-tensor hooks inside this context raises RuntimeError(error_message)."""

    def __init__(self, error_message: str):
        self.error_message = error_message

    def __enter__(self):
        self._previous, state.disabled = state.disabled, self.error_message
        return self

    def __exit__(self, *exc):
        state.disabled = self._previous
        return False


class save_on_cpu(saved_tensors_hooks):
    """Saved tensors are kept on the CPU and moved back to their device when backward reads them."""

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda"):
        def pack(tensor):
            return tensor.device, tensor.detach().to("cpu", copy=True)

        def unpack(packed):
            device, tensor = packed
            return tensor.to(device)

        super().__init__(pack, unpack)


def pack_all(tensors):
    """Pack each tensor with the current hooks: (packed values, the unpack hook), or None without hooks."""
    hooks = current()
    if hooks is None:
        return None
    pack, unpack = hooks
    with grad_mode.no_grad():  # as torch: what a pack hook computes is not recorded (nor packed again)
        return [pack(t) if t is not None else None for t in tensors], unpack


def unpack_all(packed, unpack, shapes):
    """The tensors back from packed values, each checked to be a tensor of the shape that was saved."""
    from ..tensor import Tensor

    values = []
    for p, shape in zip(packed, shapes):
        if p is None:
            values.append(None)
            continue
        value = unpack(p)
        if not isinstance(value, Tensor):
            raise TypeError(f"Output of saved tensor unpack_hook expected to be a Tensor but got result of type "
                            f"{type(value).__name__}")
        if tuple(value.shape) != shape:
            raise RuntimeError(f"the unpack hook returned a tensor of shape {list(value.shape)} for a saved tensor "
                               f"of shape {list(shape)}")
        values.append(value)
    return values
