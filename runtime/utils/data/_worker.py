"""DataLoader worker processes (num_workers > 0): each fetches and collates the batches it is sent, as torch's."""
from __future__ import annotations

import hashlib
import multiprocessing
import pickle
import queue
import random
import traceback

__all__ = ["WorkerInfo", "get_worker_info"]


class WorkerInfo:
    """What get_worker_info() returns inside a worker: id, num_workers, seed and the worker's copy of the dataset."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __setattr__(self, name, value):
        raise RuntimeError(f"Cannot assign attributes to {type(self).__name__} objects")

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, num_workers={self.num_workers})"


_info = None


def get_worker_info():
    """In a DataLoader worker process, its WorkerInfo; in the main process, None."""
    return _info


class _Failure:
    """An exception raised in a worker, carried to the main process with its traceback as text."""

    def __init__(self, worker_id: int, where: str, exc: BaseException):
        self.exc_type, self.worker_id = type(exc), worker_id
        self.message = (f"Caught {type(exc).__name__}{where} in DataLoader worker process {worker_id}.\nOriginal "
                        + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))

    def reraise(self):
        try:
            error = self.exc_type(self.message)
        except Exception:  # an exception type that does not take one message
            error = RuntimeError(self.message)
        raise error


_EXHAUSTED = "__exhausted__"  # an iterable dataset's worker has no more batches


def _loop(loader, worker_id: int, num_workers: int, seed: int, tasks, results) -> None:
    """A worker: serve (task id, indices) with the collated batch; for an iterable dataset (task id, None) with the
    next batch of its own iterator (or _EXHAUSTED), restarted by (task id, "restart"); stop at None."""
    global _info
    from ... import random as runtime_random

    runtime_random.manual_seed(seed)
    random.seed(seed)
    dataset = loader.dataset
    _info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
    try:
        if loader.worker_init_fn is not None:
            loader.worker_init_fn(worker_id)
    except Exception as exc:
        results.put((None, _Failure(worker_id, " in worker_init_fn", exc)))
        return
    stream = None
    while True:
        task = tasks.get()
        if task is None:
            return
        task_id, indices = task
        try:
            if not loader._iterable:
                if loader._auto_collation:
                    data = loader.collate_fn(loader._fetch(indices))
                else:
                    data = loader.collate_fn(dataset[indices])
            elif indices == "restart":
                stream, data = iter(dataset), None
            else:
                if stream is None:
                    stream = iter(dataset)
                data = _next_batch(loader, stream)
        except Exception as exc:
            data = _Failure(worker_id, "", exc)
        results.put((task_id, data))


def _next_batch(loader, stream):
    if loader.batch_size is None:
        for sample in stream:
            return loader.collate_fn(sample)
        return _EXHAUSTED
    batch = []
    for sample in stream:
        batch.append(sample)
        if len(batch) == loader.batch_size:
            break
    if not batch or (len(batch) < loader.batch_size and loader.drop_last):
        return _EXHAUSTED
    return loader.collate_fn(batch)


class _Pool:
    """num_workers processes, each with its own task queue, sharing one result queue."""

    def __init__(self, loader, base_seed: int):
        context = loader.multiprocessing_context
        if context is None or isinstance(context, str):
            context = multiprocessing.get_context(context)
        self.results = context.Queue()
        self.tasks, self.workers = [], []
        for worker_id in range(loader.num_workers):
            tasks = context.Queue()
            worker = context.Process(target=_loop, args=(loader, worker_id, loader.num_workers, base_seed + worker_id,
                                                         tasks, self.results), daemon=True)
            worker.start()
            self.tasks.append(tasks)
            self.workers.append(worker)
        self.next_task = 0

    def send(self, worker_id: int, payload) -> int:
        task_id, self.next_task = self.next_task, self.next_task + 1
        self.tasks[worker_id].put((task_id, payload))
        return task_id

    def receive(self, timeout: float):
        """The next (task id, data) any worker finished; raises if a worker died or the timeout passed."""
        waited = 0.0
        while True:
            step = 1.0 if timeout <= 0 else min(1.0, timeout - waited)
            try:
                task_id, data = self.results.get(timeout=step)
            except queue.Empty:
                waited += step
                dead = [w for w in self.workers if not w.is_alive()]
                if dead:
                    self.shutdown()
                    raise RuntimeError(f"DataLoader worker (pid(s) {', '.join(str(w.pid) for w in dead)}) exited "
                                       "unexpectedly") from None
                if timeout > 0 and waited >= timeout:
                    raise RuntimeError(f"DataLoader timed out after {timeout} seconds") from None
                continue
            if isinstance(data, _Failure) and task_id is None:  # worker_init_fn failed
                self.shutdown()
                data.reraise()
            return task_id, data

    def shutdown(self) -> None:
        for tasks, worker in zip(self.tasks, self.workers):
            if worker.is_alive():
                tasks.put(None)
        for worker in self.workers:
            worker.join(timeout=1)
            if worker.is_alive():
                worker.terminate()
        self.workers, self.tasks = [], []


def _base_seed(loader) -> int:
    """A seed for this epoch's workers, reproducible under manual_seed, that leaves the generator where it was.

    NOTE: torch draws it from the generator; here it is hashed from the generator's state and an epoch count instead,
    so the sampler sees the same random numbers whatever num_workers is, and batches come in the same order."""
    from ... import random as runtime_random

    state = loader.generator.get_state() if loader.generator is not None else runtime_random.get_rng_state()
    loader._epochs = getattr(loader, "_epochs", 0) + 1
    digest = hashlib.blake2b(pickle.dumps((state, loader._epochs)), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def iterate(loader):
    """The batches of `loader` loaded by worker processes, in the order one process would give them."""
    base_seed = _base_seed(loader)
    pool = loader._pool
    if pool is None or not pool.workers:
        pool = _Pool(loader, base_seed)
        if loader.persistent_workers:
            loader._pool = pool
    try:
        yield from (_iterate_stream(loader, pool) if loader._iterable else _iterate_map(loader, pool))
    finally:
        if not loader.persistent_workers:
            pool.shutdown()


def _iterate_map(loader, pool):
    tasks = iter(loader.batch_sampler if loader._auto_collation else loader.sampler)
    ahead = (loader.prefetch_factor or 2) * loader.num_workers
    pending, done, order, worker = 0, {}, [], 0
    for payload in tasks:
        order.append(pool.send(worker, payload))
        worker = (worker + 1) % loader.num_workers
        pending += 1
        if pending < ahead:
            continue
        yield _in_order(pool, loader, done, order)
        pending -= 1
    while order:
        yield _in_order(pool, loader, done, order)


def _in_order(pool, loader, done, order):
    want = order.pop(0)
    while want not in done:
        task_id, data = pool.receive(loader.timeout)
        done[task_id] = data
    data = done.pop(want)
    if isinstance(data, _Failure):
        data.reraise()
    return data


def _iterate_stream(loader, pool):
    active = list(range(loader.num_workers))
    if loader._pool is pool and getattr(pool, "started", False):  # persistent workers: restart their iterators
        restarts = [pool.send(w, "restart") for w in active]
        done = {}
        for want in restarts:
            _in_order(pool, loader, done, [want])
    pool.started = True
    done = {}
    pending = {w: pool.send(w, None) for w in active}  # one batch in flight per worker
    i = 0
    while active:
        worker = active[i]
        data = _in_order(pool, loader, done, [pending.pop(worker)])
        if isinstance(data, str) and data == _EXHAUSTED:
            active.remove(worker)
            i = i if i < len(active) else 0
            continue
        pending[worker] = pool.send(worker, None)
        i = (i + 1) % len(active)
        yield data
