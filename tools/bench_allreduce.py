"""Benchmark runtime.distributed and DDP against raw mpi4py; run under MPI: mpiexec -n 2 python tools/bench_allreduce.py

1. all_reduce throughput for 1, 10 and 100 MB float32 buffers: runtime.distributed.all_reduce and DDP's gradient
   reduction (average and Iallreduce in place in each .grad; or copied into flat buckets and back) for one parameter
   of that size and for four, vs mpi4py's Allreduce on the same bytes; ratio of medians (>= 0.9 is the target) and
   the spread (min..max) over the repeats, all timed round-robin.
2. an MLP training step with DDP on every rank vs the same step without communication, for each way of driving MPI
   during backward: time per step, samples/s of the whole job vs one process, and the share of all-reduce time
   hidden behind backward (by the step's time and by the wait at its end, against a blocking all-reduce).
3. a backward that leaves the CPU free (sleeps between gradients, as an accelerator's would): the wait at its end.
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
    return timed_together({"": fn}, repeats, comm)[""]


def timed_together(fns: dict, repeats: int, comm) -> dict:
    """Time each function `repeats` times, round-robin (so load beside the benchmark hits every one alike)."""
    for fn in fns.values():
        fn()  # warm-up
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            comm.Barrier()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    MPI = dist._state["MPI"]
    return {name: [comm.allreduce(t, op=MPI.MAX) for t in ts] for name, ts in times.items()}  # the slowest rank


def spread(times) -> str:
    return f"{statistics.median(times) * 1e3:8.2f} ms ({min(times) * 1e3:.2f}..{max(times) * 1e3:.2f})"


def ddp_reducer(n: int, flat: bool, as_view: bool, parts: int = 4):
    """DDP over `parts` float32 parameters of n/parts elements each, and a function running its gradient reduction as a
    backward would (each gradient marked ready, last to first). flat: every gradient copied into flat buckets (the
    layout before in-place solo buckets, and torch's); as_view: gradient_as_bucket_view."""
    nn = runtime.nn
    ddp_module = nn.parallel.distributed
    model = nn.ParameterList([nn.Parameter(runtime.zeros(n // parts, dtype=runtime.float32)) for _ in range(parts)])
    saved = ddp_module._SOLO_BYTES
    ddp_module._SOLO_BYTES = 1 << 62 if flat else saved
    try:
        ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=as_view)
    finally:
        ddp_module._SOLO_BYTES = saved
    for p in model:
        p.grad = runtime.ones(p.shape, dtype=runtime.float32)

    def reduce_grads():
        ddp._arm()
        for position in reversed(range(len(ddp._parameters_to_sync))):
            ddp._grad_ready(position, from_backward=True)
    return reduce_grads


def bench_allreduce(sizes_mb, repeats: int, comm, say) -> None:
    MPI = dist._state["MPI"]
    say(f"all-reduce of float32 buffers on {comm.Get_size()} ranks: median (min..max) of {repeats}, slowest rank; "
        "ratio = raw median / median")
    columns = ["mpi4py Allreduce", "raw + average", "dist.all_reduce", "DDP, 1 parameter", "DDP, 4 parameters",
               "4, flat buckets", "4, flat, bucket view"]
    say(f"{'MB':>5} " + " ".join(f"{c:>28} {'ratio':>6}" if i else f"{c:>28}" for i, c in enumerate(columns)))
    for mb in sizes_mb:
        n = int(mb * 1024 * 1024 // 4)
        raw = np.ones(n, dtype=np.float32)
        tensor = runtime.ones(n, dtype=runtime.float32)
        fns = {"raw": lambda: comm.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM),
               "raw_avg": lambda: (comm.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM), np.divide(raw, 2, out=raw)),
               "dist": lambda: dist.all_reduce(tensor),
               "ddp1": ddp_reducer(n, flat=False, as_view=False, parts=1),
               "ddp": ddp_reducer(n, flat=False, as_view=False),
               "flat": ddp_reducer(n, flat=True, as_view=False),
               "flat_view": ddp_reducer(n, flat=True, as_view=True)}
        times = timed_together(fns, repeats, comm)
        base = statistics.median(times["raw"])
        cells = [spread(times["raw"])] + [f"{spread(times[k])} {base / statistics.median(times[k]):>5.2f}x"
                                          for k in list(fns)[1:]]
        say(f"{mb:>5} " + " ".join(f"{c:>28}" if i == 0 else f"{c:>35}" for i, c in enumerate(cells)))
    say("raw + average: Allreduce then one in-place numpy division, the least DDP must do to average one buffer")
    say("DDP: gradients of 128 KB and more are averaged and all-reduced in their own .grad arrays; flat buckets copy "
        "each gradient into a bucket and back (torch's default; before, here, for all sizes); the target is >= 0.9x")


def bench_step(batch: int, width: int, depth: int, steps: int, comm, say, bucket_cap_mb: float = 25,
               progress=("hooks", "thread")) -> None:
    """Time the MLP's training step without DDP, with DDP, and a blocking all-reduce of its gradients, round-robin.

    Hidden share of the all-reduce (1 = all of it behind backward, 0 = none, < 0 = worse than blocking): against the
    blocking step, 1 - (DDP step - step) / (step then blocking all-reduces - step), which compares like with like
    (both pay for the ranks finishing backward at different times); against the all-reduce alone (timed after a
    barrier, so without that skew), 1 - (DDP step - step) / blocking all-reduce."""
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
    fns, waits, ddps = {"plain": stepper(plain)}, {}, {}
    for mode in progress:
        ddp = ddps[mode] = nn.parallel.DistributedDataParallel(mlp(), bucket_cap_mb=bucket_cap_mb)
        ddp.progress = mode.partition("@")[0]
        if "@" in mode:  # thread@US: poll every US microseconds
            ddp._progress_interval = float(mode.partition("@")[2]) * 1e-6
        waits[mode] = []

        def step_and_record(step=stepper(ddp), ddp=ddp, mode=mode):
            step()
            waits[mode].append(ddp.timings["wait_s"])
        fns[mode] = step_and_record
    grads = [np.ones(p.numel(), dtype=np.float32) for p in plain.parameters()]
    MPI = dist._state["MPI"]
    fns["comm"] = lambda: [comm.Allreduce(MPI.IN_PLACE, g) for g in grads]
    blocking_model = mlp()
    opt = runtime.optim.SGD(blocking_model.parameters(), lr=0.01)

    def blocking_step():  # what DDP would do without overlap: backward, then a blocking all-reduce of each gradient
        opt.zero_grad()
        F.cross_entropy(blocking_model(x), y).backward()
        for p in blocking_model.parameters():
            comm.Allreduce(MPI.IN_PLACE, p.grad._data)
            np.divide(p.grad._data, world, out=p.grad._data)
        opt.step()
    fns["blocking"] = blocking_step
    times = timed_together(fns, steps, comm)
    t_plain, t_comm = statistics.median(times["plain"]), statistics.median(times["comm"])
    exposed_blocking = statistics.median(times["blocking"]) - t_plain
    params = sum(p.numel() for p in plain.parameters())
    say(f"\nMLP 256-{width}x{depth}-10 ({params * 4 / 2**20:.1f} MB of float32 gradients), batch {batch} per rank, "
        f"{world} ranks, buckets {bucket_cap_mb} MB ({len(ddp.bucket_sizes())} all-reduces per step), "
        f"median (min..max) of {steps} steps, round-robin")
    say(f"  one step without DDP (no communication):   {spread(times['plain'])}")
    say(f"  blocking all-reduce of all gradients:      {spread(times['comm'])}")
    say(f"  step, then blocking all-reduces (no DDP):  {spread(times['blocking'])}; costs {exposed_blocking * 1e3:.2f} "
        "ms more than the step (the all-reduce plus the ranks' skew)")
    for mode in progress:
        t_ddp, wait = statistics.median(times[mode]), statistics.median(waits[mode][1:])
        say(f"  DDP step, progress from {mode + ':':<18} {spread(times[mode])}; {world * batch / t_ddp:.0f} samples/s "
            f"vs {batch / t_plain:.0f} one process (scaling {world * t_plain / t_ddp:.2f} of {world}); hidden "
            f"{1 - (t_ddp - t_plain) / exposed_blocking:.0%} against the blocking step, "
            f"{1 - (t_ddp - t_plain) / t_comm:.0%} against the all-reduce alone; waited {wait * 1e3:.2f} ms")


def bench_idle_backward(layers: int, mb: float, gap_ms: float, repeats: int, comm, say, progress) -> None:
    """A backward that leaves the CPU free (as an accelerator's would): `layers` gradients of `mb` MB, one every
    `gap_ms` ms (sleeping in between). How long DDP waits at the end, against a blocking all-reduce of them all."""
    nn = runtime.nn
    MPI = dist._state["MPI"]
    n = int(mb * 1024 * 1024 // 4)
    arrays = [np.ones(n, dtype=np.float32) for _ in range(layers)]
    fns, waits = {"comm": lambda: [comm.Allreduce(MPI.IN_PLACE, a) for a in arrays]}, {}
    for mode in progress:
        model = nn.ParameterList([nn.Parameter(runtime.zeros(n, dtype=runtime.float32)) for _ in range(layers)])
        ddp = nn.parallel.DistributedDataParallel(model)
        ddp.progress = mode.partition("@")[0]
        if "@" in mode:
            ddp._progress_interval = float(mode.partition("@")[2]) * 1e-6
        waits[mode] = []

        def backward(ddp=ddp, model=model, mode=mode):
            ddp._arm()
            for position in reversed(range(layers)):
                time.sleep(gap_ms * 1e-3)
                model[position].grad = runtime.ones(n, dtype=runtime.float32)
                ddp._grad_ready(position, from_backward=True)
            waits[mode].append(ddp.timings["wait_s"])
        fns[mode] = backward
    times = timed_together(fns, repeats, comm)
    t_comm = statistics.median(times["comm"])
    say(f"\nbackward leaving the CPU free: {layers} gradients of {mb} MB, one every {gap_ms} ms; blocking all-reduce "
        f"of them all {spread(times['comm'])}")
    for mode in progress:
        wait = [comm.allreduce(w, op=MPI.MAX) for w in waits[mode][1:]]
        say(f"  progress from {mode + ':':<12} waited {spread(wait)} at the end; hidden "
            f"{1 - statistics.median(wait) / t_comm:.0%} (the last gradient's all-reduce cannot be: "
            f"{1 / layers:.0%} of the bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few repeats")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sizes", default="1,10,100", help="buffer sizes in MB")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--bucket-cap-mb", default="25,2", help="DDP bucket sizes to time the training step with")
    parser.add_argument("--progress", default="hooks,thread",
                        help="how DDP drives MPI during backward: from its gradient hooks only (hooks), or a progress "
                        "thread (thread@US: polling every US microseconds)")
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
        bench_step(args.batch, 256 if args.quick else args.width, args.depth, repeats, comm, say, cap,
                   args.progress.split(","))
    bench_idle_backward(4, 1 if args.quick else 4, 5, repeats, comm, say, args.progress.split(","))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
