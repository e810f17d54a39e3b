"""runtime.amp: autocast and GradScaler.

autocast('cpu') does what torch's CPU autocast does for matmul-like ops: every primitive of kind matmul (matmul,
linear, and through them bmm, conv, einsum and attention) runs on copies of its floating inputs in the autocast
dtype (bfloat16 unless dtype=runtime.float16 is given, as in torch); the ops torch's CPU autocast runs in float32
(losses, prod, cdist, trace, quantile: `runs_in_float32`) take float32 copies of their lower-precision inputs; and
other ops follow the ordinary promotion rules. As
in torch, a dtype CPU autocast does not support (float32, ...) gives a warning and disables it, a 'cuda' autocast
warns and is disabled (there is no CUDA), and enabled=False is a no-op.
"""
from __future__ import annotations

import functools
import math
import threading
import warnings

from . import dtypes as dt


class _State(threading.local):
    dtype = None  # the autocast dtype while a CPU autocast is active, else None


state = _State()


def is_autocast_enabled(device_type: str = "cpu") -> bool:
    return device_type == "cpu" and state.dtype is not None


def get_autocast_dtype(device_type: str = "cpu"):
    """The dtype CPU autocast computes in: the active one, else torch's default for the CPU, bfloat16."""
    if device_type == "cpu" and state.dtype is not None:
        return state.dtype
    return dt.bfloat16


class autocast:
    """Context manager (and decorator) that runs matmul-like ops in a lower-precision dtype."""

    def __init__(self, device_type: str = "cpu", dtype=None, enabled: bool = True, cache_enabled=None):
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        self.device_type, self.enabled, self.fast_dtype = device_type, bool(enabled), None
        if not self.enabled:
            return
        if device_type == "cuda":
            warnings.warn("User provided device_type of 'cuda', but CUDA is not available. Disabling", UserWarning,
                          stacklevel=2)
            self.enabled = False
            return
        if device_type != "cpu":
            raise RuntimeError(f"User specified an unsupported autocast device_type '{device_type}'")
        dtype = dt.bfloat16 if dtype is None else dt.as_dtype(dtype)
        if dtype not in (dt.bfloat16, dt.float16):
            warnings.warn("In CPU autocast, but the target dtype is not supported. Disabling autocast.\n"
                          "CPU Autocast only supports dtypes of torch.bfloat16, torch.float16 currently.", UserWarning,
                          stacklevel=2)
            self.enabled = False
            return
        self.fast_dtype = dtype

    def __enter__(self):
        self._previous = state.dtype
        if self.enabled:
            state.dtype = self.fast_dtype
        return self

    def __exit__(self, *exc):
        state.dtype = self._previous
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with self.__class__(self.device_type, self.fast_dtype, self.enabled):
                return fn(*args, **kwargs)

        return wrapped


def autocast_inputs(op, inputs):
    """The inputs of a matmul-kind op under autocast: floating tensors cast to the autocast dtype (recorded casts,
    so gradients flow back in each input's own dtype)."""
    target = state.dtype
    return tuple(x.to(target) if getattr(x, "dtype", None) is not None and x.dtype.is_floating_point
                 and x.dtype is not target else x for x in inputs)


def runs_in_float32(fn):
    """Decorate an op torch's CPU autocast runs in float32 (its losses, prod, cdist, trace, quantile): inside
    autocast, its bfloat16 and float16 tensor arguments are cast to float32 first, so a loss and its .item() are
    not rounded to bfloat16. Outside autocast the op runs as written."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if state.dtype is None:
            return fn(*args, **kwargs)
        return fn(*map(_float32, args), **{k: _float32(v) for k, v in kwargs.items()})

    return wrapped


def _float32(value):
    dtype = getattr(value, "dtype", None)
    return value.to(dt.float32) if dtype in (dt.bfloat16, dt.float16) and hasattr(value, "to") else value


def autocast_bias(bias):
    """A bias added after a matmul-kind op (linear, convolution): cast to the autocast dtype inside autocast, as
    torch's fused ops cast every floating input, so the layer's result is in that dtype."""
    target = state.dtype
    if target is None or bias is None or not bias.dtype.is_floating_point or bias.dtype is target:
        return bias
    return bias.to(target)


class GradScaler:
    """torch.amp.GradScaler: multiplies the loss by a scale, unscales the gradients before the step, skips steps
    whose gradients hold inf or nan and adapts the scale. enabled=False passes everything through."""

    def __init__(self, device="cpu", init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if device == "cuda" and enabled and not _cuda_available():
            warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                          UserWarning, stacklevel=2)
            enabled = False
        self._enabled = enabled
        self._scale, self._growth_factor, self._backoff_factor = float(init_scale), growth_factor, backoff_factor
        self._growth_interval, self._growth_tracker = growth_interval, 0
        self._found_inf, self._unscaled = {}, set()

    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def scale(self, outputs):
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        return outputs * self._scale

    def unscale_(self, optimizer) -> None:
        if not self._enabled:
            return
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        from .autograd import no_grad

        found = False
        with no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(1.0 / self._scale)
                        found = found or not bool(p.grad.isfinite().all())
        self._found_inf[id(optimizer)] = found
        self._unscaled.add(id(optimizer))

    def step(self, optimizer, *args, **kwargs):
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        if not self._found_inf[id(optimizer)]:
            return optimizer.step(*args, **kwargs)
        return None

    def update(self, new_scale=None) -> None:
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale)
        elif any(self._found_inf.values()):
            self._scale *= self._backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                self._scale = min(self._scale * self._growth_factor, math.inf)
                self._growth_tracker = 0
        self._found_inf, self._unscaled = {}, set()

    def state_dict(self) -> dict:
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict) -> None:
        if not self._enabled:
            return
        self._scale = float(state_dict["scale"])
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._growth_tracker = state_dict["_growth_tracker"]


def _cuda_available() -> bool:
    from . import cuda

    return cuda.is_available()
