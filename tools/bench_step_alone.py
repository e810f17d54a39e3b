"""Training steps of bench_compile's GPT (case 8a) and MNIST CNN (case 7), each contender alone in a process of its
own: nnc.compile, then torch eager, alternating processes, min and median per run.

bench_compile.py alternates its contenders inside one process, where one library's idle thread pool (OpenBLAS's
spinning workers on nnc's side, libgomp's on torch's) slows the other's next call; this harness shows each alone.

    python tools/bench_step_alone.py --model gpt --runs 2 --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _one(model: str, library: str, steps: int) -> dict:
    """Times `steps` training steps of one model with one library in this process."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_compile as bc
    import runtime
    import torch

    lib = runtime if library == "nnc" else torch
    if model == "gpt":
        run, opt, idx, targets = bc._gpt_setup(lib, library == "nnc")()
        args = (idx, targets)
    else:
        run, opt, x, y = bc._cnn_train_setup(lib, library == "nnc")()
        args = (x, y)

    def step():
        loss = run(*args)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"min": min(times), "median": float(np.median(times))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("gpt", "cnn"), default="gpt")
    p.add_argument("--runs", type=int, default=2, help="processes per contender, alternating")
    p.add_argument("--steps", type=int, default=25, help="timed steps per process")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for numba, BLAS and torch")
    p.add_argument("--child", choices=("nnc", "torch"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(_one(args.model, args.child, args.steps)))
        return
    env = dict(os.environ, NUMBA_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads))
    print(f"{args.model} training step, each contender alone in its process, {args.threads} threads, "
          f"load average {os.getloadavg()[0]:.2f}")
    results = {"nnc": [], "torch": []}
    for _ in range(args.runs):
        for library in results:
            out = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", library, "--steps",
                                  str(args.steps), "--threads", str(args.threads)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            results[library].append(r)
            print(f"  {library:6s} min {r['min'] * 1e3:8.2f} ms   median {r['median'] * 1e3:8.2f} ms")
    best = {k: min(r["median"] for r in v) for k, v in results.items()}
    print(f"  nnc.compile / torch eager, best medians: {best['nnc'] / best['torch']:.2f}x")


if __name__ == "__main__":
    main()
