"""runtime.utils.data against torch.utils.data: datasets, samplers, collation, DataLoader and DistributedSampler."""
from __future__ import annotations

import collections

import numpy as np
import pytest

import runtime
from runtime.utils.data import (BatchSampler, ConcatDataset, DataLoader, Dataset, DistributedSampler,
                                IterableDataset, RandomSampler, SequentialSampler, Subset, TensorDataset,
                                WeightedRandomSampler, default_collate, random_split)


def as_numpy(value):
    """Batches of either library as nested lists/dicts of numpy arrays, to compare structure, values and dtypes."""
    if hasattr(value, "detach"):
        return value.detach().numpy()
    if isinstance(value, dict):
        return {k: as_numpy(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return (type(value).__name__, [as_numpy(v) for v in value])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [as_numpy(v) for v in value])
    return value


def assert_same(ours, theirs):
    a, b = as_numpy(ours), as_numpy(theirs)
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(ours[k], theirs[k])
    elif isinstance(a, tuple):
        assert a[0] == b[0] and len(a[1]) == len(b[1])
        for x, y in zip(ours, theirs):
            assert_same(x, y)
    else:
        assert a == b and type(a) is type(b)


Point = collections.namedtuple("Point", "x y")


def samples(lib):
    return [
        [lib.tensor([1.0, 2.0]), lib.tensor([3.0, 4.0])],
        [(lib.tensor([1, 2]), 3), (lib.tensor([4, 5]), 6)],
        [{"a": 1.5, "b": lib.tensor([True])}, {"a": 2.5, "b": lib.tensor([False])}],
        [np.arange(3, dtype=np.float32), np.ones(3, dtype=np.float32)],
        [Point(1, 2.0), Point(3, 4.0)],
        [[1, "x"], [2, "y"]],
        [np.float64(1.0), np.float64(2.0)],
        [True, False],
    ]


def test_default_collate_matches_torch(torch):
    from torch.utils.data import default_collate as torch_collate

    for ours, theirs in zip(samples(runtime), samples(torch)):
        assert_same(default_collate(ours), torch_collate(theirs))


def test_tensor_dataset_loader_matches_torch_in_order(torch):
    x = np.random.default_rng(0).standard_normal((10, 3))
    y = np.arange(10)
    for batch_size, drop_last in [(3, False), (3, True), (5, False), (1, False)]:
        ours = DataLoader(TensorDataset(runtime.tensor(x), runtime.tensor(y)), batch_size=batch_size,
                          drop_last=drop_last)
        theirs = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y)),
                                             batch_size=batch_size, drop_last=drop_last)
        assert len(ours) == len(theirs)
        got, want = list(ours), list(theirs)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b)


def test_batch_size_none_and_batch_sampler(torch):
    data = [np.arange(2) + i for i in range(5)]
    assert_same(list(DataLoader(data, batch_size=None)), list(torch.utils.data.DataLoader(data, batch_size=None)))
    ours = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 2, drop_last=False))
    theirs = torch.utils.data.DataLoader(data, batch_sampler=torch.utils.data.BatchSampler(
        torch.utils.data.SequentialSampler(data), 2, drop_last=False))
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        assert_same(a, b)
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(data, batch_size=2, batch_sampler=BatchSampler(SequentialSampler(data), 2, False))
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(data, shuffle=True, sampler=SequentialSampler(data))


@pytest.mark.parametrize("n,size,drop", [(10, 3, False), (10, 3, True), (9, 3, True), (0, 2, False)])
def test_batch_sampler_lengths_match_torch(torch, n, size, drop):
    ours = list(BatchSampler(range(n), size, drop))
    theirs = list(torch.utils.data.BatchSampler(range(n), size, drop))
    assert ours == theirs and len(BatchSampler(range(n), size, drop)) == len(theirs)


def test_shuffle_is_a_permutation_reproducible_with_runtime_seed():
    data = list(range(50))
    runtime.manual_seed(3)
    first = [int(v) for b in DataLoader(data, batch_size=7, shuffle=True) for v in b]
    second_epoch = [int(v) for b in DataLoader(data, batch_size=7, shuffle=True) for v in b]
    runtime.manual_seed(3)
    again = [int(v) for b in DataLoader(data, batch_size=7, shuffle=True) for v in b]
    assert sorted(first) == data and first != data
    assert first == again and second_epoch != first
    g = runtime.Generator().manual_seed(5)
    with_generator = [int(v) for b in DataLoader(data, batch_size=50, shuffle=True, generator=g) for v in b]
    assert sorted(with_generator) == data


def test_random_sampler_replacement_and_num_samples():
    s = RandomSampler(range(4), replacement=True, num_samples=100)
    draws = list(s)
    assert len(draws) == len(s) == 100 and set(draws) <= {0, 1, 2, 3}
    s = RandomSampler(range(4), num_samples=10)
    draws = list(s)
    assert len(draws) == 10 and sorted(draws[:8]) == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="num_samples"):
        RandomSampler(range(0))


