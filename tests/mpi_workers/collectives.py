"""Every collective of runtime.distributed against numpy on random data, for every dtype, blocking and async.

Run as `mpiexec -n N python tests/mpi_workers/collectives.py`; prints OK per rank, raises (aborting the job) on a
mismatch. Each rank draws every rank's data from seeds it knows, so it computes the expected results locally."""
from __future__ import annotations

import numpy as np

from common import dist, done, runtime, start

rank, world = start()
DTYPES = ["float64", "float32", "float16", "int64", "int32", "bool"]
OPS = {"SUM": np.add.reduce, "AVG": None, "PRODUCT": np.multiply.reduce, "MIN": np.minimum.reduce,
       "MAX": np.maximum.reduce}
SHAPE = (3, 5)


def data(dtype: str, r: int, case: int, shape=SHAPE) -> np.ndarray:
    rng = np.random.default_rng(1000 * case + r)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-3, 4, shape).astype(dtype)
    return rng.uniform(-2, 2, shape).astype(dtype)


def reduced(dtype: str, op: str, arrays) -> np.ndarray:
    stacked = np.stack(arrays)
    if dtype == "bool":  # as torch: SUM/MAX are OR, PRODUCT/MIN are AND
        return stacked.any(0) if op in ("SUM", "MAX") else stacked.all(0)
    if op == "AVG":
        return (np.add.reduce(stacked, 0) / len(arrays)).astype(dtype)
    return OPS[op](stacked, 0).astype(dtype)


def check(got, want, what: str) -> None:
    got = got.numpy() if hasattr(got, "numpy") else got
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind == "f" and world > 2:  # more than two terms: MPI may add in another order
        tol = 1e-2 if want.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


case = 0
for dtype in DTYPES:
    rdt = getattr(runtime, dtype)
    for op in OPS:
        if op == "AVG" and dtype in ("int64", "int32", "bool"):
            t = runtime.tensor(data(dtype, rank, case))
            try:
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
            except ValueError as exc:
                assert "floating point" in str(exc)
            else:
                raise AssertionError("AVG of an integer tensor should raise")
            continue
        for async_op in (False, True):
            case += 1
            want = reduced(dtype, op, [data(dtype, r, case) for r in range(world)])
            # all_reduce, on a contiguous tensor and on a transposed view (written back through the view)
            t = runtime.tensor(data(dtype, rank, case))
            version = t._version
            work = dist.all_reduce(t, op=getattr(dist.ReduceOp, op), async_op=async_op)
            if async_op:
                assert work is not None and work.wait() and work.is_completed()
            else:
                assert work is None
            check(t, want, f"all_reduce {op} {dtype} async={async_op}")
            assert t._version > version
            base = runtime.tensor(np.ascontiguousarray(data(dtype, rank, case).T))
            view = base.t()
            work = dist.all_reduce(view, op=getattr(dist.ReduceOp, op), async_op=async_op)
            if work is not None:
                work.wait()
            check(base.t(), want, f"all_reduce {op} {dtype} on a view")
            # reduce to the last rank
            t = runtime.tensor(data(dtype, rank, case))
            work = dist.reduce(t, dst=world - 1, op=getattr(dist.ReduceOp, op), async_op=async_op)
            if work is not None:
                work.wait()
            check(t, want if rank == world - 1 else data(dtype, rank, case), f"reduce {op} {dtype}")
            # reduce_scatter: rank i gets the reduction of everyone's i-th input
            case += 1
            inputs = [runtime.tensor(data(dtype, 100 * rank + i, case)) for i in range(world)]
            out = runtime.zeros(SHAPE, dtype=rdt)
            work = dist.reduce_scatter(out, inputs, op=getattr(dist.ReduceOp, op), async_op=async_op)
            if work is not None:
                work.wait()
            want_rs = reduced(dtype, op, [data(dtype, 100 * r + rank, case) for r in range(world)])
            check(out, want_rs, f"reduce_scatter {op} {dtype}")
            big = runtime.tensor(np.concatenate([data(dtype, 100 * rank + i, case) for i in range(world)]))
            out = runtime.zeros(SHAPE, dtype=rdt)
            work = dist.reduce_scatter_tensor(out, big, op=getattr(dist.ReduceOp, op), async_op=async_op)
            if work is not None:
                work.wait()
            check(out, want_rs, f"reduce_scatter_tensor {op} {dtype}")

    for async_op in (False, True):
        case += 1
        # broadcast from every source rank
        for src in range(world):
            t = runtime.tensor(data(dtype, rank, case))
            work = dist.broadcast(t, src=src, async_op=async_op)
            if work is not None:
                work.wait()
            check(t, data(dtype, src, case), f"broadcast from {src} {dtype}")
        # all_gather into a list and into one tensor
        outs = [runtime.zeros(SHAPE, dtype=rdt) for _ in range(world)]
        work = dist.all_gather(outs, runtime.tensor(data(dtype, rank, case)), async_op=async_op)
        if work is not None:
            work.wait()
        for r in range(world):
            check(outs[r], data(dtype, r, case), f"all_gather {dtype} slot {r}")
        out = runtime.zeros((world * SHAPE[0], SHAPE[1]), dtype=rdt)
        work = dist.all_gather_into_tensor(out, runtime.tensor(data(dtype, rank, case)), async_op=async_op)
        if work is not None:
            work.wait()
        check(out, np.concatenate([data(dtype, r, case) for r in range(world)]), f"all_gather_into_tensor {dtype}")

