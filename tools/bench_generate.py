"""Benchmark a GPT's generate loop: eager against nnc.compile (which compiles at most two sequence lengths)."""

import argparse
import copy
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]

import nnc  # noqa: E402
import runtime  # noqa: E402
import real_models  # noqa: E402


def _timed_generate(model, tokens: int, seed: int = 1) -> tuple[float, list]:
    runtime.manual_seed(seed)
    start = time.perf_counter()
    out = model.generate(runtime.zeros(1, 1, dtype=runtime.int64), tokens)
    return time.perf_counter() - start, out.tolist()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=100, help="tokens generated per run (default 100)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each contender (default 5)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=32)
    args = parser.parse_args(argv)

    runtime.manual_seed(0)
    config = real_models.GPTConfig(n_layer=args.layers, block_size=args.block_size)
    eager = real_models.GPT(config).eval()
    compiled = nnc.compile(copy.deepcopy(eager))
    first, tokens = _timed_generate(compiled, args.tokens)
    assert tokens == _timed_generate(eager, args.tokens)[1], "compiled and eager generated different tokens"
    # NOTE: the contenders alternate, so a slow phase of a shared machine falls on both
    times = {"eager": [], "compiled": []}
    for _ in range(args.repeats):
        for label, model in (("eager", eager), ("compiled", compiled)):
            times[label].append(_timed_generate(model, args.tokens)[0])
    print(f"GPT {args.layers} layers, block {args.block_size}: {args.tokens} tokens, batch 1, "
          f"{args.repeats} runs each, threads as the machine gives them to both")
    print(f"  compiled first run (compiling included): {first:.2f} s, "
          f"{compiled.compiled_variants} compiled variants")
    for label, values in times.items():
        print(f"  {label:<9} median {statistics.median(values) * 1e3:8.1f} ms  "
              f"(min {min(values) * 1e3:.1f}, max {max(values) * 1e3:.1f})")
    ratios = [c / e for c, e in zip(times["compiled"], times["eager"])]
    print(f"  compiled / eager: median {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
