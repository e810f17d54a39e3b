"""Time nnc.codegen.nowait's batch-1 product with the helper thread against the serial loop, by size, to place
nowait.MIN_WORK (the work from which kernels hand products to the helper). Asserts nothing.

    python tools/bench_nowait.py [--repeats 9] [--sizes 512x784,512x512,...]
    python tools/bench_nowait.py --rows [--rows-shape 36x64x32x36] [--chunk-work 65536,131072,...]
    python tools/bench_nowait.py --kernel [--sizes 256x784,...] [--dtype float64]

--rows times the batched-rows product instead (Winograd's products, nnc.codegen.rows_kernel: batch x rows x kdim x
n_out, default the MNIST CNN's conv2 at batch 1): rows_kernel alone against nowait.batched_rows, by chunk size.

Each size is out[n] = w[n, k] @ x[k] in float32; the two variants alternate per repeat (each ~0.1 s of calls), so load
from other processes hits both alike. The helper runs at SCHED_IDLE: on a loaded machine it gets no core and both
columns agree; the "helper" column says which share of the chunks it computed, "stolen" in which share of the
products the caller recomputed a chunk the helper had claimed. --chunk-bytes compares chunk sizes.

--kernel times the per-chunk kernel alone (nowait.gemv_rows over all rows, called in a numba loop so no Python
call is timed, weights and x aligned to 64 bytes as runtime allocates parameters) and reports the weight bytes it
streams per second: one core, where the weights sit (L1, L2, L3) is what it measures.
"""
import argparse
import os
import statistics
import time

import numpy as np
from numba import njit

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
    parser.add_argument("--chunk-bytes", default=str(nowait.CHUNK_BYTES),
                        help="chunk sizes to compare (bytes of weight rows a chunk, comma-separated)")
    parser.add_argument("--rows", action="store_true", help="time the batched-rows product instead")
    parser.add_argument("--rows-shape", default="36x64x32x36", help="batch x rows x kdim x n_out")
    parser.add_argument("--chunk-work", default="65536,131072,262144",
                        help="batched-rows chunk sizes to compare (multiply-adds, comma-separated)")
    parser.add_argument("--kernel", action="store_true", help="time the per-chunk kernel alone, on one core")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"), help="for --kernel")
    opts = parser.parse_args()
    if opts.kernel:
        _kernel(opts)
        return
    if not nowait.ensure_helper():
        raise SystemExit("no helper thread here (x86-64 Linux only, NNC_NOWAIT=0 turns it off)")
    nowait.MAILBOX[nowait._MIN_WORK] = 0  # every size goes to the helper
    while not nowait.MAILBOX[nowait._RUNNING]:
        time.sleep(0.01)
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if opts.rows:
        _rows(opts)
        print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        return
    chunk_bytes = [int(v) for v in opts.chunk_bytes.split(",")]
    print(f"{'n x k':>10} {'work':>8}  {'serial us':>18}" + "".join(
        f"  {f'chunks of {b} B: us':>26} {'ratio':>6} {'helper':>6} {'stolen':>6}" for b in chunk_bytes))
    rng = np.random.default_rng(0)
    for size in opts.sizes.split(","):
        n, k = (int(v) for v in size.split("x"))
        x = rng.standard_normal(k).astype(np.float32)
        w = rng.standard_normal(n * k).astype(np.float32)
        out = np.empty(n, np.float32)
        serial, helped = [], {b: [] for b in chunk_bytes}
        counts = {b: [0, 0, 0, 0] for b in chunk_bytes}
        for _ in range(opts.repeats):
            serial.append(_time(nowait.gemv_serial, (x, w, out)))
            for b in chunk_bytes:
                nowait.MAILBOX[nowait._CHUNK_BYTES] = b
                before = nowait.counts()
                helped[b].append(_time(nowait.gemv, (x, w, out)))
                after = nowait.counts()
                for j, key in enumerate(("helped", "chunks", "stolen", "jobs")):
                    counts[b][j] += after[key] - before[key]
        med_s = statistics.median(serial) * 1e6
        line = f"{size:>10} {n * k:>8}  {med_s:7.2f} (min {min(serial) * 1e6:6.2f})"
        for b in chunk_bytes:
            med_h = statistics.median(helped[b]) * 1e6
            h, c, st, jobs = counts[b]
            line += (f"  {med_h:14.2f} (min {min(helped[b]) * 1e6:6.2f}) {med_h / med_s:5.2f}x {h / max(1, c):6.0%} "
                     f"{st / max(1, jobs):6.0%}")
        print(line)
    nowait.MAILBOX[nowait._MIN_WORK] = nowait.MIN_WORK
    nowait.MAILBOX[nowait._CHUNK_BYTES] = nowait.CHUNK_BYTES
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


