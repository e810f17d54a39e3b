"""Benchmark nnc's generated CUDA kernels on a GPU (run it where one is at hand; it asserts nothing).

Cases (float32; every figure is a median of this run, ratios are between figures of this run):

  membound     relu(x*w+b)+0.5*x at 2**24 elements ([16384, 1024]): the fused elementwise kernel against a
               device-to-device copy of the same bytes (the memory bandwidth limit). Target: >= 80% of the copy.
  mlp_b128     MLP 784-512-512-10 training step's kernels (forward and backward graphs, cross-entropy loss) at
  mlp_b4096    batch 128 and 4096: every generated kernel launched in plan order on device arrays, per kind. The
               views and other opaque steps are not run (they need runtime's CUDA tensors), so this is the
               kernels' time, not a training step's; launches per step are counted.
  mlp_infer_b1 batch-1 inference of that MLP: its kernels' time and launches per call.

    python tools/bench_cuda_kernels.py [--cases membound,mlp_b128,...] [--repeats N] [--quick]

--quick shrinks every size (a check that the script runs, e.g. under NUMBA_ENABLE_CUDASIM=1; its times mean
nothing there).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))


def _time(fn, repeats: int, inner: int) -> list[float]:
    """Seconds per call of fn over `repeats` timings of `inner` calls each (synchronized before and after)."""
    from numba import cuda

    fn()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        cuda.synchronize()
        times.append((time.perf_counter() - start) / inner)
    return times


def _row(name: str, times: list[float], note: str = "") -> str:
    median = statistics.median(times)
    spread = (max(times) - min(times)) / median if median else 0.0
    return f"{name:<34} {median * 1e6:11.1f} us  spread {spread:5.1%}  {note}"


def plan_kernels(model, x, loss=None) -> list[tuple[str, object, list]]:
    """(plan label, kernel, input arrays) for every kernel of the model's compiled plans, in plan order; the inputs
    are the interpreter's values (the models run once compiled with codegen off, each plan's inputs recorded)."""
    import nnc
    from nnc.executor import Plan
    from nnc.interpreter import Interpreter

    recorded, run = [], Plan.run

    def recording(plan, *inputs, sizes=()):
        recorded.append((plan, inputs))
        return run(plan, *inputs, sizes=sizes)

    Plan.run = recording
    try:
        out = nnc.compile(model, codegen=False)(x)
        if loss is not None:
            loss(out).backward()
    finally:
        Plan.run = run
    found = []
    for k, (plan, inputs) in enumerate(recorded):
        interpreter = Interpreter(plan.gm)
        interpreter.run(*inputs)
        label = "forward" if k == 0 else "backward"
        found += [(label, kernel, [np.array(interpreter.env[n]._data, order="C") for n in kernel.inputs])
                  for kernel in plan.kernels]
    return found


def _membound(args) -> list[str]:
    import runtime as torch
    from nnc.codegen import cuda as nnc_cuda
    from numba import cuda
    from runtime import nn

    rows, cols = (64, 32) if args.quick else (16384, 1024)

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.randn(cols)), nn.Parameter(torch.randn(cols))

        def forward(self, x):
            return torch.relu(x * self.w + self.b) + 0.5 * x

    with torch.no_grad():
        kernels = [(k, ins) for _, k, ins in plan_kernels(Chain(), torch.randn(rows, cols))
                   if k.kind == "elementwise"]
    assert len(kernels) == 1, "the chain should fuse into one elementwise kernel"
    kernel, inputs = kernels[0]
    compiled = nnc_cuda.compile_kernel(kernel)
    ins = [cuda.to_device(a) for a in inputs]
    outs = [cuda.device_array(tuple(s), d) for s, d in compiled.out_specs]
    copy_src, copy_dst = ins[[a.size for a in inputs].index(rows * cols)], cuda.device_array(rows * cols, np.float32)
    inner = 2 if args.quick else 50
    fused, copy = [], []
    for _ in range(args.repeats):  # interleaved, so load hits both sides alike
        fused += _time(lambda: compiled.run_into(ins, outs), 1, inner)
        copy += _time(lambda: copy_dst.copy_to_device(copy_src.reshape(-1)), 1, inner)
    nbytes = 2 * rows * cols * 4  # read x, write the result (w and b stay in cache)
    ratio = statistics.median(copy) / statistics.median(fused)
    launch = next(iter(compiled.launches.values())).text
    gbs = lambda times: f"{nbytes / statistics.median(times) / 1e9:7.1f} GB/s"  # noqa: E731
    return [_row(f"membound fused [{rows}x{cols}]", fused, f"{gbs(fused)}, {ratio:.0%} of the copy (launch {launch})"),
            _row("membound device-to-device copy", copy, gbs(copy))]


def _mlp(args, batch: int, train: bool) -> list[str]:
    import runtime as torch
    from models import MLP
    from nnc.codegen import cuda as nnc_cuda
    from nnc.codegen.scalar import KernelCompileError
    from numba import cuda
    from runtime.nn import functional as F

    sizes = (32, 16, 16, 4) if args.quick else (784, 512, 512, 10)
    batch = min(batch, 4) if args.quick else batch
    model = MLP(sizes)
    x, y = torch.randn(batch, sizes[0]), torch.tensor(np.arange(batch) % sizes[-1])
    if train:
        found = plan_kernels(model, x, lambda out: F.cross_entropy(out, y))
    else:
        with torch.no_grad():
            found = plan_kernels(model.eval(), x)
    steps, skipped = [], []
    for label, kernel, inputs in found:
        try:
            compiled = nnc_cuda.compile_kernel(kernel)
        except KernelCompileError:
            skipped.append(kernel.kind)
            continue
        ins = [cuda.to_device(a) for a in inputs]
        outs = [cuda.device_array(tuple(s), d) for s, d in compiled.out_specs]
        steps.append((f"{label} {kernel.kind}", compiled, ins, outs))
    launches = sum(len(c.launches) for _, c, _, _ in steps)
    inner = 2 if args.quick else 20
    total = _time(lambda: [c.run_into(i, o) for _, c, i, o in steps], args.repeats, inner)
    name = f"mlp {'train' if train else 'infer'} b{batch}"
    rows = [_row(f"{name}: all kernels", total, f"{launches} launches; not run: {len(skipped)} opaque/views")]
    for kind in sorted({s[0] for s in steps}):
        chosen = [s for s in steps if s[0] == kind]
        t = _time(lambda chosen=chosen: [c.run_into(i, o) for _, c, i, o in chosen], args.repeats, inner)
        rows.append(_row(f"  {kind} x{len(chosen)}", t))
    return rows


CASES = {"membound": _membound, "mlp_b128": lambda a: _mlp(a, 128, True), "mlp_b4096": lambda a: _mlp(a, 4096, True),
         "mlp_infer_b1": lambda a: _mlp(a, 1, False)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated cases of {', '.join(CASES)}")
    parser.add_argument("--repeats", type=int, default=7, help="timings per figure (default 7)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: check that the script runs")
    args = parser.parse_args(argv)
    from numba import cuda

    from nnc.codegen.cuda import simulator_enabled

    if not simulator_enabled() and not cuda.is_available():
        print("bench_cuda_kernels: no CUDA GPU here (set NUMBA_ENABLE_CUDASIM=1 with --quick to check the script)")
        return 1
    device = "numba's simulator" if simulator_enabled() else cuda.get_current_device().name
    print(f"device: {device}")
    for case in args.cases.split(","):
        if case not in CASES:
            parser.error(f"unknown case {case!r}; the cases are {', '.join(CASES)}")
        for line in CASES[case](args):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
