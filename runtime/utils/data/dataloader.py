"""DataLoader and default_collate (torch.utils.data's); num_workers > 0 loads in worker processes (_worker.py)."""
from __future__ import annotations

import collections.abc
import numbers

import numpy as np

from ...tensor import Tensor
from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler


def default_collate(batch):
    """Merge a list of samples into a batch, as torch: tensors and numpy arrays are stacked on a new first dim,
    floats become a float64 tensor and ints an int64 one, strings stay the sequence they came in, and mappings,
    named tuples and sequences are collated field by field (a tuple sample gives a list, as torch)."""
    from ... import api, factories

    elem = batch[0]
    if isinstance(elem, Tensor):
        return api.stack(list(batch), 0)
    if isinstance(elem, np.ndarray) and elem.dtype.kind not in "OSUa":
        return api.stack([factories.as_tensor(b) for b in batch], 0)
    if isinstance(elem, np.generic) and elem.dtype.kind not in "OSUa":
        return factories.as_tensor(np.array(batch))
    if isinstance(elem, bool):
        return factories.tensor(batch)
    if isinstance(elem, numbers.Integral):
        return factories.tensor(batch, dtype=_dtypes().int64)
    if isinstance(elem, numbers.Real):
        return factories.tensor(batch, dtype=_dtypes().float64)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        try:
            clone = type(elem)({key: default_collate([d[key] for d in batch]) for key in elem})
        except TypeError:
            clone = {key: default_collate([d[key] for d in batch]) for key in elem}
        return clone
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return type(elem)(*(default_collate(samples) for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if any(len(sample) != size for sample in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        columns = [default_collate(samples) for samples in zip(*batch)]
        if isinstance(elem, tuple):
            return columns
        try:
            return type(elem)(columns)
        except TypeError:
            return columns
    raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found "
                    f"{type(elem)}")


def default_convert(data):
    """What the loader returns per sample when batching is off: numpy arrays become tensors, the rest as is."""
    from ... import factories

    if isinstance(data, np.ndarray) and data.dtype.kind not in "OSUa":
        return factories.as_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        return {key: default_convert(value) for key, value in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, (list, tuple)):
        return type(data)(default_convert(d) for d in data)
    return data


def _dtypes():
    from ... import dtypes

    return dtypes


class DataLoader:
    """Batches of a dataset, in the order of a sampler, merged by collate_fn; with torch's arguments.

    num_workers=0 loads in the calling process. num_workers > 0 starts that many processes (fork on Linux, or
    multiprocessing_context), each seeded with base_seed + its id (runtime's and Python's generators, as torch) and
    running worker_init_fn(id); the sampler runs here and the batches come back in its order (prefetch_factor per
    worker in flight; timeout; persistent_workers keeps them across epochs). An iterable dataset is iterated in every
    worker (shard it with get_worker_info()), batches taken from the workers in turn. pin_memory changes nothing."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers: int = 0,
                 collate_fn=None, pin_memory: bool = False, drop_last: bool = False, timeout: float = 0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *, prefetch_factor=None,
                 persistent_workers: bool = False, pin_memory_device: str = "", in_order: bool = True):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable "
                             "multiprocessing.")
        self.dataset, self.num_workers, self.pin_memory, self.timeout = dataset, num_workers, pin_memory, timeout
        self.worker_init_fn, self.generator, self.prefetch_factor = worker_init_fn, generator, prefetch_factor
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 "
                             "to enable multiprocessing, otherwise set prefetch_factor to None.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        self.persistent_workers, self.multiprocessing_context = persistent_workers, multiprocessing_context
        self._pool = None
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle not in (None, False):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got "
                                 f"shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, but got "
                                 f"sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified batch_sampler option, but "
                                 f"got batch_sampler={batch_sampler}")
        else:
            if sampler is not None and shuffle:
                raise ValueError("sampler option is mutually exclusive with shuffle")
            if batch_sampler is not None:
                if batch_size != 1 or shuffle or sampler is not None or drop_last:
                    raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                                     "and drop_last")
                batch_size, drop_last = None, False
            elif batch_size is None and drop_last:
                raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with "
                                 "drop_last")
            if sampler is None:
                sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
            if batch_size is not None and batch_sampler is None:
                batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size, self.drop_last = batch_size, drop_last
        self.sampler, self.batch_sampler = sampler, batch_sampler
        if collate_fn is None:
            collate_fn = default_collate if batch_size is not None or batch_sampler is not None else default_convert
        self.collate_fn = collate_fn

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None or (self._iterable and self.batch_size is not None)

    def __iter__(self):
        if self.num_workers > 0:
            from . import _worker

            return _worker.iterate(self)
        if self._iterable:
            return self._iter_stream()
        if self.batch_sampler is not None:
            return (self.collate_fn(self._fetch(indices)) for indices in self.batch_sampler)
        return (self.collate_fn(self.dataset[index]) for index in self.sampler)

    def _fetch(self, indices):
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return getitems(indices)
        return [self.dataset[i] for i in indices]

    def _iter_stream(self):
        if self.batch_size is None:
            for sample in self.dataset:
                yield self.collate_fn(sample)
            return
        batch = []
        for sample in self.dataset:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate_fn(batch)

    def __del__(self):
        pool = self.__dict__.get("_pool")
        if pool is not None:
            pool.shutdown()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_pool"] = None  # a worker gets the loader, not the processes
        return state

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self.batch_sampler) if self.batch_sampler is not None else len(self.sampler)


__all__ = ["DataLoader", "default_collate", "default_convert", "Sampler"]