# gather, scatter, all_to_all (uneven sizes), all_to_all_single, point to point: every dtype, blocking and async
for dtype in DTYPES:
    rdt = getattr(runtime, dtype)
    for async_op in (False, True):
        case += 1
        tag = f"{dtype} async={async_op}"
        for root in range(world):
            gl = [runtime.zeros(SHAPE, dtype=rdt) for _ in range(world)] if rank == root else None
            w = dist.gather(runtime.tensor(data(dtype, rank, case)), gl, dst=root, async_op=async_op)
            if w is not None:
                w.wait()
            if rank == root:
                for r in range(world):
                    check(gl[r], data(dtype, r, case), f"gather to {root} {tag} slot {r}")
            out = runtime.zeros(SHAPE, dtype=rdt)
            sl = [runtime.tensor(data(dtype, 10 * root + i, case)) for i in range(world)] if rank == root else None
            w = dist.scatter(out, sl, src=root, async_op=async_op)
            if w is not None:
                w.wait()
            check(out, data(dtype, 10 * root + rank, case), f"scatter from {root} {tag}")
        # rank r sends r + i + 1 rows to rank i
        ins = [runtime.tensor(data(dtype, 100 * rank + i, case, (rank + i + 1, 2))) for i in range(world)]
        outs = [runtime.zeros((r + rank + 1, 2), dtype=rdt) for r in range(world)]
        w = dist.all_to_all(outs, ins, async_op=async_op)
        if w is not None:
            w.wait()
        for r in range(world):
            check(outs[r], data(dtype, 100 * r + rank, case, (r + rank + 1, 2)), f"all_to_all {tag} from {r}")
        big = runtime.tensor(np.concatenate([data(dtype, 100 * rank + i, case, (rank + i + 1, 2))
                                             for i in range(world)]))
        out = runtime.zeros((sum(r + rank + 1 for r in range(world)), 2), dtype=rdt)
        w = dist.all_to_all_single(out, big, [r + rank + 1 for r in range(world)],
                                   [rank + i + 1 for i in range(world)], async_op=async_op)
        if w is not None:
            w.wait()
        check(out, np.concatenate([data(dtype, 100 * r + rank, case, (r + rank + 1, 2)) for r in range(world)]),
              f"all_to_all_single {tag}")
        even = runtime.tensor(data(dtype, rank, case, (2 * world, 3)))
        out = runtime.zeros((2 * world, 3), dtype=rdt)
        w = dist.all_to_all_single(out, even, async_op=async_op)
        if w is not None:
            w.wait()
        check(out, np.concatenate([data(dtype, r, case, (2 * world, 3))[2 * rank:2 * rank + 2] for r in range(world)]),
              f"all_to_all_single even {tag}")
        # a ring: each rank sends to the next and receives from the previous
        nxt, prev = (rank + 1) % world, (rank - 1) % world
        got = runtime.zeros(SHAPE, dtype=rdt).t()  # a strided tensor: received through a copy
        mine = runtime.tensor(data(dtype, rank, case)).t()  # strided: sent through a copy
        if async_op:
            works = [dist.isend(mine, nxt, tag=7), dist.irecv(got, prev, tag=7)]
            for w in works:
                w.wait()
        elif rank % 2 == 0:
            dist.send(mine, nxt)
            assert dist.recv(got, prev) == prev
        else:
            assert dist.recv(got, None) == prev  # from any source
            dist.send(mine, nxt)
        check(got, data(dtype, prev, case).T, f"send/recv {tag}")

