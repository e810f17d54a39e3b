"""DistributedSampler: each rank of a data-parallel job reads its own disjoint shard of the dataset."""
from __future__ import annotations

import math

from ...factories import randperm
from ...random import Generator
from .sampler import Sampler


class DistributedSampler(Sampler):
    """Indices rank, rank + R, rank + 2R, ... of one (shuffled, if asked) order shared by all R ranks.

    As torch: the order is a permutation seeded with `seed + epoch` (call set_epoch each epoch), padded by repeating
    its start so every rank gets the same count, or cut to a multiple of R with drop_last."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        from ... import distributed as dist

        if num_replicas is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            num_replicas = dist.get_world_size()
        if rank is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            rank = dist.get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.epoch, self.drop_last, self.shuffle, self.seed = 0, drop_last, shuffle, seed
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            indices = randperm(n, generator=Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            missing = self.total_size - len(indices)
            if missing <= len(indices):
                indices += indices[:missing]
            else:
                indices += (indices * math.ceil(missing / len(indices)))[:missing]
        else:
            indices = indices[:self.total_size]
        assert len(indices) == self.total_size
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """A different shuffle each epoch, the same on every rank (call it before iterating each epoch)."""
        self.epoch = epoch
