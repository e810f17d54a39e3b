"""runtime.distributed: torch.distributed's collectives on MPI (mpi4py), for `mpiexec -n N python train.py`."""
from __future__ import annotations

import enum
import importlib.util
import os
import sys
import time

import numpy as np

from .. import futures

__all__ = ["ReduceOp", "Work", "GradBucket", "ProcessGroup", "GroupMember", "group", "is_available", "is_mpi_available",
           "is_initialized", "init_process_group", "destroy_process_group", "new_group", "get_backend", "get_rank",
           "get_world_size", "get_global_rank", "get_group_rank", "get_process_group_ranks", "barrier", "all_reduce",
           "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
           "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
           "all_gather_object", "broadcast_object_list"]


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


class _NonMember:
    """What new_group returns on a rank outside the group: collectives given it do nothing, as torch's."""

    def __repr__(self) -> str:
        return "<runtime.distributed NON_GROUP_MEMBER>"


class GroupMember:
    WORLD = _World()
    NON_GROUP_MEMBER = _NonMember()


class GradBucket:
    """What a DDP comm hook gets: one bucket's gradients as a flat buffer (torch.distributed.GradBucket)."""

    def __init__(self, index: int, buffer, parameters, gradients, is_last: bool):
        self._index, self._buffer, self._parameters = index, buffer, list(parameters)
        self._gradients, self._is_last = list(gradients), is_last

    def index(self) -> int:
        return self._index

    def buffer(self):
        """The bucket's gradients, flattened into one 1-d tensor (divided by nothing yet: the hook averages)."""
        return self._buffer

    def gradients(self) -> list:
        """Each parameter's gradient, a view of buffer() in its parameter's shape."""
        return self._gradients

    def parameters(self) -> list:
        return self._parameters

    def is_last(self) -> bool:
        return self._is_last

    def set_buffer(self, buffer) -> None:
        self._buffer._data[...] = buffer._data.reshape(self._buffer._data.shape)


class ProcessGroup:
    """A subgroup of the ranks (new_group), with its own MPI communicator; rank() and size() within the group."""

    def __init__(self, comm, ranks):
        self._comm, self._ranks = comm, list(ranks)

    def rank(self) -> int:
        return self._comm.Get_rank()

    def size(self) -> int:
        return self._comm.Get_size()

    def __repr__(self) -> str:
        return f"<runtime.distributed ProcessGroup ranks={self._ranks}>"


class group:  # noqa: N801  (torch spells it in lower case)
    WORLD = GroupMember.WORLD


_state = {"comm": None, "MPI": None, "excepthook": None, "groups": []}
_NOT_INIT = ("Default process group has not been initialized, please make sure to call init_process_group.")


def is_available() -> bool:
    """True when mpi4py can be imported (MPI itself starts at init_process_group)."""
    return importlib.util.find_spec("mpi4py") is not None


is_mpi_available = is_available


def is_initialized() -> bool:
    return _state["comm"] is not None


def _comm(group=None):
    """The MPI communicator of `group` (None or WORLD: every rank), or None on a rank outside it."""
    comm = _state["comm"]
    if comm is None:
        raise ValueError(_NOT_INIT)
    if group is None or group is GroupMember.WORLD:
        return comm
    if group is GroupMember.NON_GROUP_MEMBER:
        return None
    if isinstance(group, ProcessGroup):
        if group._comm is None:
            raise ValueError(f"{group!r} was destroyed")
        return group._comm
    raise TypeError(f"group must be a ProcessGroup from new_group, WORLD or None, got {type(group).__name__}")


def _group_rank(group, global_rank: int, what: str = "rank") -> int:
    """The rank within `group` of a global rank (torch's src and dst are global ranks)."""
    if group is None or group is GroupMember.WORLD:
        size = _state["comm"].Get_size()
        if not 0 <= global_rank < size:
            raise ValueError(f"Invalid {what} {global_rank} for a world of size {size}")
        return global_rank
    try:
        return group._ranks.index(global_rank)
    except ValueError:
        raise ValueError(f"Global rank {global_rank} ({what}) is not part of {group!r}") from None


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
        # NOTE: Abort kills every rank at once, and mpiexec's I/O forwarding drops what it has not yet passed on: the
        # traceback above went missing from the job's stderr under load (tests/test_distributed.py). A moment first.
        time.sleep(0.5)
        MPI.COMM_WORLD.Abort(1)


