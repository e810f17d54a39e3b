"""Anomaly detection (torch.autograd.detect_anomaly): backward raises where a node returns nan gradients, and an
error inside a backward node says which line of the forward made that node."""
from __future__ import annotations

import os
import traceback
import warnings


class _State:
    enabled = False
    check_nan = True


state = _State()  # NOTE: process-wide, as torch's anomaly mode is (not per thread)

_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_anomaly_enabled() -> bool:
    return state.enabled


def is_anomaly_check_nan_enabled() -> bool:
    return state.check_nan


class detect_anomaly:
    """Inside, backward raises a RuntimeError when a node returns a gradient holding nan (unless check_nan=False),
    and a backward node that fails warns with the traceback of the forward call that made it."""

    def __init__(self, check_nan: bool = True):
        self.check_nan = check_nan
        warnings.warn("Anomaly Detection has been enabled. This mode will increase the runtime and should only be "
                      "enabled for debugging.", stacklevel=2)

    def __enter__(self):
        self.previous = state.enabled, state.check_nan
        state.enabled, state.check_nan = True, self.check_nan
        return None

    def __exit__(self, *exc):
        state.enabled, state.check_nan = self.previous
        return False


class set_detect_anomaly:
    """Turn anomaly detection on or off now; used as a `with` block, the previous setting comes back after it."""

    def __init__(self, mode: bool, check_nan: bool = True):
        self.previous = state.enabled, state.check_nan
        state.enabled, state.check_nan = bool(mode), bool(check_nan)

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        state.enabled, state.check_nan = self.previous
        return False


def forward_trace() -> str:
    """The caller's stack without runtime's own frames (recorded on a node while anomaly detection is on)."""
    inside = _RUNTIME_DIR + os.sep  # (a user's runtime_utils.py beside the package is the user's)
    frames = [f for f in traceback.extract_stack()[:-1] if not os.path.abspath(f.filename).startswith(inside)]
    return "".join(traceback.format_list(frames))


def check_gradients(node, grads) -> None:
    """Raise torch's error where a node returned a gradient holding nan."""
    if not state.check_nan:
        return
    for k, g in enumerate(grads):
        if g is not None and g.dtype.is_differentiable and bool(g.isnan().any()):
            raise RuntimeError(f"Function '{node.name()}' returned nan values in its {k}th output.")


def warn_of_failure(node) -> None:
    """Name the forward call that made `node` (its trace, recorded when anomaly detection was on)."""
    trace = getattr(node, "forward_trace", None)
    if trace is not None:
        warnings.warn(f"Error detected in {node.name()}. Traceback of forward call that caused the error:\n{trace}",
                      stacklevel=2)
