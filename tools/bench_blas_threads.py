"""Time OpenBLAS's products on one thread against two, by size, quiet and beside busy processes, to place
nnc.codegen.cpu.SERIAL_BLAS_MAX_WORK (below it a whole graph holds OpenBLAS to one thread). Asserts nothing.

    python tools/bench_blas_threads.py [--repeats 9] [--sizes 64x64x192,...] [--neighbours 0,1]

Each size is m x k x n: out[m, n] = a[m, k] @ w[n, k].T in float32 through nnc.codegen.cblas.dot_f32 (the call
a whole graph makes for a linear: its weight read transposed in place). The two thread counts alternate per
repeat (each ~0.1 s of calls), so load from other processes hits both alike; "neighbours" runs the same beside
that many CPU-bound processes (Python spin loops). The columns are medians and maximums of the repeats' mean call
times; the ratio is two threads' median over one's.
"""
import argparse
import contextlib
import statistics
import subprocess
import sys
import time

import numpy as np

from nnc.codegen import cblas

SIZES = "64x64x64,64x64x192,64x64x256,64x256x64,128x256x256,256x256x256,128x1024x1024,512x512x512"


def _time(fn, seconds=0.1):
    fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            fn()
        calls += 20
    return (time.perf_counter() - start) / calls


@contextlib.contextmanager
def _neighbours(count):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.3 if count else 0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _measure(m, k, n, repeats):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32).T
    out = np.empty((m, n), np.float32)
    times = {1: [], 2: []}
    for _ in range(repeats):
        for threads in times:
            cblas.set_blas_threads(threads)
            times[threads].append(_time(lambda: cblas.dot_f32(a, b, out)))
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--sizes", default=SIZES, help="m x k x n products, comma-separated")
    parser.add_argument("--neighbours", default="0,1", help="CPU-bound processes beside, comma-separated counts")
    opts = parser.parse_args()
    if not (cblas.AVAILABLE and cblas.THREADS_SETTABLE):
        sys.exit("numpy's OpenBLAS (or its thread-count functions) was not found")
    saved = cblas.blas_threads()
    print(f"{'neighbours':>10} {'m x k x n':>16} {'work':>9} {'1 thread':>22} {'2 threads':>22} {'2/1':>6}")
    try:
        for count in (int(c) for c in opts.neighbours.split(",")):
            with _neighbours(count):
                for size in opts.sizes.split(","):
                    m, k, n = (int(v) for v in size.split("x"))
                    times = _measure(m, k, n, opts.repeats)
                    one, two = (statistics.median(times[t]) * 1e6 for t in (1, 2))
                    cols = [f"{statistics.median(times[t]) * 1e6:9.1f} (max {max(times[t]) * 1e6:7.1f})"
                            for t in (1, 2)]
                    print(f"{count:>10} {size:>16} {m * k * n:>9} {cols[0]:>22} {cols[1]:>22} {two / one:6.2f}")
    finally:
        cblas.set_blas_threads(saved)


if __name__ == "__main__":
    main()
