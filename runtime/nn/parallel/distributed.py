"""DistributedDataParallel: rank 0's state broadcast at construction, gradients averaged over MPI in buckets.

How a step runs (as torch's Reducer):
- construction broadcasts the group's first rank's parameters and buffers, and assigns the parameters that require
  grad to buckets in reverse registration order (the order backward produces their gradients): a gradient of at
  least _SOLO_BYTES is a bucket of its own, reduced in place in its .grad array; the smaller ones between two such
  share a flat bucket (one dtype each, the first at most 1 MB and the others at most `bucket_cap_mb`);
- each forward (a pre-hook on this module, so it also runs around `nnc.compile(DDP(model))`) broadcasts the buffers
  and arms the reducer; with `find_unused_parameters` a forward hook walks the output's autograd graph to find the
  parameters it does not reach (marked ready at the first gradient of backward);
- during backward, right after a parameter's gradient is accumulated into `.grad` (the engine runs accumulators as
  soon as their gradient is complete), it is averaged in place or copied into its flat bucket; a complete bucket
  starts a non-blocking MPI all-reduce (or the comm hook), in bucket order on every rank, so all ranks issue the
  same sequence of collectives; MPI is driven along from the gradient hooks or a progress thread; when the last
  gradient is in, the reducer waits for all buckets and writes flat buckets' averages back into `.grad`.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time

import numpy as np

from ... import distributed as dist
from ...autograd import grad_mode
from ...autograd.graph import AccumulateGrad
from ...tensor import Tensor
from ..modules.module import Module

_FIRST_BUCKET_BYTES = 1024 * 1024
# a gradient of at least this many bytes (or of the bucket cap, if smaller) is all-reduced in place in its own
# array: no copy into a bucket and back (see _build_buckets)
_SOLO_BYTES = 128 * 1024
_TWICE = ("Expected to mark a variable ready only once. Parameter {} received a gradient twice in one iteration (a "
          "second backward through the same forward, or a parameter used in a reentrant backward).")


class _Bucket:
    def __init__(self, index: int, dtype, solo: bool = False):
        self.index, self.dtype, self.solo = index, dtype, solo
        self.params, self.offsets = [], []
        self.numel = 0
        self.flat = None  # a flat bucket's buffer; a solo bucket's staging array (allocated when first needed)
        self.array = None  # what this step all-reduces: `flat`, or a solo parameter's own .grad array
        self.pending = 0
        self.request = None
        self.future = None  # with a comm hook: the hook's Future of this bucket's averaged gradients

    @property
    def flat_dtype(self) -> np.dtype:
        return np.dtype(self.dtype.np)

    def add(self, position: int, param) -> None:
        self.params.append(position)
        self.offsets.append((self.numel, param.numel(), tuple(param.shape)))
        self.numel += param.numel()


class _Progress:
    """A thread that calls MPI_Testall on the reducer's requests in flight every `interval` seconds during backward.

    MPICH moves a non-blocking collective along only inside MPI calls; between two gradient hooks (a layer's backward,
    milliseconds) nothing happens, and a 4 MB all-reduce between 2 ranks needs about ten such calls. numpy releases
    the GIL inside BLAS and large ufunc loops, so this thread gets to run while backward computes, and mpi4py
    releases it inside MPI calls. The lock keeps one thread at a time testing the same requests (MPI forbids two)."""

    def __init__(self, MPI, interval: float):
        self.MPI, self.interval = MPI, interval
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.requests = None  # the list being polled, or None when idle
        self.thread = threading.Thread(target=self._run, name="nnc-ddp-progress", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            self.wake.wait()
            with self.lock:
                requests = self.requests
                if requests is None:
                    self.wake.clear()
                    continue
                live = [r for r in requests if r]
                if live:
                    self.MPI.Request.Testall(live)
            time.sleep(self.interval)

    def start(self, requests: list) -> None:
        with self.lock:
            self.requests = requests
        self.wake.set()

    def stop(self) -> None:
        with self.lock:
            self.requests = None


class DistributedDataParallel(Module):
    """Data-parallel training over MPI with torch's API: wrap the model, train as usual, launch with mpiexec."""

    def __init__(self, module, device_ids=None, output_device=None, dim: int = 0, broadcast_buffers: bool = True,
                 process_group=None, bucket_cap_mb=None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 init_sync: bool = True):
        super().__init__()
        if not dist.is_initialized():
            raise ValueError(dist._NOT_INIT)
        self.module = module
        self.process_group = process_group
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view  # .grad becomes a view of its bucket: no copy back
        self.bucket_bytes_cap = int((25 if bucket_cap_mb is None else bucket_cap_mb) * 1024 * 1024)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._comm = dist._comm(process_group)
        self._MPI = dist._state["MPI"]
        self._world = self._comm.Get_size()
        self._root = dist.get_global_rank(process_group, 0)  # state comes from the group's first rank, as torch
        self._parameters_to_sync = [p for p in module.parameters() if p.requires_grad]
        if not self._parameters_to_sync:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter that "
                               "requires a gradient.")
        if init_sync:
            self._broadcast_state(list(module.parameters()) + list(module.buffers()))
        self._build_buckets()
        self._hook_accumulators()
        self._armed = self._reduced = False  # a forward prepared this step's reduction; it is done
        self._started = False  # a gradient of this step arrived
        self._used_request = None
        # NOTE: how MPI progresses during backward: "thread", a thread polling every NNC_DDP_PROGRESS_US
        # microseconds (see _Progress), or "hooks", a poll from each gradient hook only. "auto" (the default): the
        # thread when this host has at least two cores per rank on it, else hooks (on 2 ranks sharing 2 cores the
        # thread's polls cost the backward more time than they save; docs/distributed.md has the figures)
        self.progress = os.environ.get("NNC_DDP_PROGRESS", "auto")
        if self.progress not in ("auto", "thread", "hooks"):
            raise ValueError(f"NNC_DDP_PROGRESS must be auto, thread or hooks, got {self.progress!r}")
        if self.progress == "auto":
            self.progress = "thread" if _cores() >= 2 * _ranks_on_this_host(self._comm) else "hooks"
        if self._MPI.Query_thread() < self._MPI.THREAD_MULTIPLE:
            self.progress = "hooks"  # MPI was started without thread support: no second thread may call it
        self._progress_interval = float(os.environ.get("NNC_DDP_PROGRESS_US", "100")) * 1e-6
        self._progress = None
        self._launched = []  # this step's requests, in launch order
        self._comm_hook = self._comm_hook_state = None
        self._joining = None  # inside join(): {"divide_by_initial_world_size": ...}
        self._join_divisor = None  # inside join() without dividing by the initial world size: ranks still training
        self.timings = {"wait_s": 0.0, "reduce_s": 0.0}  # the last reduction: time waiting at its end, first to last
        self._expose_signature(module)
        # NOTE: bound methods, not the hook's module argument: around nnc.compile(DDP(model)) the hooks are called
        # with the compiled module, whose attribute writes would not reach this reducer
        self.register_forward_pre_hook(self._pre_forward)
        self.register_forward_hook(self._post_forward)

    # -- construction --------------------------------------------------------------------------------------------

    def _broadcast_state(self, tensors) -> None:
        with grad_mode.no_grad():
            for t in tensors:
                dist.broadcast(t, src=self._root, group=self.process_group)

    def _build_buckets(self) -> None:
        # NOTE: a parameter of at least _SOLO_BYTES is a bucket of its own, all-reduced in place in its .grad array
        # (the array AccumulateGrad stored, or the one it accumulated into): no copy into a bucket and back, which
        # cost 30-45% of the all-reduce's time. The smaller parameters between two such ones share a flat bucket
        # (up to the cap), copied in and out as torch's. A solo parameter closes the flat bucket being filled, so
        # each bucket holds gradients that backward produces one after the other and is ready when its last one is.
        self._buckets, self._where = [], {}
        open_, count = {}, {}  # dtype -> the flat bucket being filled, and how many flat buckets that dtype has
        solo_bytes = min(_SOLO_BYTES, self.bucket_bytes_cap)
        for position in reversed(range(len(self._parameters_to_sync))):
            p = self._parameters_to_sync[position]
            itemsize = p._data.itemsize
            if p.numel() * itemsize >= solo_bytes:
                open_.pop(p.dtype, None)
                bucket = _Bucket(len(self._buckets), p.dtype, solo=True)
                self._buckets.append(bucket)
            else:
                first = count.get(p.dtype, 0) <= 1
                cap = min(_FIRST_BUCKET_BYTES, self.bucket_bytes_cap) if first else self.bucket_bytes_cap
                bucket = open_.get(p.dtype)
                if bucket is not None and bucket.numel and (bucket.numel + p.numel()) * itemsize > cap:
                    bucket = None
                if bucket is None:
                    bucket = open_[p.dtype] = _Bucket(len(self._buckets), p.dtype)
                    count[p.dtype] = count.get(p.dtype, 0) + 1
                    self._buckets.append(bucket)
            self._where[position] = (bucket, len(bucket.params))
            bucket.add(position, p)
        for bucket in self._buckets:
            if not bucket.solo:
                bucket.flat = bucket.array = np.zeros(bucket.numel, dtype=bucket.dtype.np)

    def _hook_accumulators(self) -> None:
        # NOTE: runtime has no post-accumulate-grad hook, so the reducer wraps each parameter's AccumulateGrad node
        # (held here, as torch's DDP holds its grad accumulators, so the same node serves every backward, eager or
        # compiled) to see .grad right after the gradient is added into it.
        self._grad_accs = []
        for position, p in enumerate(self._parameters_to_sync):
            acc = p._accumulator()
            if not isinstance(acc, AccumulateGrad):  # pragma: no cover - defensive
                raise RuntimeError("DistributedDataParallel: a parameter without an AccumulateGrad node")
            accumulate = acc.accumulate

            def hooked(grads, _accumulate=accumulate, _position=position):
                _accumulate(grads)
                self._grad_ready(_position, from_backward=True)
            acc.accumulate = hooked
            self._grad_accs.append(acc)

    # -- forward -------------------------------------------------------------------------------------------------

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _expose_signature(self, module) -> None:
        # NOTE: forward takes *inputs, as torch's; an instance-level forward carrying the wrapped module's signature
        # lets nnc.compile(DDP(model)) trace it (tracing names one placeholder per parameter of forward).
        try:
            signature = inspect.signature(module.forward)
        except (TypeError, ValueError):
            return
        module_call = self.module.__call__

        def forward(*inputs, **kwargs):
            return module_call(*inputs, **kwargs)
        forward.__signature__ = signature
        object.__setattr__(self, "forward", forward)

    def _pre_forward(self, module, args):
        if self._started:
            unready = [self._name_of(pos) for b in self._buckets for pos in b.params if b.pending and
                       not self._ready[pos]]
            self._disarm()
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting a new one. This error "
                "indicates that your module has parameters that were not used in producing loss. You can enable "
                "unused parameter detection by passing the keyword argument `find_unused_parameters=True` to "
                "`DistributedDataParallel`, and by making sure all `forward` function outputs participate in "
                f"calculating loss. Parameters that did not receive a gradient: {', '.join(unready)}")
        syncing = grad_mode.is_grad_enabled() and self.require_backward_grad_sync
        if self._joining is not None:  # tell the ranks that ran out of inputs what this step does, so they shadow it
            flags = self._join_flags(1, int(syncing), int(self._broadcasting_buffers()))
            if self._joining["throw"] and flags[0] < self._world:
                raise RuntimeError("Detected at least one rank that exhausted inputs. Throwing exception across all "
                                   "ranks.")
            if not self._joining["divide_by_initial_world_size"]:
                self._join_divisor = int(flags[0])
        if self._broadcasting_buffers():
            self._broadcast_state(list(self.module.buffers()))
        self._disarm()
        if syncing:
            self._arm()
        return None

    def _broadcasting_buffers(self) -> bool:
        return bool(self.broadcast_buffers and self.require_forward_param_sync and list(self.module.buffers()))

    def _join_flags(self, active: int, syncing: int, broadcasting: int) -> np.ndarray:
        """Sum over ranks of (still training, will all-reduce gradients, will broadcast buffers)."""
        flags = np.array([active, syncing, broadcasting], dtype=np.int64)
        self._comm.Allreduce(self._MPI.IN_PLACE, flags, op=self._MPI.SUM)
        return flags

    def _post_forward(self, module, args, output):
        syncing = grad_mode.is_grad_enabled() and self.require_backward_grad_sync
        self.require_forward_param_sync = syncing
        if syncing and self.find_unused_parameters:
            self._mark_unused(output)
        return None

    def _arm(self) -> None:
        self._armed = True
        self._ready = [False] * len(self._parameters_to_sync)
        for bucket in self._buckets:
            bucket.pending = len(bucket.params)
            bucket.request = None
        self._next_bucket = 0
        self._first_ready_at = None
        self._launched = []
        self._unused = []  # find_unused_parameters: marked ready at the first gradient of backward, as torch

    def _disarm(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        self._armed = self._started = self._reduced = False
        for bucket in self._buckets:
            if bucket.request is not None:
                bucket.request.Wait()  # a reduction cut short by an error: finish it so buffers are not in use
                bucket.request = None
            if bucket.future is not None:
                future, bucket.future = bucket.future, None
                future.wait()
        if self._used_request is not None:
            self._used_request.Wait()
            self._used_request = None

    def _mark_unused(self, output) -> None:
        reached = set()
        stack = [t.grad_fn for t in _tensors_in(output) if t.grad_fn is not None]
        stack += [t._accumulator() for t in _tensors_in(output) if t.grad_fn is None and t.requires_grad]
        seen = set(stack)
        while stack:
            node = stack.pop()
            if isinstance(node, AccumulateGrad):
                reached.add(id(node.variable))
                continue
            for edge in node.next_edges:
                if edge is not None and edge[0] not in seen:
                    seen.add(edge[0])
                    stack.append(edge[0])
        self._used_local = np.array([id(p) in reached for p in self._parameters_to_sync], dtype=np.int32)
        self._used_global = np.empty_like(self._used_local)
        self._used_request = self._comm.Iallreduce(self._used_local, self._used_global, op=self._MPI.MAX)
        # NOTE: marked ready when backward delivers its first gradient (torch's Reducer does the same), not here:
        # a zero_grad between forward and backward must still see .grad, not a buffer MPI is reducing
        self._unused = [position for position, used in enumerate(self._used_local) if not used]

    # -- backward ------------------------------------------------------------------------------------------------

    def _name_of(self, position: int) -> str:
        target = self._parameters_to_sync[position]
        for name, p in self.module.named_parameters():
            if p is target:
                return name
        return f"#{position}"

    def _grad_ready(self, position: int, from_backward: bool = False) -> None:
        if not self._armed:
            if self._reduced and from_backward:
                self._reduced = False
                raise RuntimeError(_TWICE.format(self._name_of(position)))
            return  # no_sync, or a backward the last forward did not prepare: gradients stay local
        if self._ready[position]:
            self._disarm()
            raise RuntimeError(_TWICE.format(self._name_of(position)))
        if from_backward and not self._started:
            self._started, self._first_ready_at = True, time.perf_counter()
            unused, self._unused = self._unused, []
            for other in unused:
                if other != position:
                    self._mark_ready(other)
        self._mark_ready(position)

    def _mark_ready(self, position: int) -> None:
        self._ready[position] = True
        bucket, slot = self._where[position]
        start, numel, shape = bucket.offsets[slot]
        grad = self._parameters_to_sync[position].grad
        if bucket.solo:
            data = None if grad is None else grad._data
            if data is not None and _reducible_in_place(data, bucket.flat_dtype):
                if self._comm_hook is None:  # (a comm hook averages itself)
                    np.divide(data, self._divisor, out=data)  # its own array: averaged, then all-reduced, in place
                bucket.array = data
            else:  # no gradient, or one MPI cannot reduce in place (strided, read-only): a staging array
                if bucket.flat is None:
                    bucket.flat = np.empty(shape, dtype=bucket.flat_dtype)
                if data is None:
                    bucket.flat[...] = 0
                else:
                    np.divide(data, self._divisor, out=bucket.flat)
                bucket.array = bucket.flat
        else:
            target = bucket.flat[start:start + numel]
            if grad is None:
                target[...] = 0
            else:  # the average is taken here (as torch, before the sum): one pass that also copies into the bucket
                source = grad._data
                np.divide(target if _is_slot(source, bucket.flat) else source.reshape(-1), self._divisor, out=target)
        bucket.pending -= 1
        MPI = self._MPI
        while self._next_bucket < len(self._buckets) and self._buckets[self._next_bucket].pending == 0:
            launch = self._buckets[self._next_bucket]
            self._next_bucket += 1
            if self._comm_hook is None:
                launch.request = self._comm.Iallreduce(MPI.IN_PLACE, launch.array, op=MPI.SUM)
                self._launched.append(launch.request)
            else:
                self._run_comm_hook(launch)
            if self.progress == "thread" and self._launched and (self._progress is None or
                                                                 self._progress.requests is not self._launched):
                if self._progress is None:
                    self._progress = _Progress(MPI, self._progress_interval)
                self._progress.start(self._launched)
        if self._next_bucket == len(self._buckets):
            self._finish()
        else:
            self._poll()

    @property
    def _divisor(self):
        if self._comm_hook is not None:
            return 1
        return self._join_divisor or self._world

    def _run_comm_hook(self, bucket) -> None:
        flat = bucket.array.reshape(-1)
        buffer = Tensor._from_array(flat)
        params = [self._parameters_to_sync[position] for position in bucket.params]
        gradients = [Tensor._from_array(flat[start:start + numel].reshape(shape))
                     for start, numel, shape in bucket.offsets]
        grad_bucket = dist.GradBucket(bucket.index, buffer, params, gradients, bucket.index == len(self._buckets) - 1)
        with grad_mode.no_grad():
            future = self._comm_hook(self._comm_hook_state, grad_bucket)
        if not hasattr(future, "wait"):
            raise RuntimeError(f"a DDP comm hook must return a Future, got {type(future).__name__}")
        bucket.future = future
        while future is not None and not hasattr(future, "_requests"):
            future = getattr(future, "_parent", None)
        if future is not None:
            self._launched.extend(future._requests())

    def _poll(self) -> None:
        """Drive MPI's progress engine (MPICH moves a non-blocking collective along only inside MPI calls)."""
        if self._progress is not None and self._progress.requests is not None:
            return  # the progress thread is on it
        live = [r for r in self._launched if r]
        if live:
            self._MPI.Request.Testall(live)

    def _finish(self) -> None:
        began = time.perf_counter()
        MPI = self._MPI
        if self._progress is not None:
            self._progress.stop()
        self._launched = []
        MPI.Request.Waitall([b.request for b in self._buckets if b.request is not None])
        for bucket in self._buckets:
            if bucket.future is not None:
                future, bucket.future = bucket.future, None
                with grad_mode.no_grad():
                    value = future.wait()
                value = value[0] if isinstance(value, (list, tuple)) else value
                flat = bucket.array.reshape(-1)
                if not (isinstance(value, Tensor) and value._data.size == flat.size):
                    raise RuntimeError(f"a DDP comm hook's future must hold a tensor of the bucket's {flat.size} "
                                       f"elements, got {value!r}")
                if not np.shares_memory(value._data, flat):
                    flat[...] = value._data.reshape(-1)
        used = None
        if self._used_request is not None:
            self._used_request.Wait()
            self._used_request, used = None, self._used_global
        ended = time.perf_counter()
        self.timings = {"wait_s": ended - began, "reduce_s": ended - (self._first_ready_at or began)}
        params = self._parameters_to_sync
        with grad_mode.no_grad():
            for bucket in self._buckets:
                bucket.request = None
                for position, (start, numel, shape) in zip(bucket.params, bucket.offsets):
                    p = params[position]
                    if bucket.solo:
                        reduced, view = bucket.array, False
                        bucket.array = None
                        if p.grad is not None and p.grad._data is reduced:
                            p.grad._bump_version()  # its own array: reduced in place
                            continue
                    else:
                        reduced, view = bucket.flat[start:start + numel].reshape(shape), True
                    if p.grad is None:
                        if used is not None and not used[position]:
                            continue  # unused on every rank: .grad stays None, as torch
                        p.grad = Tensor._from_array(reduced if self.gradient_as_bucket_view else reduced.copy())
                    elif view and _is_slot(p.grad._data, bucket.flat):
                        p.grad._bump_version()  # a view of the bucket: reduced in place
                    elif self.gradient_as_bucket_view:
                        p.grad = Tensor._from_array(reduced)
                    else:
                        p.grad._data[...] = reduced
                        p.grad._bump_version()
        self._armed = self._started = False
        self._reduced = True  # until the next forward: another backward through this one's graph is an error

    # -- torch's API ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside this context; the first backward after it all-reduces them."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def register_comm_hook(self, state, hook) -> None:
        """Reduce each bucket with hook(state, bucket) -> Future of the bucket's averaged gradients instead of the
        built-in average (e.g. runtime.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook with
        state=None, or a process group). The hook gets the bucket undivided; it is called in the same bucket order
        on every rank, as soon as the bucket is ready, and its future is waited for at the end of backward."""
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        if not callable(hook):
            raise TypeError(f"a comm hook must be callable, got {type(hook).__name__}")
        if self._started:
            raise RuntimeError("register_comm_hook must be called before the first backward")
        self._comm_hook, self._comm_hook_state = hook, state

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False):
        """Train on inputs of different lengths per rank (torch's DDP.join): a rank that leaves the loop early keeps
        taking part in the other ranks' steps (their buffer broadcasts and gradient all-reduces, with zero gradients)
        until every rank has left. Gradients are divided by the initial world size, or by the number of ranks still
        training (divide_by_initial_world_size=False). throw_on_early_termination=True raises on every rank instead,
        as soon as one runs out of inputs. Each step inside costs one more small all-reduce."""
        if not enable:
            yield
            return
        self._joining = {"divide_by_initial_world_size": divide_by_initial_world_size,
                         "throw": throw_on_early_termination}
        try:
            yield
        except BaseException:
            self._joining = self._join_divisor = None
            raise
        try:
            self._shadow_until_all_joined()
        finally:
            self._joining = self._join_divisor = None

    def _shadow_until_all_joined(self) -> None:
        throw = self._joining["throw"]
        last = True  # no rank trained after this one left its loop
        while True:
            flags = self._join_flags(0, 0, 0)
            if flags[0] == 0:  # every rank has left its loop: all take the model of (the highest) last one to leave
                MPI = self._MPI
                root = self._comm.allreduce(self._comm.Get_rank() if last else -1, op=MPI.MAX)
                self._root = dist.get_global_rank(self.process_group, root)
                try:
                    self._broadcast_state(list(self.module.parameters()) + list(self.module.buffers()))
                finally:
                    self._root = dist.get_global_rank(self.process_group, 0)
                return
            last = False
            if throw:
                raise RuntimeError("Detected at least one rank that exhausted inputs. Throwing exception across all "
                                   "ranks.")
            if flags[2]:
                self._broadcast_state(list(self.module.buffers()))
            if not flags[1]:
                continue
            MPI = self._MPI
            if self.find_unused_parameters:
                used = np.zeros(len(self._parameters_to_sync), dtype=np.int32)
                self._comm.Iallreduce(np.zeros_like(used), used, op=MPI.MAX).Wait()
            # NOTE: non-blocking like the training ranks' (MPI never matches a blocking collective with a
            # non-blocking one), in the order they start them, with nothing to add
            for bucket in self._buckets:
                zeros = np.zeros(bucket.numel, dtype=bucket.flat_dtype)
                if self._comm_hook is None:
                    self._comm.Iallreduce(MPI.IN_PLACE, zeros, op=MPI.SUM).Wait()
                else:
                    zero_grads = [Tensor._from_array(zeros[start:start + numel].reshape(shape))
                                  for start, numel, shape in bucket.offsets]
                    params = [self._parameters_to_sync[position] for position in bucket.params]
                    last = bucket.index == len(self._buckets) - 1
                    self._comm_hook(self._comm_hook_state,
                                    dist.GradBucket(bucket.index, Tensor._from_array(zeros), params, zero_grads,
                                                    last)).wait()

    def bucket_sizes(self) -> list:
        """Bytes in each gradient bucket, in launch order."""
        return [b.numel * b.flat_dtype.itemsize for b in self._buckets]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _ranks_on_this_host(comm) -> int:
    """How many ranks of `comm` share this host (a collective: every rank calls it, at construction)."""
    local = comm.Split_type(dist._state["MPI"].COMM_TYPE_SHARED)
    try:
        return local.Get_size()
    finally:
        local.Free()


def _reducible_in_place(array: np.ndarray, dtype: np.dtype) -> bool:
    return array.flags.c_contiguous and array.flags.writeable and array.dtype == dtype


def _is_slot(array: np.ndarray, flat: np.ndarray) -> bool:
    """True when `array` is a gradient's own slot in `flat` (gradient_as_bucket_view: accumulated there)."""
    return array.base is flat


def _tensors_in(value):
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v)