def destroy_process_group(group=None) -> None:
    """Free a subgroup's communicator; with no argument (or WORLD), every group's and the default one."""
    if isinstance(group, ProcessGroup):
        if group._comm is not None:
            group._comm.Free()
            group._comm = None
        return
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    comm = _comm(group)
    for sub in _state["groups"]:
        destroy_process_group(sub)
    _state["groups"] = []
    comm.Free()
    _state["comm"] = None
    if _state["excepthook"] is not None and sys.excepthook is _abort_on_uncaught:
        sys.excepthook = _state["excepthook"]
    _state["excepthook"] = None


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization: bool = False,
              group_desc=None, device_id=None):
    """A group of the given global ranks (all if None), ordered by global rank as torch's. Every rank of the job must
    call it (an MPI_Comm_create over the world); a rank outside the group gets GroupMember.NON_GROUP_MEMBER."""
    world = _comm()
    size = world.Get_size()
    ranks = list(range(size)) if ranks is None else sorted(int(r) for r in ranks)
    if len(set(ranks)) != len(ranks) or any(not 0 <= r < size for r in ranks):
        raise ValueError(f"new_group: ranks must be distinct ranks of the world (size {size}), got {ranks}")
    if backend not in (None, "mpi", "MPI"):
        raise ValueError(f"backend {backend!r} is not available: runtime.distributed runs on MPI (backend='mpi')")
    everyone = world.Get_group()
    chosen = everyone.Incl(ranks)
    comm = world.Create(chosen)
    chosen.Free()
    everyone.Free()
    if comm == _state["MPI"].COMM_NULL:
        return GroupMember.NON_GROUP_MEMBER
    pg = ProcessGroup(comm, ranks)
    _state["groups"].append(pg)
    return pg


def get_backend(group=None) -> str:
    _comm(group)
    return "mpi"


def get_rank(group=None) -> int:
    """This process's rank in `group` (-1 outside it)."""
    comm = _comm(group)
    return -1 if comm is None else comm.Get_rank()


def get_world_size(group=None) -> int:
    """The number of ranks in `group` (-1 outside it, as torch)."""
    comm = _comm(group)
    return -1 if comm is None else comm.Get_size()


def get_process_group_ranks(group) -> list:
    """The global ranks of `group`, in group-rank order."""
    if group is None or group is GroupMember.WORLD:
        return list(range(_comm().Get_size()))
    return list(group._ranks)


