"""When the optimizers' one-pass updates run (large contiguous arrays) and on how many threads (timed choice)."""
from __future__ import annotations

import statistics
import time

import numpy as np

_FUSABLE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# NOTE: below this, numpy's few passes over an array that fits in L1 cost less than a numba launch (a bias of
# 512 floats: ~4 us against ~6 us)
MIN_ELEMENTS = 2 ** 16


def fusable(*arrays: np.ndarray, min_elements: int = MIN_ELEMENTS) -> bool:
    """Large enough, same shape and float dtype, C-contiguous, and the first (the one written) writeable."""
    first = arrays[0]
    if first.size < min_elements or first.dtype not in _FUSABLE_DTYPES or not first.flags.writeable:
        return False
    dtype, shape = first.dtype, first.shape
    for a in arrays:  # NOTE: a loop, not all() over a generator: checked per parameter per step
        if a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
            return False
    return True


class LaunchChoice:
    """Serial or parallel loops for one optimizer's one-pass updates, picked by timing both on its first steps.

    NOTE: neither wins everywhere, and what decides it is the thread pools around the step, which the optimizer
    cannot see. In a small-batch step of nnc's parallel kernels numba's threads are awake and the parallel
    update is ~2x faster (it also reads gradients where those kernels' threads wrote them). Beside OpenBLAS
    (a large-batch step) OpenBLAS's idle threads spin on the cores numba's threads need: the parallel update
    ran 3-15x slower. So the first TRIALS steps run serial and the next TRIALS parallel (serial first: spinning
    threads left by a parallel step would slow the serial one after it), timing the updates, and the mode with the
    lower median is kept. Both give identical results, so the choice only moves time."""

    TRIALS = 4

    def __init__(self) -> None:
        self.seconds: dict[bool, list[float]] = {False: [], True: []}
        self.parallel: bool | None = None  # None: still trying

    def next(self) -> bool:
        """Whether this step's updates run parallel."""
        if self.parallel is not None:
            return self.parallel
        return len(self.seconds[False]) >= self.TRIALS

    def record(self, parallel: bool, seconds: float) -> None:
        if self.parallel is not None:
            return
        self.seconds[parallel].append(seconds)
        if min(len(v) for v in self.seconds.values()) >= self.TRIALS:
            self.parallel = statistics.median(self.seconds[True]) < statistics.median(self.seconds[False])


class StepTimer:
    """The launch mode of one optimizer step and the time its one-pass updates took."""

    def __init__(self, choice: LaunchChoice) -> None:
        self.choice, self.parallel, self.seconds = choice, choice.next(), 0.0

    def run(self, update) -> None:
        """update(parallel) in this step's mode, timed."""
        start = time.perf_counter()
        update(self.parallel)
        self.seconds += time.perf_counter() - start

    def finish(self) -> None:
        if self.seconds:
            self.choice.record(self.parallel, self.seconds)


class OnePassUpdates:
    """Mixin for optimizers whose `_update` may run a one-pass kernel: each `step` runs those kernels in the mode
    its LaunchChoice picks, timed. The subclass sets `self._launch = LaunchChoice()` in its __init__."""

    def step(self, closure=None):
        self._timer = StepTimer(self._launch)
        try:
            return super().step(closure)
        finally:
            self._timer.finish()
            self._timer = None

    def _run_one_pass(self, update) -> None:
        """update(parallel) in this step's mode; serial and untimed when a subclass's own step() called _update."""
        timer = getattr(self, "_timer", None)
        if timer is None:
            update(False)
        else:
            timer.run(update)
