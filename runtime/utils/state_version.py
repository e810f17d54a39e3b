"""A process-wide version of module state: it moves on every change to the training flags and parameters, so a
compiled module's guards re-read them only when it has moved (nnc.compile's fast path).

What moves it: any attribute set or deleted on a Module (training flags, parameters, buffers and submodules),
registering a parameter, buffer or submodule, Module._apply (to, cuda, double...), assigning a tensor's .data, and
a failed load_state_dict restoring what it had changed.

NOTE: each change stores a fresh number from one counter (never `+= 1`): with threads, a read-add-store could
store a number a reader has already seen, after a later change; a number from next() is never stored twice. A
change bumps after it is made, so a reader that sees the new number sees the change.
"""
from __future__ import annotations

import itertools

_next = itertools.count(1).__next__
VERSION = [0]  # the current number: read VERSION[0]


def bump() -> None:
    """Record that module state changed (call it after the change)."""
    VERSION[0] = _next()
