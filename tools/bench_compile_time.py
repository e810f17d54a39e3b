"""Benchmark how long nnc.compile takes on GPTs of growing depth: cold (a fresh kernel cache) and from the disk cache.

Each measurement runs in a fresh process (imports of numpy, numba, runtime and nnc are not counted): it builds
examples/real_models.py's GPT (n_layer L, n_head 2, n_embd 64, block 64, vocab 64, batch 8, dropout 0), runs one
eager training step (forward, cross-entropy loss, backward: eager one-time costs are not compile time), then times
the first compiled step and a warm one. Compile time is their difference: tracing, passes, code generation, numba
compilation or cache loading, first launches. "cold" uses a new empty NNC_CACHE_DIR; "disk cache" is a second
process on the same directory. Each (depth, cold/warm) pair is repeated; the table gives the median, the min and
the spread ((max - min) / median), and how many kernel files the cold run wrote.

Targets (issue 14): 2 layers < 6 s cold and < 1 s from the disk cache; 12 layers at most 2x the 2-layer time.

    python tools/bench_compile_time.py [--layers 2,12] [--repeats 3] [--threads N] [--processes P] [--profile L]

--processes P starts P such processes at once on one cache (as P data-parallel ranks on one machine do) for each
measurement, and reports the slowest of them (what a job waits for); the default is 1.

--profile L compiles an L-layer GPT cold, then from the disk cache, each under cProfile, and prints where the time
went (the top functions by cumulative and by own time), for finding what to make faster. Asserts nothing.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

if __name__ == "__main__":  # before numpy/numba load: they read thread counts once
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from thread_flag import apply_threads_flag

    apply_threads_flag(sys.argv[1:], ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                      "NUMBA_NUM_THREADS"))

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The child: one GPT training step compiled, timed (first call minus a warm one).
_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/examples")
import numpy as np
import numba
import runtime
import nnc
from real_models import GPT, GPTConfig
n_layer = int(sys.argv[2])
profile = len(sys.argv) > 3 and sys.argv[3] == "profile"
runtime.manual_seed(0)
config = GPTConfig(block_size=64, vocab_size=64, n_layer=n_layer, n_head=2, n_embd=64, dropout=0.0)
model = GPT(config)
rng = np.random.default_rng(1)
idx = runtime.tensor(rng.integers(0, 64, (8, 64)).astype(np.int64))
targets = runtime.tensor(rng.integers(0, 64, (8, 64)).astype(np.int64))
def step(m):
    for p in m.parameters():
        p.grad = None
    _, loss = m(idx, targets)
    loss.backward()
step(model)  # eager warm-up
cm = nnc.compile(model)
if profile:
    import cProfile, pstats
    profiler = cProfile.Profile()
    profiler.enable()
t = time.perf_counter()
step(cm)
first_s = time.perf_counter() - t
if profile:
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(30)
warm = []
for _ in range(3):
    t = time.perf_counter()
    step(cm)
    warm.append(time.perf_counter() - t)
arts = [a for a in cm._cache.values() if hasattr(a, "plans")]
print(json.dumps({
    "first_call_s": first_s, "warm_call_s": min(warm),
    "kernels": sum(len(p.kernels) for a in arts for p in a.plans),
    "generated": sum(hasattr(s, "compiled") for a in arts for p in a.plans for s in p.steps),
    "cache_hits": sum(p.cache_hits for a in arts for p in a.plans),
}))
"""


def child(cache_dir: str, n_layer: int, profile: bool = False, timeout: int = 900, processes: int = 1) -> dict:
    """One measurement: `processes` children at once on `cache_dir`; the result of the slowest."""
    env = dict(os.environ, NNC_CACHE_DIR=cache_dir)
    argv = [sys.executable, "-c", _CHILD, _ROOT, str(n_layer)] + (["profile"] if profile else [])
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(processes)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"child exited {proc.returncode}: {err.strip()[-1500:]}")
        if profile:
            print(err)
        result = json.loads(out.strip().splitlines()[-1])
        result["compile_s"] = result["first_call_s"] - result["warm_call_s"]
        results.append(result)
    result = max(results, key=lambda r: r["compile_s"])
    result["files"] = len([f for f in os.listdir(cache_dir) if f.endswith(".py")])
    return result


def _summary(values: list) -> str:
    median = statistics.median(values)
    spread = (max(values) - min(values)) / median if median else 0.0
    return f"{median:>8.2f} s {min(values):>8.2f} s {100 * spread:>6.0f}%"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="2,12", help="comma-separated GPT depths (default 2,12)")
    p.add_argument("--repeats", type=int, default=3, help="fresh-process repeats per depth (default 3)")
    p.add_argument("--threads", type=int, default=None, help="thread count for numba and BLAS")
    p.add_argument("--processes", type=int, default=1, help="processes compiling at once on one cache (default 1)")
    p.add_argument("--profile", type=int, default=None, metavar="L",
                   help="profile one cold compile of an L-layer GPT instead")
    args = p.parse_args(argv)
    if args.profile is not None:
        with tempfile.TemporaryDirectory(prefix="nnc_bench_cache_") as d:
            for label in ("cold", "disk cache"):
                print(f"==== {label}: {args.profile}-layer GPT")
                print(json.dumps(child(d, args.profile, profile=True)))
        return
    layers = [int(x) for x in args.layers.split(",") if x.strip()]
    print(f"GPT training step compile time (n_head 2, n_embd 64, block 64, batch 8); {args.repeats} repeats, "
          f"threads {args.threads or 'default'}, cpus {os.cpu_count()}"
          + (f"; {args.processes} processes at once, the slowest reported" if args.processes > 1 else ""))
    print(f"  {'layers':>6} {'run':<11} {'median':>10} {'min':>10} {'spread':>7} {'kernels':>8} {'files':>6} "
          f"{'cache hits':>10}")
    medians = {}
    for n_layer in layers:
        cold, warm, last = [], [], {}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="nnc_bench_cache_") as d:
                c = child(d, n_layer, processes=args.processes)
                w = child(d, n_layer, processes=args.processes)
            cold.append(c["compile_s"])
            warm.append(w["compile_s"])
            last = {"cold": c, "disk cache": w}
        medians[n_layer] = (statistics.median(cold), statistics.median(warm))
        for label, values in (("cold", cold), ("disk cache", warm)):
            r = last[label]
            print(f"  {n_layer:>6} {label:<11} {_summary(values)} {r['kernels']:>8} {r['files']:>6} "
                  f"{r['cache_hits']:>10}")
    if 2 in medians:
        cold2, warm2 = medians[2]
        print(f"  target: 2 layers < 6 s cold: {cold2:.2f} s ({'met' if cold2 < 6 else 'NOT met'}); "
              f"< 1 s from the disk cache: {warm2:.2f} s ({'met' if warm2 < 1 else 'NOT met'})")
        if 12 in medians:
            ratio = medians[12][0] / cold2
            print(f"  target: 12 layers <= 2x 2 layers cold: {ratio:.2f}x ({'met' if ratio <= 2 else 'NOT met'})")


if __name__ == "__main__":
    main()
