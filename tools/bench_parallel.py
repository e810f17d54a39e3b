"""Time generated elementwise kernels serial against parallel, by size and by the work of each element, to place
nnc.codegen.cpu_elementwise's costs (parallel_work: a prange once the work reaches PARALLEL_MIN_ELEMENTS cheap
elements). Asserts nothing.

    python tools/bench_parallel.py [--repeats 7] [--sizes 12-18] [--cases axpb,exp,gelu,dropout]

Each case is a small module compiled with nnc.compile and called without gradients on float32[2**k]: its one
kernel is generated twice, with the threshold forced out of reach (serial) and to zero (parallel), and the two
alternate per repeat, so load from other processes hits both alike. The columns are the medians of the repeats'
mean call times, serial / parallel, and the parallel variant's time as a ratio of the serial one's.
"""
import argparse
import statistics
import time

import numpy as np

import nnc
import runtime
import runtime.nn.functional as F
from nnc.codegen import cpu_elementwise

CASES = {
    "axpb": lambda x: x * 2 + 1,
    "exp": lambda x: x.exp(),
    "gelu": lambda x: F.gelu(x),
    "dropout": lambda x: F.dropout(x, 0.1, training=True),
}


class _Apply(runtime.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _mean_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _variant(fn, x, threshold: int):
    """The case compiled with PARALLEL_MIN_ELEMENTS set to `threshold` (its kernel is generated at the first call)."""
    saved = cpu_elementwise.PARALLEL_MIN_ELEMENTS
    cpu_elementwise.PARALLEL_MIN_ELEMENTS = threshold
    try:
        compiled = nnc.compile(_Apply(fn))
        with runtime.no_grad():
            compiled(x)
    finally:
        cpu_elementwise.PARALLEL_MIN_ELEMENTS = saved
    return compiled


def measure(fn, logn: int, repeats: int) -> tuple[float, float]:
    """(serial, parallel) median mean call times in seconds over float32[2**logn]."""
    x = runtime.tensor(np.random.default_rng(0).standard_normal(1 << logn).astype(np.float32))
    variants = [_variant(fn, x, 1 << 62), _variant(fn, x, 0)]
    calls = max(20, (1 << 22) >> logn)
    times = [[], []]
    with runtime.no_grad():
        for _ in range(repeats):
            for k, compiled in enumerate(variants):
                times[k].append(_mean_call(lambda: compiled(x), calls))
    return statistics.median(times[0]), statistics.median(times[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", default="12-18", help="log2 sizes, as FIRST-LAST")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    first, last = (int(v) for v in args.sizes.split("-"))
    import numba

    print(f"numba threads: {numba.get_num_threads()}; cost model: parallel_work in nnc/codegen/cpu_elementwise.py")
    for name in args.cases.split(","):
        cells = []
        for logn in range(first, last + 1):
            serial, parallel = measure(CASES[name], logn, args.repeats)
            cells.append(f"2^{logn} {serial * 1e6:.1f}/{parallel * 1e6:.1f} us ({parallel / serial:.2f}x)")
        print(f"{name:8s} " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
