"""Benchmark runtime.distributed and DDP against raw mpi4py; run under MPI: mpiexec -n 2 python tools/bench_allreduce.py

1. all_reduce throughput for 1, 10 and 100 MB float32 buffers: runtime.distributed.all_reduce and DDP's bucketed
   gradient reduction (copy into buckets, Iallreduce per bucket, average, copy back) vs mpi4py's Allreduce on the
   same bytes; ratio of medians (>= 0.9 is the target) and the spread (min..max) over the repeats.
2. an MLP training step with DDP on every rank vs the same step without communication: time per step, samples/s of
   the whole job vs one process, and the share of all-reduce time hidden behind backward
   (1 - time waiting at the end of backward / time of a blocking all-reduce of all gradients).
Rank 0 prints; asserts nothing. BLAS threads default to 1 per rank (set OPENBLAS_NUM_THREADS to change it).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import runtime  # noqa: E402
import runtime.distributed as dist  # noqa: E402


def timed(fn, repeats: int, comm) -> list:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return [comm.allreduce(t, op=dist._state["MPI"].MAX) for t in times]  # the slowest rank's time


def spread(times) -> str:
    return f"{statistics.median(times) * 1e3:8.2f} ms ({min(times) * 1e3:.2f}..{max(times) * 1e3:.2f})"


def bench_allreduce(sizes_mb, repeats: int, comm, say) -> None:
    MPI = dist._state["MPI"]
    nn = runtime.nn
    say(f"all-reduce of float32 buffers on {comm.Get_size()} ranks: median (min..max) of {repeats}, slowest rank")
    say(f"{'MB':>5} {'mpi4py Allreduce':>28} {'dist.all_reduce':>28} {'ratio':>6} {'DDP buckets':>28} {'ratio':>6} "
        f"{'DDP gradient_as_bucket_view':>28} {'ratio':>6}")
    for mb in sizes_mb:
        n = int(mb * 1024 * 1024 // 4)
        raw = np.ones(n, dtype=np.float32)
        tensor = runtime.ones(n, dtype=runtime.float32)
        t_raw = timed(lambda: comm.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM), repeats, comm)
        t_dist = timed(lambda: dist.all_reduce(tensor), repeats, comm)
        # DDP's reduction of a model's gradients totalling `mb` (4 parameters, default 25 MB buckets)
        model = nn.ParameterList([nn.Parameter(runtime.zeros(n // 4, dtype=runtime.float32)) for _ in range(4)])
        ddp = nn.parallel.DistributedDataParallel(model)
        for p in model:
            p.grad = runtime.ones(p.shape, dtype=runtime.float32)

        def reduce_grads():
            ddp._arm()
            for position in reversed(range(len(ddp._parameters_to_sync))):
                ddp._grad_ready(position, from_backward=True)
        t_ddp = timed(reduce_grads, repeats, comm)
        ddp.gradient_as_bucket_view = True  # after the warm-up each .grad is its bucket slot: no copies
        t_view = timed(reduce_grads, repeats, comm)
        r_dist, r_ddp, r_view = (statistics.median(t_raw) / statistics.median(t) for t in (t_dist, t_ddp, t_view))
        say(f"{mb:>5} {spread(t_raw):>28} {spread(t_dist):>28} {r_dist:>5.2f}x {spread(t_ddp):>28} {r_ddp:>5.2f}x "
            f"{spread(t_view):>28} {r_view:>5.2f}x")
    say("ratio: raw time / ours (1.0 = as fast as raw mpi4py; the target is >= 0.9)")


def bench_step(batch: int, width: int, depth: int, steps: int, comm, say, bucket_cap_mb: float = 25) -> None:
    nn, F = runtime.nn, runtime.nn.functional
    world = comm.Get_size()

    def mlp():
        runtime.manual_seed(0)
        layers = [nn.Linear(256, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(width, 10))

    rng = np.random.default_rng(comm.Get_rank())
    x = runtime.tensor(rng.standard_normal((batch, 256)).astype(np.float32))
    y = runtime.tensor(rng.integers(0, 10, batch))

    def stepper(model):
        opt = runtime.optim.SGD(model.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return step

    plain = mlp()
    t_plain = timed(stepper(plain), steps, comm)
    ddp = nn.parallel.DistributedDataParallel(mlp(), bucket_cap_mb=bucket_cap_mb)
    waits = []
    ddp_step = stepper(ddp)

    def step_and_record():
        ddp_step()
        waits.append(ddp.timings["wait_s"])
    t_ddp = timed(step_and_record, steps, comm)
    grads = [np.ones(p.numel(), dtype=np.float32) for p in plain.parameters()]
    MPI = dist._state["MPI"]
    t_comm = timed(lambda: [comm.Allreduce(MPI.IN_PLACE, g) for g in grads], steps, comm)
    params = sum(p.numel() for p in plain.parameters())
    hidden = 1 - statistics.median(waits[1:]) / statistics.median(t_comm)
    say(f"\nMLP 256-{width}x{depth}-10 ({params * 4 / 2**20:.1f} MB of float32 gradients), batch {batch} per rank, "
        f"{world} ranks, buckets {bucket_cap_mb} MB, median (min..max) of {steps} steps")
    say(f"  one step without DDP (no communication): {spread(t_plain)}")
    say(f"  one step with DDP on {world} ranks:          {spread(t_ddp)}")
    say(f"  blocking all-reduce of all gradients:    {spread(t_comm)}")
    say(f"  samples/s: {batch / statistics.median(t_plain):.0f} one process, "
        f"{world * batch / statistics.median(t_ddp):.0f} with DDP on {world} ranks "
        f"(scaling {world * statistics.median(t_plain) / statistics.median(t_ddp):.2f} of {world})")
    say(f"  all-reduce hidden behind backward: {hidden:.0%} (waited {statistics.median(waits[1:]) * 1e3:.2f} ms at "
        f"the end of backward)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few repeats")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sizes", default="1,10,100", help="buffer sizes in MB")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--bucket-cap-mb", default="25,2", help="DDP bucket sizes to time the training step with")
    args = parser.parse_args()
    dist.init_process_group("mpi")
    comm = dist._comm()
    say = print if comm.Get_rank() == 0 else (lambda *a, **k: None)
    sizes = [1] if args.quick else [float(s) for s in args.sizes.split(",")]
    repeats = 3 if args.quick else args.repeats
    say(f"{dist._state['MPI'].Get_library_version().splitlines()[0].strip()}; "
        f"BLAS threads per rank: {os.environ['OPENBLAS_NUM_THREADS']}")
    bench_allreduce([int(s) if float(s).is_integer() else s for s in sizes], repeats, comm, say)
    for cap in [float(c) for c in args.bucket_cap_mb.split(",")]:
        bench_step(args.batch, 256 if args.quick else args.width, args.depth, repeats, comm, say, cap)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
