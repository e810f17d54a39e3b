"""Time compiled softmax and LayerNorm (row kernels) against torch eager, forward and forward+backward.

    python tools/bench_rows.py [--shapes 4096x64,8192x768] [--repeats 7] [--threads N]

Each variant is timed interleaved with the others (one repeat of each in turn); a repeat is the mean of as many
calls as fill ~0.2 s. Prints the median time, the spread ((max - min) / median) and the ratio to torch eager.
Asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __name__ == "__main__":  # before numpy/torch/numba load: they read thread counts once
    sys.path.insert(0, os.path.dirname(__file__))
    from thread_flag import apply_threads_flag

    apply_threads_flag(sys.argv[1:], ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                      "NUMBA_NUM_THREADS"))

import numpy as np  # noqa: E402


def per_call(fn, budget=0.2) -> float:
    """Seconds per call of fn, averaged over as many calls as fill `budget` seconds."""
    fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget:
            return elapsed / n


def variants(kind: str, shape):
    """{name: zero-argument callable} for one op and shape: torch eager and nnc, forward and forward+backward."""
    import torch

    import nnc
    import runtime

    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    n = shape[-1]
    if kind == "softmax":
        t_mod, r_mod = torch.nn.Softmax(-1), runtime.nn.Softmax(-1)
    else:
        t_mod, r_mod = torch.nn.LayerNorm(n), runtime.nn.LayerNorm(n)
    compiled = nnc.compile(r_mod)
    tx, rx = torch.from_numpy(x), runtime.from_numpy(x)
    txg, rxg = tx.clone().requires_grad_(), rx.clone().requires_grad_()
    tg, rg = torch.ones(shape), runtime.ones(*shape)

    def torch_fwd():
        with torch.no_grad():
            t_mod(tx)

    def nnc_fwd():
        with runtime.no_grad():
            compiled(rx)

    def torch_train():
        t_mod(txg).backward(tg)

    def nnc_train():
        compiled(rxg).backward(rg)

    return {"torch fwd": torch_fwd, "nnc fwd": nnc_fwd, "torch fwd+bwd": torch_train, "nnc fwd+bwd": nnc_train}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4096x64,8192x768")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="thread count for numba, BLAS and torch")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"threads: torch {torch.get_num_threads()}, numba {os.environ.get('NUMBA_NUM_THREADS', 'all cores')}")
    for kind in ("softmax", "layer_norm"):
        for spec in args.shapes.split(","):
            shape = tuple(int(s) for s in spec.split("x"))
            fns = variants(kind, shape)
            times: dict[str, list[float]] = {name: [] for name in fns}
            for _ in range(args.repeats):
                for name, fn in fns.items():
                    times[name].append(per_call(fn))
            for name, ts in times.items():
                med = statistics.median(ts)
                base = statistics.median(times[name.replace("nnc", "torch")])
                print(f"{kind:10s} {spec:9s} {name:14s} {med * 1e6:10.1f} us  spread {(max(ts) - min(ts)) / med:5.1%}"
                      f"  ratio to torch {med / base:5.2f}x")


if __name__ == "__main__":
    main()
