"""Benchmark eager per-op dispatch overhead of `runtime` against torch eager on tiny tensors."""

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

try:
    import runtime
except ImportError:  # run as `python tools/bench_eager.py`: put the repo root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import runtime

import numpy as np

try:
    import torch
except ImportError:
    torch = None


@dataclass(frozen=True)
class Case:
    """One benchmark case: `setup(lib)` builds inputs once, `step(state)` is the timed call."""

    name: str
    expr: str
    shape: str
    setup: Callable
    step: Callable
    no_grad: bool = False


def _vec(lib, grad=False):
    """Two float32 tensors of shape [16]."""
    a, b = lib.randn(16), lib.randn(16)
    if grad:
        a.requires_grad_()
        b.requires_grad_()
    return a, b


def _mat(lib):
    """Two float32 tensors of shape [32, 32]."""
    return lib.randn(32, 32), lib.randn(32, 32)


def _fwd_bwd(s):
    """Full forward+backward of a tiny expression; grads are reset so nothing accumulates."""
    a, b = s
    a.grad = None
    b.grad = None
    ((a * b).relu() + a).sum().backward()


CASES = [
    Case("add", "a + b", "[16]", _vec, lambda s: s[0] + s[1]),
    Case("mul_scalar", "a * 2.0", "[16]", _vec, lambda s: s[0] * 2.0),
    Case("exp", "a.exp()", "[16]", _vec, lambda s: s[0].exp()),
    Case("relu", "a.relu()", "[16]", _vec, lambda s: s[0].relu()),
    Case("sum", "a.sum()", "[16]", _vec, lambda s: s[0].sum()),
    Case("sum_dim", "a.sum(1)", "[32,32]", _mat, lambda s: s[0].sum(1)),
    Case("matmul", "a @ b", "[32,32]", _mat, lambda s: s[0] @ s[1]),
    Case("reshape", "a.reshape(-1)", "[32,32]", _mat, lambda s: s[0].reshape(-1)),
    Case("slice", "a[1:3]", "[32,32]", _mat, lambda s: s[0][1:3]),
    Case("t", "a.t()", "[32,32]", _mat, lambda s: s[0].t()),
    Case("add_grad", "a + b (requires_grad)", "[16]",
         lambda lib: _vec(lib, grad=True), lambda s: s[0] + s[1]),
    Case("fwd_bwd", "((a*b).relu()+a).sum().backward()", "[16]",
         lambda lib: _vec(lib, grad=True), _fwd_bwd),
    Case("add_", "with no_grad: a.add_(b)", "[16]", _vec, lambda s: s[0].add_(s[1]), no_grad=True),
]
CASE_NAMES = [c.name for c in CASES]


def _grad_ctx(case, lib):
    """no_grad() for cases that ask for it, else a null context."""
    return lib.no_grad() if case.no_grad else contextlib.nullcontext()


def _time_loop(step, state, n):
    """Seconds taken by n back-to-back calls of step(state)."""
    t0 = time.perf_counter()
    for _ in range(n):
        step(state)
    return time.perf_counter() - t0


def _calibrate(step, state, target_s):
    """Loop count so that one timed repeat takes roughly target_s."""
    n = 1
    while True:
        dt = _time_loop(step, state, n)
        if dt >= target_s / 10 or n >= 1 << 24:
            return max(1, int(n * target_s / max(dt, 1e-9)))
        n *= 4


def measure(case, lib, *, target_s=0.03, repeats=7, warmup=50):
    """Median seconds per call of `case` on library `lib` (runtime or torch)."""
    state = case.setup(lib)
    with _grad_ctx(case, lib):
        for _ in range(warmup):
            case.step(state)
        n = _calibrate(case.step, state, target_s)
        times = [_time_loop(case.step, state, n) / n for _ in range(repeats)]
    return statistics.median(times)


def harness_overhead(*, target_s=0.03, repeats=7):
    """Seconds per call of the timing loop itself (a no-op lambda); included in every figure."""
    step = lambda s: None  # noqa: E731
    n = _calibrate(step, None, target_s)
    return statistics.median(_time_loop(step, None, n) / n for _ in range(repeats))