def get_global_rank(group, group_rank: int) -> int:
    ranks = get_process_group_ranks(group)
    if not 0 <= group_rank < len(ranks):
        raise ValueError(f"Group rank {group_rank} is not part of {group!r}")
    return ranks[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    return _group_rank(group, global_rank)


# ----------------------------------------------------------------------------------------------------------------
# Work: the handle of a non-blocking collective
# ----------------------------------------------------------------------------------------------------------------

class Work:
    """A collective in flight (async_op=True): wait() blocks until it is done and its results are in the tensors."""

    def __init__(self, requests, finish=None, keep=None, result=None):
        self._requests = list(requests)
        self._finish = finish
        self._keep = keep  # a buffer MPI reads until completion (a contiguous copy of the caller's tensor)
        self._result = list(result or [])  # the tensors the collective writes (Work.result(), the future's value)
        self._done = False

    def _complete(self) -> None:
        self._requests, self._keep = [], None
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

    def result(self) -> list:
        return self._result

    def get_future(self) -> futures.Future:
        """A Future completed by this Work; its value is the list of tensors the collective wrote, as torch's."""
        future = futures.Future()
        future._complete = lambda: (self.wait(), self._result)[1]
        future._poll = self.is_completed
        future._requests = lambda: [] if self._done else self._requests
        return future


def _run(requests, finish, async_op: bool, keep=None, result=None):
    work = Work(requests, finish, keep, result)
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
    if comm is None:
        return None  # not in the group: nothing to do, as torch
    return _run([comm.Ibarrier()], None, async_op)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce `tensor` over all ranks in place; every rank gets the result."""
    comm = _comm(group)
    if comm is None:
        return None  # not in the group: nothing to do, as torch
    buf, source = _work_buffer(tensor)
    op, mpi_op = _mpi_op(op, buf.dtype)
    request = comm.Iallreduce(_state["MPI"].IN_PLACE, buf, op=mpi_op)

    def finish():
        _average(buf, comm.Get_size(), op)
        _written(tensor, buf, source)
    return _run([request], finish, async_op, result=[tensor])


def reduce(tensor, dst: int, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce `tensor` over all ranks into rank `dst`'s tensor (the others' are left unchanged)."""
    comm = _comm(group)
    if comm is None:
        return None  # not in the group: nothing to do, as torch
    buf, source = _work_buffer(tensor)
    op, mpi_op = _mpi_op(op, buf.dtype)
    dst = _group_rank(group, dst, "dst")
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
    if comm is None:
        return None  # not in the group: nothing to do, as torch
    buf, source = _work_buffer(tensor)
    request = comm.Ibcast(buf, root=_group_rank(group, src, "src"))
    return _run([request], lambda: _written(tensor, buf, source), async_op, result=[tensor])


def _check_same(tensors, like, what: str) -> None:
    for t in tensors:
        a = _array(t, what)
        if a.shape != like.shape or a.dtype != like.dtype:
            raise ValueError(f"{what}: every tensor must have shape {tuple(like.shape)} and dtype {like.dtype}, "
                             f"got {tuple(a.shape)} {a.dtype}")


def all_gather(tensor_list, tensor, group=None, async_op: bool = False):
    """tensor_list[i] = rank i's tensor, on every rank."""
    comm = _comm(group)
    if comm is None:
        return None  # not in the group: nothing to do, as torch
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
    if comm is None:
        return None  # not in the group: nothing to do, as torch
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
    if comm is None:
        return None  # not in the group: nothing to do, as torch
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
    if comm is None:
        return None  # not in the group: nothing to do, as torch
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
    comm = _comm(group)
    if comm is not None:
        object_list[:] = comm.allgather(obj)


def broadcast_object_list(object_list, src: int = 0, group=None, device=None) -> None:
    comm = _comm(group)
    if comm is not None:
        object_list[:] = comm.bcast(list(object_list), root=_group_rank(group, src, "src"))


def gather(tensor, gather_list=None, dst: int = 0, group=None, async_op: bool = False):
    """gather_list[i] on rank `dst` = rank i's tensor (i: rank in the group); the other ranks give no list."""
    comm = _comm(group)
    if comm is None:
        return None
    root = _group_rank(group, dst, "dst")
    data = np.ascontiguousarray(_array(tensor))
    if comm.Get_rank() != root:
        if gather_list:
            raise ValueError("Argument ``gather_list`` must NOT be specified on non-destination ranks.")
        return _run([comm.Igather(data, None, root=root)], None, async_op, keep=data)
    if gather_list is None or len(gather_list) != comm.Get_size():
        raise ValueError(f"gather needs a gather_list of {comm.Get_size()} tensors on the destination rank")
    _check_same(gather_list, data, "gather's gather_list")
    out = np.empty((comm.Get_size(),) + data.shape, dtype=data.dtype)

    def finish():
        for i, t in enumerate(gather_list):
            t._data[...] = out[i]
            t._bump_version()
    return _run([comm.Igather(data, out, root=root)], finish, async_op, keep=data)


def scatter(tensor, scatter_list=None, src: int = 0, group=None, async_op: bool = False):
    """Rank i's tensor = scatter_list[i] of rank `src` (i: rank in the group); the other ranks give no list."""
    comm = _comm(group)
    if comm is None:
        return None
    root = _group_rank(group, src, "src")
    buf, source = _work_buffer(tensor)
    send = None
    if comm.Get_rank() == root:
        if scatter_list is None or len(scatter_list) != comm.Get_size():
            raise ValueError(f"scatter needs a scatter_list of {comm.Get_size()} tensors on the source rank")
        _check_same(scatter_list, buf, "scatter's scatter_list")
        send = np.stack([_array(t) for t in scatter_list])
    elif scatter_list:
        raise ValueError("Argument ``scatter_list`` must NOT be specified on non-source ranks.")
    request = comm.Iscatter(send, buf, root=root)
    return _run([request], lambda: _written(tensor, buf, source), async_op, keep=send)


def _vector(arrays):
    """One flat array of `arrays` and its (counts, displacements) for MPI's v-collectives."""
    counts = [a.size for a in arrays]
    displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist() if counts else []
    return counts, displacements


def _one_dtype(tensors, what: str) -> np.dtype:
    dtypes = {_array(t, what).dtype for t in tensors}
    if len(dtypes) > 1:
        raise ValueError(f"{what}: every tensor must have the same dtype, got {sorted(map(str, dtypes))}")
    return dtypes.pop()


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False):
    """output_tensor_list[i] = rank i's input_tensor_list[this rank]; sizes may differ between pairs of ranks."""
    comm = _comm(group)
    if comm is None:
        return None
    size = comm.Get_size()
    if len(output_tensor_list) != size or len(input_tensor_list) != size:
        raise ValueError(f"all_to_all needs {size} output and {size} input tensors")
    dtype = _one_dtype(list(output_tensor_list) + list(input_tensor_list), "all_to_all")
    inputs = [np.ascontiguousarray(_array(t)).reshape(-1) for t in input_tensor_list]
    send = np.concatenate(inputs)
    outs = [_array(t) for t in output_tensor_list]
    recv = np.empty(sum(o.size for o in outs), dtype=dtype)
    MPI = _state["MPI"]
    kind = MPI._typedict[dtype.char]
    request = comm.Ialltoallv([send, _vector(inputs), kind], [recv, _vector(outs), kind])

    def finish():
        start = 0
        for t, o in zip(output_tensor_list, outs):
            o[...] = recv[start:start + o.size].reshape(o.shape)
            start += o.size
            t._bump_version()
    return _run([request], finish, async_op, keep=send)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False):
    """Split `input` along dim 0 (equally, or by input_split_sizes), send piece i to rank i, and concatenate what
    the ranks sent into `output` (split by output_split_sizes)."""
    comm = _comm(group)
    if comm is None:
        return None
    size = comm.Get_size()
    send = np.ascontiguousarray(_array(input))
    buf, source = _work_buffer(output)
    if send.dtype != buf.dtype:
        raise ValueError(f"all_to_all_single: input is {send.dtype} but output is {buf.dtype}")

    def counts(array, splits, what):
        rows = array.shape[0] if array.ndim else 1
        row = array.size // rows if rows else 0
        if splits is None:
            if rows % size:
                raise ValueError(f"all_to_all_single: {what}'s dim 0 ({rows}) is not divisible by the world size "
                                 f"({size}); give {what}_split_sizes")
            splits = [rows // size] * size
        splits = [int(s) for s in splits]
        if len(splits) != size or sum(splits) != rows:
            raise ValueError(f"all_to_all_single: {what}_split_sizes must be {size} sizes summing to {rows}")
        elements = [s * row for s in splits]
        return elements, np.concatenate([[0], np.cumsum(elements)[:-1]]).astype(int).tolist()
    kind = _state["MPI"]._typedict[buf.dtype.char]
    request = comm.Ialltoallv([send, counts(send, input_split_sizes, "input"), kind],
                              [buf, counts(buf, output_split_sizes, "output"), kind])
    return _run([request], lambda: _written(output, buf, source), async_op, keep=send)


# ----------------------------------------------------------------------------------------------------------------
# point to point
# ----------------------------------------------------------------------------------------------------------------

def isend(tensor, dst: int, group=None, tag: int = 0):
    """Start sending `tensor` to rank `dst`; the Work's wait() returns once it may be changed again."""
    comm = _comm(group)
    if comm is None:
        return None
    data = np.ascontiguousarray(_array(tensor))
    return Work([comm.Isend(data, dest=_group_rank(group, dst, "dst"), tag=tag)], keep=data)


def irecv(tensor, src=None, group=None, tag: int = 0):
    """Start receiving into `tensor` from rank `src` (any rank if None); the data is there after wait()."""
    comm = _comm(group)
    if comm is None:
        return None
    MPI = _state["MPI"]
    buf, source = _work_buffer(tensor)
    peer = MPI.ANY_SOURCE if src is None else _group_rank(group, src, "src")
    return Work([comm.Irecv(buf, source=peer, tag=tag)], lambda: _written(tensor, buf, source))


def send(tensor, dst: int, group=None, tag: int = 0) -> None:
    """Send `tensor` to rank `dst` (blocks until it may be changed again)."""
    work = isend(tensor, dst, group, tag)
    if work is not None:
        work.wait()


def recv(tensor, src=None, group=None, tag: int = 0) -> int:
    """Receive into `tensor` from rank `src` (any rank if None); returns the sender's global rank (-1 outside the
    group)."""
    comm = _comm(group)
    if comm is None:
        return -1
    MPI = _state["MPI"]
    buf, source = _work_buffer(tensor)
    status = MPI.Status()
    comm.Recv(buf, source=MPI.ANY_SOURCE if src is None else _group_rank(group, src, "src"), tag=tag, status=status)
    _written(tensor, buf, source)
    return get_global_rank(group, status.Get_source())
