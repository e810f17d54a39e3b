"""runtime.distributed: torch.distributed's collectives on MPI (mpi4py), for `mpiexec -n N python train.py`."""
from __future__ import annotations

import enum
import importlib.util
import os
import sys

import numpy as np

__all__ = ["ReduceOp", "Work", "GroupMember", "group", "is_available", "is_mpi_available", "is_initialized",
           "init_process_group", "destroy_process_group", "get_backend", "get_rank", "get_world_size", "barrier",
           "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
           "reduce_scatter_tensor", "all_gather_object", "broadcast_object_list"]


class ReduceOp(enum.Enum):
    """The reductions of all_reduce, reduce and reduce_scatter (torch.distributed.ReduceOp)."""
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"

    def __repr__(self) -> str:
        return f"<ReduceOp.{self.name}>"


class _World:
    """The default group: every process of the MPI job (MPI.COMM_WORLD)."""

    def __repr__(self) -> str:
        return "<runtime.distributed WORLD group>"


class GroupMember:
    WORLD = _World()
    NON_GROUP_MEMBER = None


class group:  # noqa: N801  (torch spells it in lower case)
    WORLD = GroupMember.WORLD


_state = {"comm": None, "MPI": None, "excepthook": None}
_NOT_INIT = ("Default process group has not been initialized, please make sure to call init_process_group.")


def is_available() -> bool:
    """True when mpi4py can be imported (MPI itself starts at init_process_group)."""
    return importlib.util.find_spec("mpi4py") is not None


is_mpi_available = is_available


def is_initialized() -> bool:
    return _state["comm"] is not None


def _comm(group=None):
    comm = _state["comm"]
    if comm is None:
        raise ValueError(_NOT_INIT)
    if group is not None and group is not GroupMember.WORLD:
        raise NotImplementedError("runtime.distributed supports only the default group (WORLD); new_group is not "
                                  "implemented")
    return comm


def init_process_group(backend: str | None = None, init_method=None, timeout=None, world_size: int = -1,
                       rank: int = -1, store=None, group_name: str = "", pg_options=None, device_id=None) -> None:
    """Join the MPI job: rank and world size come from MPI (mpiexec), so no env:// variables are needed.

    Installs an excepthook that, after printing the traceback, calls MPI.COMM_WORLD.Abort(1): a rank that dies of an
    uncaught exception (in a DDP step or anywhere) ends the whole job instead of leaving the others blocked in a
    collective. Set NNC_MPI_ABORT_ON_ERROR=0 to keep Python's own hook."""
    if backend not in (None, "mpi", "MPI"):
        raise ValueError(f"backend {backend!r} is not available: runtime.distributed runs on MPI (backend='mpi')")
    if _state["comm"] is not None:
        raise ValueError("trying to initialize the default process group twice!")
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise RuntimeError("runtime.distributed needs mpi4py and an MPI library: pip install mpi4py mpich") from exc
    comm = MPI.COMM_WORLD.Dup()
    if world_size not in (-1, None) and world_size != comm.Get_size():
        raise ValueError(f"world_size={world_size} but MPI started {comm.Get_size()} processes")
    if rank not in (-1, None) and rank != comm.Get_rank():
        raise ValueError(f"rank={rank} but MPI gave this process rank {comm.Get_rank()}")
    _state.update(comm=comm, MPI=MPI)
    if os.environ.get("NNC_MPI_ABORT_ON_ERROR", "1") != "0" and _state["excepthook"] is None:
        _state["excepthook"] = sys.excepthook
        sys.excepthook = _abort_on_uncaught


