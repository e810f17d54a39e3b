"""Benchmark a fused float32 elementwise chain: numba with math.* vs nnc's approximations vs numpy vs torch.

The chain is `gelu_tanh(x*w + b) * sigmoid(x) + 0.5*x` on a 4096x1024 float32 x, with w and b per-column
vectors. Prints the min and median time of each variant, their ratios to the approximation kernel, and its max
deviation from a float64 numpy evaluation of the same inputs; asserts nothing.

    python tools/bench_approx.py [--rows 4096] [--cols 1024] [--repeat 30] [--threads N]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
from numba import get_num_threads, njit, prange, set_num_threads

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from nnc.codegen.approx import sigmoid_f32, tanh_f32  # noqa: E402

# NOTE: float32 constants as globals: a Python float literal would make numba compute in float64.
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_K0 = np.float32(math.sqrt(2.0 / math.pi))
_K1 = np.float32(0.044715)


@njit(parallel=True, error_model="numpy")
def chain_math(x, w, b, out):
    """The chain with libm (math.tanh / math.exp): scalar calls, no vectorization."""
    rows, cols = x.shape
    for i in prange(rows):
        for j in range(cols):
            xv = x[i, j]
            u = xv * w[j] + b[j]
            g = _HALF * u * (_ONE + math.tanh(_K0 * (u + _K1 * u * u * u)))
            s = _ONE / (_ONE + math.exp(-xv))
            out[i, j] = g * s + _HALF * xv


@njit(parallel=True, error_model="numpy")
def chain_approx(x, w, b, out):
    """The chain with nnc.codegen.approx: inlined, branch-free, vectorized."""
    rows, cols = x.shape
    for i in prange(rows):
        for j in range(cols):
            xv = x[i, j]
            u = xv * w[j] + b[j]
            g = _HALF * u * (_ONE + tanh_f32(_K0 * (u + _K1 * u * u * u)))
            out[i, j] = g * sigmoid_f32(xv) + _HALF * xv


def chain_numpy(x, w, b):
    u = x * w + b
    g = _HALF * u * (_ONE + np.tanh(_K0 * (u + _K1 * u * u * u)))
    with np.errstate(over="ignore"):
        s = _ONE / (_ONE + np.exp(-x))
    return g * s + _HALF * x


def reference(x, w, b):
    x, w, b = (a.astype(np.float64) for a in (x, w, b))
    u = x * w + b
    g = 0.5 * u * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))
    return g / (1.0 + np.exp(-x)) + 0.5 * x


def measure(variants, repeat):
    """{name: [seconds] * repeat}: each variant timed in a block of its own, the blocks run forward then backward.

    NOTE: not round-robin: numba's and torch's OpenMP pools both keep their threads spinning for a while after
    a parallel region, so interleaving them made each steal the 2 cores from the other (measured 2-3x noise).
    """
    times = {name: [] for name in variants}
    for order in (list(variants), list(variants)[::-1]):
        for name in order:
            variants[name]()  # warm-up: compilation, thread pools, page faults
            for _ in range((repeat + 1) // 2):
                start = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - start)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="numba and torch threads (default: all cores)")
    args = parser.parse_args(argv)
    if args.threads:
        set_num_threads(args.threads)

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((args.rows, args.cols)) * 3).astype(np.float32)
    w = rng.standard_normal(args.cols).astype(np.float32)
    b = rng.standard_normal(args.cols).astype(np.float32)
    out_math = np.empty_like(x)
    out_approx = np.empty_like(x)

    variants = {
        "numba + approx": lambda: chain_approx(x, w, b, out_approx),
        "numba + math.*": lambda: chain_math(x, w, b, out_math),
        "numpy": lambda: chain_numpy(x, w, b),
    }
    outputs = {"numba + approx": lambda: out_approx, "numba + math.*": lambda: out_math,
               "numpy": lambda: chain_numpy(x, w, b)}
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        if args.threads:
            torch.set_num_threads(args.threads)
        tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))

        def chain_torch():
            with torch.no_grad():
                u = tx * tw + tb
                return torch.nn.functional.gelu(u, approximate="tanh") * torch.sigmoid(tx) + 0.5 * tx

        name = f"torch {torch.__version__} ({torch.get_num_threads()} thr)"
        variants[name] = chain_torch
        outputs[name] = lambda: chain_torch().numpy()

    times = measure(variants, args.repeat)
    want = reference(x, w, b)
    scale = np.maximum(np.abs(want), 1.0)
    n = x.size
    print(f"chain gelu_tanh(x*w+b)*sigmoid(x)+0.5*x, float32 {args.rows}x{args.cols}, "
          f"numba {get_num_threads()} threads, {args.repeat} repeats")
    # NOTE: on a shared 2-core machine the median swings 3x between runs; the min is the stable number.
    base_min, base_med = min(times["numba + approx"]), float(np.median(times["numba + approx"]))
    print(f"{'variant':30s} {'min ms':>8s} {'ns/elem':>8s} {'vs approx':>9s} {'median ms':>9s} {'vs approx':>9s} "
          f"{'max |err|/max(|f64|,1)':>22s}")
    for name, ts in times.items():
        med = float(np.median(ts))
        err = float(np.max(np.abs(outputs[name]().astype(np.float64) - want) / scale))
        print(f"{name:30s} {min(ts) * 1e3:8.3f} {min(ts) / n * 1e9:8.3f} {min(ts) / base_min:8.2f}x "
              f"{med * 1e3:9.3f} {med / base_med:8.2f}x {err:22.2e}")


if __name__ == "__main__":
    main()
