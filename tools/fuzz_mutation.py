"""Differential fuzzing of nnc.compile on random programs with mutation: compiled vs eager vs torch.

    python tools/fuzz_mutation.py --programs 3000 [--start 0] [--codegen] [--dtype float32] [--dynamic]

Each program mixes in-place ops (methods, `x[i] = v`, `x += v`, inplace=True functionals), views, detach and
casts over a [B, 6] input (B in 0, 1, 3), with and without grad; see tests/mutation_programs.py. Prints the count
of programs where the compiled module is wrong (differs from eager, and from torch when eager and torch differ
too), where eager differs from torch, and where compiling fell back to eager; exits 1 if any compiled one is wrong.
With --dynamic, each program compiles with dynamic=True and is called with batch sizes 3, 5, 2, 7, 1, 4; it is
wrong where it differs from static compiles at the same sizes.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import runtime  # noqa: E402
from mutation_programs import fallbacks, random_case, run_case, run_dynamic_case  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=1000, help="how many programs (default 1000)")
    parser.add_argument("--start", type=int, default=0, help="the first program's seed")
    parser.add_argument("--codegen", action="store_true", help="generate numba kernels (default: interpret them)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default=None, help="default: each program draws")
    parser.add_argument("--show", type=int, default=5, help="print the first N wrong programs")
    parser.add_argument("--dynamic", action="store_true", help="symbolic batch sizes against static compiles")
    args = parser.parse_args(argv)
    if args.dynamic:
        return _fuzz_dynamic(args)
    dtype = getattr(runtime, args.dtype) if args.dtype else None
    counts, reasons, shown = collections.Counter(), collections.Counter(), 0
    start = time.perf_counter()
    for seed in range(args.start, args.start + args.programs):
        case = random_case(seed, dtype)
        result = run_case(case, codegen=args.codegen)
        wrong = result.compiled_is_wrong()
        counts["eager differs from torch"] += bool(result.eager_vs_torch())
        counts["compile fell back to eager"] += bool(fallbacks(result.compiled))
        if wrong:
            counts["compiled is wrong"] += 1
            reasons[wrong[0][:80]] += 1
            if shown < args.show:
                shown += 1
                print(f"seed {seed}: {case}\n  {wrong}")
    print(f"{args.programs} programs from seed {args.start} ({'codegen' if args.codegen else 'interpreted kernels'}, "
          f"{args.dtype or 'float32 and float64'}) in {time.perf_counter() - start:.0f} s")
    for what in ("compiled is wrong", "eager differs from torch", "compile fell back to eager"):
        print(f"  {what}: {counts[what]}")
    for reason, n in reasons.most_common(10):
        print(f"    {n} x {reason}")
    return 1 if counts["compiled is wrong"] else 0


def _fuzz_dynamic(args) -> int:
    dtype = getattr(runtime, args.dtype) if args.dtype else None
    wrong, shown, start = 0, 0, time.perf_counter()
    for seed in range(args.start, args.start + args.programs):
        case = random_case(seed, dtype)
        problems = run_dynamic_case(case, codegen=args.codegen)
        if problems:
            wrong += 1
            if shown < args.show:
                shown += 1
                print(f"seed {seed}: {case}\n  {problems}")
    print(f"{args.programs} programs from seed {args.start}, dynamic batch sizes "
          f"({'codegen' if args.codegen else 'interpreted kernels'}) in {time.perf_counter() - start:.0f} s")
    print(f"  dynamic differs from static: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
