"""Time nnc.codegen.nowait's batch-1 product with the helper thread against the serial loop, by size, to place
nowait.MIN_WORK (the work from which kernels hand products to the helper). Asserts nothing.

    python tools/bench_nowait.py [--repeats 9] [--sizes 512x784,512x512,...]

Each size is out[n] = w[n, k] @ x[k] in float32; the two variants alternate per repeat (each ~0.1 s of calls), so load
from other processes hits both alike. The helper runs at SCHED_IDLE: on a loaded machine it gets no core and both
columns agree; the "helper" column says which share of the chunks it computed.
"""
import argparse
import os
import statistics
import time

import numpy as np

from nnc.codegen import nowait

SIZES = "512x784,512x512,256x512,256x256,128x256,128x128,64x128,10x512"


def _time(fn, args, seconds=0.1):
    fn(*args)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            fn(*args)
        calls += 100
    return (time.perf_counter() - start) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--sizes", default=SIZES, help="n x k products, comma-separated")
    opts = parser.parse_args()
    if not nowait.ensure_helper():
        raise SystemExit("no helper thread here (x86-64 Linux only, NNC_NOWAIT=0 turns it off)")
    nowait.MAILBOX[nowait._MIN_WORK] = 0  # every size goes to the helper
    while not nowait.MAILBOX[nowait._RUNNING]:
        time.sleep(0.01)
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'n x k':>10} {'work':>8}  {'serial us':>18}  {'helper us':>18}  {'ratio':>6}  helper share")
    rng = np.random.default_rng(0)
    for size in opts.sizes.split(","):
        n, k = (int(v) for v in size.split("x"))
        x = rng.standard_normal(k).astype(np.float32)
        w = rng.standard_normal(n * k).astype(np.float32)
        out = np.empty(n, np.float32)
        serial, helped = [], []
        before = nowait.counts()
        for _ in range(opts.repeats):
            serial.append(_time(nowait.gemv_serial, (x, w, out)))
            helped.append(_time(nowait.gemv, (x, w, out)))
        after = nowait.counts()
        share = (after["helped"] - before["helped"]) / max(1, after["chunks"] - before["chunks"])
        med_s, med_h = statistics.median(serial) * 1e6, statistics.median(helped) * 1e6
        print(f"{size:>10} {n * k:>8}  {med_s:7.2f} (min {min(serial) * 1e6:6.2f})  "
              f"{med_h:7.2f} (min {min(helped) * 1e6:6.2f})  {med_h / med_s:5.2f}x  {share:.0%}")
    nowait.MAILBOX[nowait._MIN_WORK] = nowait.MIN_WORK
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
