"""numpy's floating-point warnings held back while an eager op computes: torch gives inf and nan without a word.

`np.errstate(all="ignore")` costs about 1.2 us to enter and leave, a third of a small op's whole dispatch (3.5 us for
`a + b`). numpy 2 keeps that state in a context variable: `set_state(IGNORE)` swaps in a prepared "ignore" state and
`reset_state(token)` puts the caller's back, both C calls (about 0.1 us together). numpy's private names may move, so
without them this falls back to np.errstate.
"""
from __future__ import annotations

import numpy as np

try:
    from numpy._core._ufunc_config import _extobj_contextvar
    from numpy._core.umath import _make_extobj

    IGNORE = _make_extobj(all="ignore")
    set_state = _extobj_contextvar.set
    reset_state = _extobj_contextvar.reset
except (ImportError, AttributeError, TypeError):  # numpy 1.x, or numpy moved them
    IGNORE = "ignore"

    def set_state(mode):
        """Enter np.errstate(all=mode); the token `reset_state` takes."""
        state = np.errstate(all=mode)
        state.__enter__()
        return state

    def reset_state(token) -> None:
        token.__exit__(None, None, None)