def _header():
    """Lines describing versions, threads and cores."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = "n/a"
    lines = [
        f"python {platform.python_version()}  numpy {np.__version__}  "
        f"runtime {getattr(runtime, '__version__', '?')}  "
        f"torch {torch.__version__ if torch else 'not installed'}",
        f"cpu cores: os.cpu_count()={os.cpu_count()}  usable={affinity}  "
        f"torch.get_num_threads()={torch.get_num_threads() if torch else 'n/a'}",
    ]
    return lines


def selected_names(parser, listed, names, what="case"):
    """The names in a comma-separated flag value (None or empty: all of them), in `names` order; an unknown name is
    a parser error that lists the choices."""
    if not listed:
        return list(names)
    wanted = [n.strip() for n in listed.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        parser.error(f"unknown {what}(s) {unknown}; choose from {list(names)}")
    return [n for n in names if n in wanted]


def _parse(argv):
    """Parse CLI flags; attaches the selected Case list as args.cases."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="short run (smoke test): ~5 ms x 3 repeats")
    p.add_argument("--ops", default=None,
                   help="comma-separated subset of cases: " + ",".join(CASE_NAMES))
    args = p.parse_args(argv)
    names = selected_names(p, args.ops, CASE_NAMES, "op")
    args.cases = [c for c in CASES if c.name in names]
    return args


def _safe_measure(case, lib, opts):
    """(seconds_per_op, None) or (None, 'ExcType: message') if the case errors on lib."""
    try:
        return measure(case, lib, **opts), None
    except Exception as e:  # report, don't fix: a failing case is dropped from the table
        return None, f"{type(e).__name__}: {e}"


def _us(x):
    """Seconds -> right-aligned microseconds, or a dash when missing."""
    return f"{x * 1e6:10.3f}" if x is not None else f"{'-':>10}"


def main(argv=None):
    """Run the selected cases on runtime and torch and print the comparison table."""
    args = _parse(argv)
    opts = dict(target_s=0.005, repeats=3, warmup=10) if args.quick else \
        dict(target_s=0.03, repeats=7, warmup=50)
    for line in _header():
        print(line)
    print(f"mode: {'quick' if args.quick else 'full'}  "
          f"(~{opts['target_s'] * 1e3:.0f} ms per repeat, median of {opts['repeats']}); "
          f"harness overhead {harness_overhead(target_s=opts['target_s'], repeats=opts['repeats']) * 1e6:.3f} "
          f"us/call is included in every figure")
    if torch is None:
        print("note: torch is not importable; showing runtime figures only")
    print()

    width = max([len('expression')] + [len(c.expr) for c in args.cases])
    head = (f"{'case':<11} {'expression':<{width}} {'shape':<7} "
            f"{'runtime us':>10} {'torch us':>10} {'ratio':>7}")
    print(head)
    print("-" * len(head))
    ratios, notes = [], []
    for case in args.cases:
        rt, rt_err = _safe_measure(case, runtime, opts)
        th, th_err = _safe_measure(case, torch, opts) if torch is not None else (None, None)
        if rt_err or th_err:
            lib = "runtime" if rt_err else "torch"
            notes.append(f"dropped {case.name!r} ({case.expr} {case.shape}): {lib} raised {rt_err or th_err}")
            continue
        ratio = rt / th if th else None
        if ratio is not None:
            ratios.append(ratio)
        r = f"{ratio:6.2f}x" if ratio is not None else f"{'-':>7}"
        print(f"{case.name:<11} {case.expr:<{width}} {case.shape:<7} {_us(rt)} {_us(th)} {r}", flush=True)
    print("-" * len(head))
    for note in notes:
        print("note:", note)
    if ratios:
        print(f"summary: median runtime/torch ratio over {len(ratios)} cases = "
              f"{statistics.median(ratios):.2f}x  (min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
    elif torch is None:
        print("summary: no torch baseline, no ratios")
    else:
        print("summary: no case succeeded on both libraries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
