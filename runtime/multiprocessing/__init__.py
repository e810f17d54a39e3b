"""torch.multiprocessing for runtime: Python's multiprocessing, through which a tensor in shared memory
(Tensor.share_memory_, Module.share_memory) reaches another process as the same memory, and `spawn`.

NOTE: torch also moves an unshared CPU tensor into shared memory when it is sent; runtime sends such a tensor by
value (a copy), so only tensors shared on purpose are shared, and a sender's short-lived tensor (a batch) never
leaves a segment behind that its receiver would need.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import traceback
from multiprocessing import *  # noqa: F401,F403
from multiprocessing.reduction import ForkingPickler

from .._shared_memory import attach, find
from ..nn.parameter import Buffer, Parameter
from ..tensor import Tensor


def _reduce(tensor):
    """How multiprocessing's pickler sends a tensor: by segment name and place when its values are shared, else as
    pickle does (by value)."""
    rebuild, args = tensor.__reduce_ex__(4)
    place = None if tensor.is_cuda else find(tensor._data)
    if place is None:
        return rebuild, args
    data = tensor._data
    return _rebuild_shared, (rebuild, args[0], *place, data.shape, data.strides, data.dtype.str, args[2])


def _rebuild_shared(rebuild, cls, name, offset, shape, strides, dtype, requires_grad):
    return rebuild(cls, attach(name, offset, shape, strides, dtype), requires_grad)


for _cls in (Tensor, Parameter, Buffer):
    ForkingPickler.register(_cls, _reduce)


class ProcessRaisedException(Exception):
    """A process `spawn` started raised: the message holds its traceback."""

    def __init__(self, msg: str, error_index: int, error_pid: int):
        super().__init__(msg)
        self.error_index, self.pid = error_index, error_pid


class ProcessExitedException(Exception):
    """A process `spawn` started ended with a nonzero exit code (killed, or os._exit)."""

    def __init__(self, msg: str, error_index: int, error_pid: int, exit_code: int):
        super().__init__(msg)
        self.error_index, self.pid, self.exit_code = error_index, error_pid, exit_code


def _wrap(fn, i: int, args: tuple, errors) -> None:
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass
    except Exception:  # noqa: BLE001 - any failure goes back to the parent, which raises it
        errors.put(traceback.format_exc())
        raise SystemExit(1) from None


class ProcessContext:
    """The processes `spawn` started; join() waits for them and raises the first failure."""

    def __init__(self, processes: list, error_queues: list):
        self.processes, self.error_queues = processes, error_queues

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds (None: until one ends); True when every process has ended well. A failed
        one gets the others terminated, and raises ProcessRaisedException (its traceback) or
        ProcessExitedException."""
        running = [p.sentinel for p in self.processes if p.exitcode is None]
        if running:
            multiprocessing.connection.wait(running, timeout)
        for i, p in enumerate(self.processes):
            if p.exitcode is None or p.exitcode == 0:
                continue
            for other in self.processes:
                if other.is_alive():
                    other.terminate()
                other.join()
            queue = self.error_queues[i]
            if not queue.empty():
                raise ProcessRaisedException(f"\n\n-- Process {i} terminated with the following error:\n"
                                             f"{queue.get()}", i, p.pid)
            raise ProcessExitedException(f"process {i} terminated with exit code {p.exitcode}", i, p.pid,
                                         p.exitcode)
        if all(p.exitcode == 0 for p in self.processes):
            for p in self.processes:
                p.join()
            return True
        return False


def start_processes(fn, args=(), nprocs: int = 1, join: bool = True, daemon: bool = False,
                    start_method: str = "spawn"):
    """fn(i, *args) for i in range(nprocs), each in a process of its own (torch.multiprocessing.start_processes)."""
    context = multiprocessing.get_context(start_method)
    queues = [context.SimpleQueue() for _ in range(nprocs)]
    processes = [context.Process(target=_wrap, args=(fn, i, tuple(args), queues[i]), daemon=daemon)
                 for i in range(nprocs)]
    for p in processes:
        p.start()
    result = ProcessContext(processes, queues)
    if not join:
        return result
    while not result.join():
        pass
    return None


def spawn(fn, args=(), nprocs: int = 1, join: bool = True, daemon: bool = False, start_method: str = "spawn"):
    """torch.multiprocessing.spawn: start_processes with the spawn start method."""
    return start_processes(fn, args, nprocs, join, daemon, start_method)
