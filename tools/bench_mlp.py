"""Benchmark an MLP (784-512-512-10, ReLU) end to end in `runtime` against torch eager on the CPU.

Measures, in the same process and with the same code for both libraries (the library is passed as `lib`):
  - one training step (zero_grad, forward, CrossEntropyLoss, backward, SGD(momentum=0.9).step) at batch 128
    and at batch 8;
  - batch-1 inference (forward only) under no_grad.
Prints medians of repeated timings, the runtime/torch ratios and the targets from the issue (training at
batch 128 within 1.3x of torch eager, batch-1 inference within 1.5x). Asserts nothing.

The loop helpers come from tools/bench_eager.py, but the repeats of the two libraries are interleaved
(runtime, torch, runtime, torch, ...) rather than measured one library after the other, so that a burst of
load from other processes on a shared machine hits both sides of a ratio alike. The spread columns show how
noisy the repeats were; numpy's BLAS and torch both use all cores by default (set OMP_NUM_THREADS=1, which
both honour, for single-threaded figures).
"""

import argparse
import os
import statistics
import sys
import time


if __name__ == "__main__":  # before numpy/torch/numba load: they read thread counts once
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from thread_flag import apply_threads_flag

    apply_threads_flag(sys.argv[1:], ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"))

try:
    import runtime
    from tools.bench_eager import Case, _calibrate, _grad_ctx, _header, _time_loop, harness_overhead, selected_names
except ImportError:  # run as `python tools/bench_mlp.py`: put the repo root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import runtime
    from tools.bench_eager import Case, _calibrate, _grad_ctx, _header, _time_loop, harness_overhead, selected_names

import numpy as np

try:
    import torch
except ImportError:
    torch = None

SIZES = (784, 512, 512, 10)
LR = 0.01
MOMENTUM = 0.9


def _weights(seed=0):
    """Initial weights as numpy float32 arrays, keyed like the Sequential's state_dict (torch-style init)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i, (d_in, d_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        bound = 1.0 / np.sqrt(d_in)
        out[f"{2 * i}.weight"] = rng.uniform(-bound, bound, (d_out, d_in)).astype(np.float32)
        out[f"{2 * i}.bias"] = rng.uniform(-bound, bound, d_out).astype(np.float32)
    return out


def _mlp(lib):
    """Linear -> ReLU -> Linear -> ReLU -> Linear, loaded with the same weights in both libraries."""
    layers = []
    for i, (d_in, d_out) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        if i:
            layers.append(lib.nn.ReLU())
        layers.append(lib.nn.Linear(d_in, d_out))
    model = lib.nn.Sequential(*layers)
    model.load_state_dict({k: lib.tensor(v) for k, v in _weights().items()})
    return model


def _batch(lib, n, seed=1):
    """A fixed batch: n float32 rows of 784 features and n int64 class labels."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], n).astype(np.int64)
    return lib.tensor(x), lib.tensor(y)


def _train_setup(batch):
    def setup(lib):
        model = _mlp(lib)
        opt = lib.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        x, y = _batch(lib, batch)
        return model, opt, lib.nn.CrossEntropyLoss(), x, y
    return setup


def train_step(state):
    """zero_grad, forward, loss, backward, optimizer step."""
    model, opt, loss_fn, x, y = state
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()


def _infer_setup(lib):
    model = _mlp(lib)
    model.eval()
    x, _ = _batch(lib, 1)
    return model, x


def infer_step(state):
    """Forward of one sample (the case runs it under no_grad)."""
    model, x = state
    model(x)


# (case, target ratio runtime/torch or None)
CASES = [
    (Case("train_b128", "SGD step: zero_grad+fwd+CE+bwd+step", "[128,784]", _train_setup(128), train_step), 1.3),
    (Case("train_b8", "SGD step: zero_grad+fwd+CE+bwd+step", "[8,784]", _train_setup(8), train_step), None),
    (Case("infer_b1", "no_grad forward", "[1,784]", _infer_setup, infer_step, no_grad=True), 1.5),
]
CASE_NAMES = [c.name for c, _ in CASES]


def _blas_line():
    """numpy's BLAS and any thread-count environment variables, as one line."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # older numpy: no dict mode
        name = "?"
    env = [f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
           if k in os.environ]
    return f"numpy blas: {name}  thread env: {' '.join(env) or 'none set'}"


def _fmt(seconds):
    """Seconds -> '12.345 ms' or '123.4 us', right-aligned; a dash when missing."""
    if seconds is None:
        return f"{'-':>10}"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:7.3f} ms"
    return f"{seconds * 1e6:7.1f} us"


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short run (smoke test): ~20 ms x 3 repeats")
    p.add_argument("--threads", type=int, default=None,
                   help="thread count for numpy's BLAS and torch (sets OMP/OPENBLAS/MKL_NUM_THREADS before they "
                        "load, and torch.set_num_threads); default: the libraries' own (all cores)")
    p.add_argument("--cases", default=None, help="comma-separated subset of: " + ",".join(CASE_NAMES))
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be at least 1")
    names = selected_names(p, args.cases, CASE_NAMES)
    args.selected = [(c, t) for c, t in CASES if c.name in names]
    return args


def measure_pair(case, libs, *, target_s=0.25, repeats=9, warmup=20, settle_s=0.2):
    """{lib name: (median, min, max) seconds per step} for case on each lib, repeats interleaved across libs.

    Before each timed repeat the process sleeps settle_s (untimed): the other library's idle BLAS/OpenMP
    worker threads busy-wait for a while after their last call (OpenBLAS for up to ~0.1 s), and on a machine
    with few cores they would otherwise steal a core from the repeat that follows.

    A lib whose setup or step raises maps to 'ExcType: message' instead (report, don't fix)."""
    states, loops, out = {}, {}, {}
    for lib in libs:
        try:
            state = case.setup(lib)
            with _grad_ctx(case, lib):
                for _ in range(warmup):
                    case.step(state)
                loops[lib] = _calibrate(case.step, state, target_s)
            states[lib] = state
        except Exception as e:
            out[lib.__name__] = f"{type(e).__name__}: {e}"
    times = {lib: [] for lib in states}
    for _ in range(repeats):
        for lib in list(states):
            time.sleep(settle_s)
            try:
                with _grad_ctx(case, lib):
                    times[lib].append(_time_loop(case.step, states[lib], loops[lib]) / loops[lib])
            except Exception as e:
                out[lib.__name__] = f"{type(e).__name__}: {e}"
                del states[lib]
    for lib in states:
        ts = times[lib]
        out[lib.__name__] = (statistics.median(ts), min(ts), max(ts))
    return out


def _spread(t):
    """(max - min) / median of the repeats, as a percentage string."""
    return f"{(t[2] - t[1]) / t[0] * 100:5.0f}%" if isinstance(t, tuple) else f"{'-':>6}"


def main(argv=None):
    """Time every selected case on runtime and torch and print the table with the targets."""
    args = _parse(argv)
    if args.threads is not None and torch is not None:
        torch.set_num_threads(args.threads)
    opts = dict(target_s=0.02, repeats=3, warmup=3, settle_s=0.1) if args.quick else \
        dict(target_s=0.25, repeats=9, warmup=20, settle_s=0.2)
    for line in _header():
        print(line)
    print(_blas_line())
    print(f"model: MLP {'-'.join(map(str, SIZES))} (ReLU), CrossEntropyLoss, SGD(lr={LR}, momentum={MOMENTUM}); "
          f"float32; identical initial weights and data in both libraries")
    print(f"mode: {'quick' if args.quick else 'full'}  "
          f"(~{opts['target_s'] * 1e3:.0f} ms per repeat, median of {opts['repeats']}, "
          f"{opts['warmup']} warm-up steps, libraries alternate per repeat after a {opts['settle_s']:.1f} s "
          f"untimed pause); harness overhead "
          f"{harness_overhead(target_s=0.005, repeats=3) * 1e6:.3f} us/step is included in every figure")
    if torch is None:
        print("note: torch is not importable; showing runtime figures only")
    print()

    width = max([len("what")] + [len(c.expr) for c, _ in args.selected])
    head = (f"{'case':<10} {'what':<{width}} {'input':<9} {'runtime':>10} {'torch':>10} "
            f"{'ratio':>7} {'target':>7}  {'verdict':<11} {'rt spread':>9} {'th spread':>9}")
    print(head)
    print("-" * len(head))
    libs = [runtime] + ([torch] if torch is not None else [])
    notes, verdicts = [], []
    for case, target in args.selected:
        res = measure_pair(case, libs, **opts)
        for name, r in res.items():
            if isinstance(r, str):
                notes.append(f"{case.name}: {name} raised {r}")
        rt, th = res.get("runtime"), res.get("torch")
        rt, th = (rt if isinstance(rt, tuple) else None), (th if isinstance(th, tuple) else None)
        ratio = rt[0] / th[0] if rt and th else None
        r = f"{ratio:6.2f}x" if ratio is not None else f"{'-':>7}"
        t = f"{target:6.2f}x" if target is not None else f"{'-':>7}"
        if target is None:
            verdict = "(no target)"
        elif ratio is None:
            verdict = "n/a"
        else:
            verdict = "met" if ratio <= target else "NOT met"
            verdicts.append(f"{case.name} {ratio:.2f}x vs {target:.2f}x: {verdict}")
        print(f"{case.name:<10} {case.expr:<{width}} {case.shape:<9} {_fmt(rt and rt[0])} {_fmt(th and th[0])} "
              f"{r} {t}  {verdict:<11} {_spread(rt):>9} {_spread(th):>9}", flush=True)
    print("-" * len(head))
    for note in notes:
        print("note:", note)
    if verdicts:
        print("targets: " + "; ".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