@njit(nogil=True)
def _kernel_calls(x, w, out, calls):
    for _ in range(calls):
        nowait.gemv_rows(x, w, out, 0, out.shape[0])


def _aligned(n, dtype):
    """n elements of dtype starting on a 64-byte boundary."""
    raw = np.empty(n * np.dtype(dtype).itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + n * np.dtype(dtype).itemsize].view(dtype)


def _kernel(opts):
    """gemv_rows alone by size: medians and minimums of `repeats` timings of ~2 M multiply-adds of calls."""
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'n x k':>10} {'bytes':>9}  {'us a product':>22} {'GB/s (best)':>12}   ({opts.dtype}, one core)")
    rng = np.random.default_rng(0)
    for size in opts.sizes.split(","):
        n, k = (int(v) for v in size.split("x"))
        x, w = _aligned(k, opts.dtype), _aligned(n * k, opts.dtype)
        x[:], w[:] = rng.standard_normal(k), rng.standard_normal(n * k)
        out = np.empty(n, opts.dtype)
        calls = max(1, 2_000_000 // max(1, n * k))
        _kernel_calls(x, w, out, 1)
        times = []
        for _ in range(opts.repeats):
            start = time.perf_counter()
            _kernel_calls(x, w, out, calls)
            times.append((time.perf_counter() - start) / calls)
        print(f"{size:>10} {w.nbytes:>9}  {statistics.median(times) * 1e6:8.2f} (min {min(times) * 1e6:7.2f}) "
              f"{w.nbytes / min(times) / 1e9:12.0f}")
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


def _rows(opts):
    """The batched-rows product: rows_kernel alone, then with the helper at each chunk size, alternating."""
    batch, rows, kdim, n_out = (int(v) for v in opts.rows_shape.split("x"))
    rng = np.random.default_rng(0)
    a = rng.standard_normal(batch * rows * kdim).astype(np.float32)
    b = rng.standard_normal(batch * kdim * n_out).astype(np.float32)
    out = np.empty(batch * rows * n_out, np.float32)
    works = [int(v) for v in opts.chunk_work.split(",")]
    serial, helped = [], {w: [] for w in works}
    counts = {w: [0, 0, 0, 0] for w in works}
    for _ in range(opts.repeats):
        serial.append(_time(nowait.rows_product, (a, b, out, rows, kdim, n_out)))
        for w in works:
            nowait.MAILBOX[nowait._RCHUNK_WORK] = w
            before = nowait.counts()
            helped[w].append(_time(nowait.batched_rows, (a, b, out, rows, kdim, n_out)))
            after = nowait.counts()
            for j, key in enumerate(("helped", "chunks", "stolen", "jobs")):
                counts[w][j] += after[key] - before[key]
    nowait.MAILBOX[nowait._RCHUNK_WORK] = nowait.ROWS_CHUNK_WORK
    med_s = statistics.median(serial) * 1e6
    print(f"{opts.rows_shape} ({batch * rows * kdim * n_out} multiply-adds), float32")
    print(f"  rows_kernel alone: {med_s:7.2f} us (min {min(serial) * 1e6:6.2f})")
    for w in works:
        med_h = statistics.median(helped[w]) * 1e6
        h, c, st, jobs = counts[w]
        print(f"  with the helper, chunks of {w:>7} multiply-adds: {med_h:7.2f} us (min {min(helped[w]) * 1e6:6.2f}) "
              f"{med_h / med_s:5.2f}x  helper computed {h / max(1, c):4.0%} of the chunks, a chunk stolen in "
              f"{st / max(1, jobs):4.0%} of the products ({c / max(1, jobs):.0f} chunks a product)")


if __name__ == "__main__":
    main()
