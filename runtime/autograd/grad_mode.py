"""Grad mode: no_grad, enable_grad, set_grad_enabled, inference_mode; context managers and decorators."""
from __future__ import annotations

import functools
import threading


class _State(threading.local):
    enabled = True
    inference = False  # inside inference_mode (torch.is_inference_mode_enabled)


state = _State()


def is_grad_enabled() -> bool:
    return state.enabled


def is_inference_mode_enabled() -> bool:
    return state.inference


class _GradMode:
    """Enter a grad mode for a `with` block, or for every call of a decorated function."""

    _mode: bool

    def __enter__(self):
        self._prev = state.enabled
        state.enabled = self._mode
        return self

    def __exit__(self, *exc):
        state.enabled = self._prev
        return False

    def __call__(self, fn):
        mode = self._mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prev = state.enabled
            state.enabled = mode
            try:
                return fn(*args, **kwargs)
            finally:
                state.enabled = prev

        return wrapper


class _BareDecoratorMode(_GradMode):
    """Also usable bare, as `@no_grad` without parentheses (torch allows both)."""

    def __new__(cls, func=None):
        self = super().__new__(cls)
        return self(func) if callable(func) else self

    def __init__(self, func=None):
        pass


class no_grad(_BareDecoratorMode):
    _mode = False


class enable_grad(_BareDecoratorMode):
    _mode = True


class set_grad_enabled(_GradMode):
    """Switches the mode on construction (as torch does) and restores the previous one on exit."""

    def __init__(self, mode: bool):
        self._prev = state.enabled
        self._mode = bool(mode)
        state.enabled = self._mode

    def __enter__(self):
        return self

    def __call__(self, fn):
        state.enabled = self._prev  # used as a decorator: undo the constructor's switch
        return super().__call__(fn)


class inference_mode(_GradMode):
    """Like no_grad (runtime has no separate inference tensors), and is_inference_mode_enabled() says so inside."""

    def __init__(self, mode: bool = True):
        self._mode = not mode
        self._inference = bool(mode)

    def __enter__(self):
        self._prev_inference = state.inference
        state.inference = self._inference
        return super().__enter__()

    def __exit__(self, *exc):
        state.inference = self._prev_inference
        return super().__exit__(*exc)

    def __call__(self, fn):
        inference, grad_mode = self._inference, self._mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            previous = state.inference, state.enabled
            state.inference, state.enabled = inference, grad_mode
            try:
                return fn(*args, **kwargs)
            finally:
                state.inference, state.enabled = previous

        return wrapper