def test_weighted_random_sampler_draws_in_proportion_to_the_weights():
    weights = [0.1, 0.0, 0.6, 0.3]
    draws = list(WeightedRandomSampler(weights, 20000, generator=runtime.Generator().manual_seed(0)))
    counts = collections.Counter(draws)
    assert len(draws) == 20000 and counts[1] == 0
    for index, w in enumerate(weights):  # within 5 standard deviations of the binomial count
        assert abs(counts[index] - 20000 * w) <= 5 * (20000 * w * (1 - w)) ** 0.5 + 1
    again = list(WeightedRandomSampler(runtime.tensor(weights), 20000, generator=runtime.Generator().manual_seed(0)))
    assert again == draws  # repeatable from a seed, and weights may be a tensor
    once = list(WeightedRandomSampler([1.0, 2.0, 3.0, 4.0], 4, replacement=False))
    assert sorted(once) == [0, 1, 2, 3]


def test_weighted_random_sampler_in_a_loader_and_its_errors_match_torch(torch):
    loader = DataLoader(TensorDataset(runtime.arange(6.0)), batch_size=4,
                        sampler=WeightedRandomSampler([0, 0, 1, 0, 0, 1], 10))
    batches = [b[0].tolist() for b in loader]
    assert [len(b) for b in batches] == [4, 4, 2] and set(sum(batches, [])) <= {2.0, 5.0}
    for args in [([1.0, 2.0], 0), ([1.0, 2.0], 2.5), ([[1.0, 2.0]], 2), ([1.0, 2.0], 2, "yes")]:
        with pytest.raises(ValueError) as theirs:
            torch.utils.data.WeightedRandomSampler(*args)
        with pytest.raises(ValueError) as ours:
            WeightedRandomSampler(*args)
        assert str(ours.value) == str(theirs.value).replace("torch.Size([1, 2])", "(1, 2)")


@pytest.mark.parametrize("n", [10, 11, 3, 1])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_without_shuffle_matches_torch(torch, n, replicas, drop_last):
    for rank in range(replicas):
        ours = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=False, drop_last=drop_last)
        theirs = torch.utils.data.DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=False,
                                                     drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


