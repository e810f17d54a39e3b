"""OpenBLAS's thread count for each BLAS kernel, chosen by timing both counts as the kernel runs.

NOTE: on a machine other processes load, a multi-threaded OpenBLAS product waits for cores its threads cannot get:
a GPT training step's 64x512x256 products took 26 ms each at load 10 on 2 cores, against 1.2 ms on one thread (the
whole step: 1146 ms against 49 ms). On a quiet machine the threads win. So a kernel whose product is large enough
for OpenBLAS to thread times its first calls with both counts, keeps the faster, and re-times the other count now
and then, as load comes and goes. numpy has no way to size its BLAS pool; threadpoolctl (the library scikit-learn
uses for this) finds the loaded OpenBLAS and sets its count. Without it, or without OpenBLAS, nothing changes.
"""
from __future__ import annotations

import time

# Products smaller than this (multiply-adds) run on one thread inside OpenBLAS anyway: not worth a choice.
MIN_WORK = 2 ** 18
_PROBE_CALLS = 6       # the first calls alternate the two counts
_REPROBE_EVERY = 64    # then every so many calls one runs with the count not chosen
_SMOOTHING = 0.3       # weight of a new time in a count's running estimate

_controller = None
_looked = False


def openblas():
    """threadpoolctl's controller of the loaded OpenBLAS, or None."""
    global _controller, _looked
    if not _looked:
        _looked = True
        try:
            import numpy  # noqa: F401  (threadpoolctl finds the libraries loaded so far)
            from threadpoolctl import ThreadpoolController

            found = ThreadpoolController().select(internal_api="openblas").lib_controllers
            _controller = found[0] if found and found[0].num_threads > 1 else None
            if _controller is not None:
                _controller.default_threads = _controller.num_threads  # this process's count: restored each time
        except Exception:  # no threadpoolctl, or it cannot inspect this process: leave BLAS as it is
            _controller = None
    return _controller


class ThreadChoice:
    """Runs one kernel's launches with OpenBLAS's own thread count or with one thread, whichever its recent calls
    found faster."""

    __slots__ = ("calls", "estimate", "single")

    def __init__(self):
        self.calls = 0
        self.estimate = [None, None]  # seconds per call: [default count, one thread]
        self.single = False           # the current choice

    def run(self, launch) -> None:
        calls = self.calls
        self.calls = calls + 1
        if calls < _PROBE_CALLS:
            single = bool(calls % 2)
        elif calls % _REPROBE_EVERY == 0:
            single = not self.single
        else:
            single = self.single
        lib = openblas()
        start = time.perf_counter()
        if single:
            lib.set_num_threads(1)
            try:
                launch()
            finally:
                lib.set_num_threads(lib.default_threads)
        else:
            launch()
        self._record(single, time.perf_counter() - start)

    def _record(self, single: bool, seconds: float) -> None:
        previous = self.estimate[single]
        self.estimate[single] = seconds if previous is None else previous + _SMOOTHING * (seconds - previous)
        if self.calls >= _PROBE_CALLS:
            default, one = self.estimate
            self.single = default is not None and one is not None and one < default


def choice_for(kernel, source: str) -> ThreadChoice | None:
    """A ThreadChoice for a matmul kernel whose generated launcher calls BLAS on a product large enough for OpenBLAS
    to thread, else None."""
    if kernel.kind != "matmul" or not ("np.dot(" in source or "np.matmul(" in source):
        return None
    from .kernel import matmul_nodes
    from .symbolic import hint_int

    work = 0
    for node in matmul_nodes(kernel):
        a = node.args[0]
        out_elements = 1
        for size in node.meta["shape"]:
            out_elements *= hint_int(size)
        work += out_elements * hint_int(a.meta["shape"][-1])
    return ThreadChoice() if work >= MIN_WORK and openblas() is not None else None