def _abort_on_uncaught(exc_type, exc, tb) -> None:
    previous = _state["excepthook"] or sys.__excepthook__
    previous(exc_type, exc, tb)
    MPI = _state["MPI"]
    if MPI is not None and not MPI.Is_finalized() and exc_type is not KeyboardInterrupt:
        sys.stderr.write(f"runtime.distributed: rank {MPI.COMM_WORLD.Get_rank()} raised {exc_type.__name__}; "
                         "calling MPI.COMM_WORLD.Abort(1) so the other ranks do not wait for it forever\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def destroy_process_group(group=None) -> None:
    comm = _comm(group)
    comm.Free()
    _state["comm"] = None
    if _state["excepthook"] is not None and sys.excepthook is _abort_on_uncaught:
        sys.excepthook = _state["excepthook"]
    _state["excepthook"] = None


def get_backend(group=None) -> str:
    _comm(group)
    return "mpi"


def get_rank(group=None) -> int:
    return _comm(group).Get_rank()


def get_world_size(group=None) -> int:
    return _comm(group).Get_size()


# ----------------------------------------------------------------------------------------------------------------
# Work: the handle of a non-blocking collective
# ----------------------------------------------------------------------------------------------------------------

class Work:
    """A collective in flight (async_op=True): wait() blocks until it is done and its results are in the tensors."""

    def __init__(self, requests, finish=None):
        self._requests = list(requests)
        self._finish = finish
        self._done = False

    def _complete(self) -> None:
        self._requests = []
        finish, self._finish = self._finish, None
        self._done = True
        if finish is not None:
            finish()

    def wait(self, timeout=None) -> bool:
        if not self._done:
            if self._requests:
                _state["MPI"].Request.Waitall(self._requests)
            self._complete()
        return True

    def is_completed(self) -> bool:
        if not self._done and (not self._requests or _state["MPI"].Request.Testall(self._requests)):
            self._complete()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed()

    def exception(self):
        return None


def _run(requests, finish, async_op: bool):
    work = Work(requests, finish)
    if async_op:
        return work
    work.wait()
    return None


# ----------------------------------------------------------------------------------------------------------------
# buffers
# ----------------------------------------------------------------------------------------------------------------

def _array(tensor, what: str = "tensor") -> np.ndarray:
    from ..tensor import Tensor

    if not isinstance(tensor, Tensor):
        raise TypeError(f"{what} must be a runtime Tensor, got {type(tensor).__name__}")
    return tensor._data


def _work_buffer(tensor):
    """A contiguous array the collective may read and write, and how to write it back into `tensor`."""
    data = _array(tensor)
    if data.flags.c_contiguous and data.flags.writeable:
        return data, None
    return np.ascontiguousarray(data), data


def _written(tensor, array, source=None) -> None:
    if source is not None:
        source[...] = array
    tensor._bump_version()


def _mpi_op(op, dtype: np.dtype):
    MPI = _state["MPI"]
    if not isinstance(op, ReduceOp):
        try:
            op = ReduceOp[str(op).upper().rpartition(".")[2]]
        except KeyError:
            raise ValueError(f"unknown reduce op {op!r}") from None
    if op is ReduceOp.AVG and dtype.kind not in "fc":
        raise ValueError(f"ReduceOp.AVG needs a floating point tensor, got {dtype}")
    if dtype == np.bool_:  # as torch: SUM and MAX of booleans are OR, PRODUCT and MIN are AND
        return op, (MPI.LOR if op in (ReduceOp.SUM, ReduceOp.MAX) else MPI.LAND)
    return op, {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD, ReduceOp.MIN: MPI.MIN,
                ReduceOp.MAX: MPI.MAX}[op]


def _average(array: np.ndarray, world: int, op) -> None:
    if op is ReduceOp.AVG:
        np.divide(array, world, out=array, casting="unsafe")


# ----------------------------------------------------------------------------------------------------------------
# collectives
# ----------------------------------------------------------------------------------------------------------------

def barrier(group=None, async_op: bool = False, device_ids=None):
    comm = _comm(group)
    return _run([comm.Ibarrier()], None, async_op)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce `tensor` over all ranks in place; every rank gets the result."""
    comm = _comm(group)
    buf, source = _work_buffer(tensor)
    op, mpi_op = _mpi_op(op, buf.dtype)
    request = comm.Iallreduce(_state["MPI"].IN_PLACE, buf, op=mpi_op)

    def finish():
        _average(buf, comm.Get_size(), op)
        _written(tensor, buf, source)
    return _run([request], finish, async_op)


def reduce(tensor, dst: int, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce `tensor` over all ranks into rank `dst`'s tensor (the others' are left unchanged)."""
    comm = _comm(group)
    buf, source = _work_buffer(tensor)
    op, mpi_op = _mpi_op(op, buf.dtype)
    root = comm.Get_rank() == dst
    if root:
        request = comm.Ireduce(_state["MPI"].IN_PLACE, buf, op=mpi_op, root=dst)
    else:
        request = comm.Ireduce(buf, None, op=mpi_op, root=dst)

    def finish():
        if root:
            _average(buf, comm.Get_size(), op)
            _written(tensor, buf, source)
    return _run([request], finish, async_op)


def broadcast(tensor, src: int, group=None, async_op: bool = False):
    """Copy rank `src`'s tensor into every rank's tensor."""
    comm = _comm(group)
    buf, source = _work_buffer(tensor)
    if not 0 <= src < comm.Get_size():
        raise ValueError(f"Invalid src rank {src} for a world of size {comm.Get_size()}")
    request = comm.Ibcast(buf, root=src)
    return _run([request], lambda: _written(tensor, buf, source), async_op)


def _check_same(tensors, like, what: str) -> None:
    for t in tensors:
        a = _array(t, what)
        if a.shape != like.shape or a.dtype != like.dtype:
            raise ValueError(f"{what}: every tensor must have shape {tuple(like.shape)} and dtype {like.dtype}, "
                             f"got {tuple(a.shape)} {a.dtype}")


def all_gather(tensor_list, tensor, group=None, async_op: bool = False):
    """tensor_list[i] = rank i's tensor, on every rank."""
    comm = _comm(group)
    data = np.ascontiguousarray(_array(tensor))
    if len(tensor_list) != comm.Get_size():
        raise ValueError(f"all_gather needs a tensor_list of {comm.Get_size()} tensors, got {len(tensor_list)}")
    _check_same(tensor_list, data, "all_gather's tensor_list")
    out = np.empty((comm.Get_size(),) + data.shape, dtype=data.dtype)
    request = comm.Iallgather(data, out)

    def finish():
        for i, t in enumerate(tensor_list):
            t._data[...] = out[i]
            t._bump_version()
    return _run([request], finish, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    """The ranks' inputs concatenated along dim 0 (or stacked, if output has one more dim) into output_tensor."""
    comm = _comm(group)
    data = np.ascontiguousarray(_array(input_tensor))
    buf, source = _work_buffer(output_tensor)
    if buf.size != data.size * comm.Get_size() or buf.dtype != data.dtype:
        raise ValueError(f"all_gather_into_tensor: output must hold world_size * {data.size} elements of "
                         f"{data.dtype}, got {tuple(buf.shape)} {buf.dtype}")
    request = comm.Iallgather(data, buf)
    return _run([request], lambda: _written(output_tensor, buf, source), async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """output on rank i = the reduction over ranks of their input_list[i]."""
    comm = _comm(group)
    buf, source = _work_buffer(output)
    if len(input_list) != comm.Get_size():
        raise ValueError(f"reduce_scatter needs an input_list of {comm.Get_size()} tensors, got {len(input_list)}")
    _check_same(input_list, buf, "reduce_scatter's input_list")
    send = np.stack([_array(t) for t in input_list]) if input_list else np.empty(0, buf.dtype)
    op, mpi_op = _mpi_op(op, buf.dtype)
    request = comm.Ireduce_scatter_block(send, buf, op=mpi_op)

    def finish():
        _average(buf, comm.Get_size(), op)
        _written(output, buf, source)
    return _run([request], finish, async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Rank i gets the reduction over ranks of the i-th of world_size equal slices of `input` (dim 0)."""
    comm = _comm(group)
    buf, source = _work_buffer(output)
    send = np.ascontiguousarray(_array(input))
    if send.size != buf.size * comm.Get_size() or send.dtype != buf.dtype:
        raise ValueError(f"reduce_scatter_tensor: input must hold world_size * {buf.size} elements of {buf.dtype}, "
                         f"got {tuple(send.shape)} {send.dtype}")
    op, mpi_op = _mpi_op(op, buf.dtype)
    request = comm.Ireduce_scatter_block(send, buf, op=mpi_op)

    def finish():
        _average(buf, comm.Get_size(), op)
        _written(output, buf, source)
    return _run([request], finish, async_op)


def all_gather_object(object_list, obj, group=None) -> None:
    """object_list[i] = rank i's obj (pickled by mpi4py: only for objects from trusted ranks of the same job)."""
    object_list[:] = _comm(group).allgather(obj)


def broadcast_object_list(object_list, src: int = 0, group=None, device=None) -> None:
    object_list[:] = _comm(group).bcast(list(object_list), root=src)