@pytest.mark.parametrize("n,replicas,drop_last", [(20, 4, False), (22, 4, False), (22, 4, True), (3, 4, False)])
def test_distributed_sampler_shards_are_disjoint_and_cover(n, replicas, drop_last):
    def shards(epoch, seed=0):
        out = []
        for rank in range(replicas):
            s = DistributedSampler(range(n), num_replicas=replicas, rank=rank, seed=seed, drop_last=drop_last)
            s.set_epoch(epoch)
            out.append(list(s))
        return out

    epoch0 = shards(0)
    assert len({len(s) for s in epoch0}) == 1  # every rank the same count
    flat = [i for s in epoch0 for i in s]
    if drop_last:
        assert len(flat) == len(set(flat)) == (n // replicas) * replicas  # disjoint, tail dropped
    else:
        assert set(flat) == set(range(n))  # covers everything, padding repeats the start of the order
        if n >= replicas:
            assert len(flat) - len(set(flat)) == (-n) % replicas
    assert shards(0) == epoch0  # same seed and epoch: same shards on every call (and every rank)
    if n > 4:
        assert shards(1) != epoch0 and shards(0, seed=1) != epoch0


def test_distributed_sampler_checks_rank():
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(range(4), num_replicas=2, rank=2)


def test_distributed_sampler_needs_an_initialized_group():
    with pytest.raises(ValueError, match="not been initialized"):
        DistributedSampler(range(4))


def test_datasets_subset_concat_split():
    class Squares(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return i * i

    both = Squares() + Squares()
    assert isinstance(both, ConcatDataset) and len(both) == 10 and both[7] == 4 and both[-1] == 16
    assert [Subset(Squares(), [4, 0])[i] for i in range(2)] == [16, 0]
    a, b = random_split(Squares(), [3, 2], generator=runtime.Generator().manual_seed(0))
    assert sorted([a[i] for i in range(3)] + [b[i] for i in range(2)]) == [0, 1, 4, 9, 16]
    a, b = random_split(Squares(), [0.6, 0.4])
    assert (len(a), len(b)) == (3, 2)


def test_iterable_dataset_batches_in_order():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(7))

    batches = [b.tolist() for b in DataLoader(Stream(), batch_size=3)]
    assert batches == [[0, 1, 2], [3, 4, 5], [6]]
    assert [b.tolist() for b in DataLoader(Stream(), batch_size=3, drop_last=True)] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(Stream(), shuffle=True)


def test_drop_in_import():
    import runtime.utils.data as data

    assert runtime.utils.data is data and data.DataLoader is DataLoader


# -- worker processes (num_workers > 0) ---------------------------------------------------------------------------

class _WhoLoads(Dataset):
    """Each sample says which worker made it, with that worker's seed and a draw from its runtime generator."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        import os

        from runtime.utils.data import get_worker_info

        info = get_worker_info()
        return {"i": i, "id": info.id, "seed": info.seed, "pid": os.getpid(), "draw": float(runtime.rand(())),
                "init": _INIT.get("id", -1)}


_INIT = {}


def _remember_init(worker_id):
    _INIT["id"] = worker_id


class _Shard(IterableDataset):
    def __iter__(self):
        from runtime.utils.data import get_worker_info

        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, 10, step))


class _Fails(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 3:
            raise ValueError("sample 3 is broken")
        return i


class _Slow(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        import time

        time.sleep(5)
        return i


def test_workers_give_the_single_process_batches_in_order():
    ds = TensorDataset(runtime.arange(46).reshape(23, 2).float(), runtime.arange(23))
    for kwargs in ({"batch_size": 4, "shuffle": True}, {"batch_size": 5, "drop_last": True}, {"batch_size": None}):
        runtime.manual_seed(0)
        alone = [as_numpy(b) for _ in range(2) for b in DataLoader(ds, **kwargs)]
        runtime.manual_seed(0)
        loader = DataLoader(ds, num_workers=3, prefetch_factor=1, **kwargs)
        together = [as_numpy(b) for _ in range(2) for b in loader]
        assert len(alone) == len(together)
        for a, b in zip(alone, together):
            for x, y in zip(a[1] if isinstance(a, tuple) else [a], b[1] if isinstance(b, tuple) else [b]):
                np.testing.assert_array_equal(x, y)


def test_worker_info_seeds_and_init_fn():
    from runtime.utils.data import get_worker_info

    assert get_worker_info() is None
    runtime.manual_seed(1)
    rows = list(DataLoader(_WhoLoads(), batch_size=None, num_workers=2, worker_init_fn=_remember_init))
    assert [r["i"] for r in rows] == list(range(8)) and [r["id"] for r in rows] == [0, 1] * 4
    seeds = {r["id"]: r["seed"] for r in rows}
    assert seeds[1] == seeds[0] + 1  # base_seed + worker id, as torch
    assert len({r["pid"] for r in rows}) == 2 and [r["init"] for r in rows] == [0, 1] * 4
    assert len({r["draw"] for r in rows}) == 8  # each worker's generator is seeded differently
    runtime.manual_seed(1)
    again = list(DataLoader(_WhoLoads(), batch_size=None, num_workers=2))
    assert [r["seed"] for r in again] == [r["seed"] for r in rows]  # reproducible under manual_seed


def test_iterable_dataset_in_workers_takes_batches_in_turn(torch):
    ours = [t.tolist() for t in DataLoader(_Shard(), batch_size=2, num_workers=2)]
    assert ours == [[0, 2], [1, 3], [4, 6], [5, 7], [8], [9]]
    class TorchShard(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            return iter(range(info.id, 10, info.num_workers))
    theirs = [t.tolist() for t in torch.utils.data.DataLoader(TorchShard(), batch_size=2, num_workers=2)]
    assert ours == theirs


def test_persistent_workers_live_across_epochs():
    loader = DataLoader(_WhoLoads(), batch_size=4, num_workers=2, persistent_workers=True)
    pids = [{p for b in loader for p in b["pid"].tolist()} for _ in range(2)]
    assert pids[0] == pids[1] and len(pids[0]) == 2
    stream = DataLoader(_Shard(), batch_size=3, num_workers=2, persistent_workers=True)
    assert [t.tolist() for t in stream] == [t.tolist() for t in stream] == [[0, 2, 4], [1, 3, 5], [6, 8], [7, 9]]


def test_a_worker_error_is_raised_in_the_main_process_and_timeouts():
    with pytest.raises(ValueError, match="(?s)Caught ValueError in DataLoader worker process 1.*sample 3 is broken"):
        list(DataLoader(_Fails(), batch_size=None, num_workers=2))
    with pytest.raises(RuntimeError, match="timed out after 0.5 seconds"):
        list(DataLoader(_Slow(), batch_size=None, num_workers=1, timeout=0.5))
    with pytest.raises(ValueError, match="persistent_workers"):
        DataLoader(_Fails(), persistent_workers=True)


def test_chain_and_stack_datasets():
    class Counting(runtime.utils.data.IterableDataset):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(self.n))

        def __len__(self):
            return self.n

    chained = runtime.utils.data.ChainDataset([Counting(2), Counting(3)])
    assert list(chained) == [0, 1, 0, 1, 2] and len(chained) == 5
    images, labels = runtime.arange(6.0).reshape(3, 2), runtime.tensor([1, 0, 1])
    stacked = runtime.utils.data.StackDataset(images, labels)
    assert len(stacked) == 3 and stacked[1][0].tolist() == [2.0, 3.0] and stacked[1][1].item() == 0
    named = runtime.utils.data.StackDataset(image=images, label=labels)
    batch = next(iter(runtime.utils.data.DataLoader(named, batch_size=2)))
    assert set(batch) == {"image", "label"} and batch["label"].tolist() == [1, 0]
    with pytest.raises(ValueError, match="Size mismatch"):
        runtime.utils.data.StackDataset(images, runtime.tensor([1, 2]))