# new_group: the last rank alone, and every rank but the first; src and dst stay global ranks, as torch's
last = dist.new_group([world - 1])
assert (last is dist.GroupMember.NON_GROUP_MEMBER) == (rank != world - 1)
t = runtime.full((3,), float(rank))
dist.all_reduce(t, group=last)  # a no-op outside the group
assert float(t[0]) == rank
assert dist.get_rank(last) == (0 if rank == world - 1 else -1)
assert dist.get_world_size(last) == (1 if rank == world - 1 else -1)
tail = dist.new_group(list(range(world))[::-1][:max(world - 1, 1)])  # given unsorted: sorted, as torch
members = sorted(range(world))[-max(world - 1, 1):]
if rank in members:
    assert dist.get_process_group_ranks(tail) == members and dist.get_rank(tail) == members.index(rank)
    assert dist.get_global_rank(tail, 0) == members[0] and dist.get_group_rank(tail, members[-1]) == len(members) - 1
    t = runtime.full((4,), float(rank))
    dist.all_reduce(t, group=tail)
    check(t, np.full(4, float(sum(members)), np.float32), "all_reduce in a subgroup")
    t = runtime.full((2,), float(rank))
    dist.broadcast(t, src=members[-1], group=tail)  # a global rank
    check(t, np.full(2, float(members[-1]), np.float32), "broadcast in a subgroup")
    try:
        dist.broadcast(t, src=0 if 0 not in members else world, group=tail)
    except ValueError as exc:
        assert "not part of" in str(exc)
    else:
        raise AssertionError("a src outside the group should raise")
else:
    assert tail is dist.GroupMember.NON_GROUP_MEMBER and dist.get_rank(tail) == -1
dist.destroy_process_group(last)
dist.destroy_process_group(tail)

# a non-blocking all_reduce leaves the tensor alone until wait() (the result is written at completion)
t = runtime.ones(1000)
work = dist.all_reduce(t, async_op=True)
assert float(t.sum()) == 1000.0, "an async all_reduce wrote before wait()"
work.wait()
assert float(t.sum()) == 1000.0 * world
# several collectives in flight at once, waited in reverse order
works = [dist.all_reduce(runtime.full((7,), float(i + rank)), async_op=True) for i in range(5)]
works.append(dist.barrier(async_op=True))
for w in reversed(works):
    w.wait()
# objects, the default group, errors
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank})
assert objs == [{"rank": r} for r in range(world)]
assert dist.get_backend() == "mpi" and dist.is_initialized()
try:
    dist.all_gather([runtime.zeros(2)], runtime.zeros(2))
except ValueError as exc:
    assert "tensor_list" in str(exc)
else:
    raise AssertionError("all_gather with a short list should raise")
done("collectives")
