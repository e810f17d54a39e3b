"""Benchmark nnc.compile'd runtime Modules against torch eager, hand-fused numba kernels and the memory bandwidth.

Cases (all float32; every figure is a median measured in this run, every ratio is between figures of this run):

  1 chain_fwd      gelu_tanh(x*w+b)*sigmoid(x)+0.5*x, x [4096,1024], w and b [1024] (no_grad forward):
                   nnc.compile vs torch eager vs a hand-fused numba prange kernel using nnc.codegen.approx.
                   Target: compiled <= 1.25x the hand-fused kernel.
  2 membound       relu(x*w+b)+0.5*x at 2**24 elements ([16384,1024]) (no_grad forward): compiled vs the memory
                   bandwidth limit, measured as a numba prange copy `out[i] = x[i]` of the same bytes (read x once,
                   write once; numba makes it a memcpy). Target: compiled reaches >= 85% of the copy's speed.
                   "numba scale" (`out[i] = x[i] * 2`) moves the same bytes with a computed store, the most a
                   generated kernel's plain stores can reach. 2b membound_2e22: the same at 2**22 elements
                   ([4096,1024]). Every array of these starts on a cache line, as runtime.tensor's copies do;
                   "nnc.compile (x 16 B off)" is a diagnostic with x where numpy's own allocations start.
  3 chain_fwd_bwd  forward+backward of case 1's chain (gradients for x, w, b): compiled vs torch eager vs hand-fused
                   numba (a forward kernel plus a backward kernel that recomputes from x). Target: >= 2.5x faster
                   than torch.compile (measured only with --torch-compile, which takes long here).
  4 mlp_train_*    MLP 784-512-512-10 (ReLU) training step (zero_grad, forward, CrossEntropyLoss, backward,
                   SGD momentum) at batch 128 and 8: nnc.compile(model) vs torch eager. Target: <= 1.0x torch eager.
  5 mlp_infer_b1   batch-1 inference of that MLP under no_grad (nnc.compile runs it in whole-graph mode: one numba
                   call; "kernel by kernel" is the same model with whole_graph=False), beside onnxruntime running
                   the torch model exported with torch.onnx.export(dynamo=False) (needs the onnx and onnxruntime
                   packages; the row reports the import error without them), and the same session on one
                   thread. nnc runs the two large layers' products with nnc.codegen.nowait's helper thread, which
                   only gets a core nothing else wants: "no helper" is the same compiled model with every product
                   serial, and the nnc.compile row's note gives the share of chunks the helper computed.
                   Targets: compiled <= 45 us and <= onnxruntime's time.
  5b mlp_infer_b1_loaded  case 5 quiet, then beside one CPU-bound process (a Python spin loop), then beside one
                   such process per core. Target (the issue's case): compiled beside a CPU-bound neighbour <= 2x
                   its quiet time. Beside one per core is reported too: there the process gets about a third of
                   each core, and the helper thread (SCHED_IDLE) none, so the quiet time's use of the second core
                   is what the ratio measures.
  5c models_infer_b1_loaded  the GPT's and the CNN's batch-1 inference (cases 8b and 7b) quiet, then beside one
                   CPU-bound process. Targets: each compiled beside the neighbour <= 2x its quiet time.
  9 llama_train_b8 a LLaMA in Meta's reference shape (examples/llama.py: RMSNorm, SwiGLU, rotary embeddings as
                   complex products; 2 layers, 4 heads, dim 64, block 64, vocab 256, batch 8) AdamW step: compiled
                   (its complex products run in numpy) vs runtime eager vs torch eager. No target: a real model's
                   standing, reported.
  6 compile_time   compile time of that MLP's forward+backward, cold (a fresh NNC_CACHE_DIR, in a subprocess) and
                   from the disk cache (a second subprocess with the same directory). Targets: < 3 s cold,
                   < 0.5 s from the cache.

The same Module code runs on runtime and on torch (the library is passed as `lib`). Compiled modules are warmed up
before timing (the first call compiles). Variants of a case are timed interleaved (one repeat of each in turn, with
an untimed pause before each, as tools/bench_mlp.py does) so that load from other processes hits every side of a
ratio alike; the spread column is (max - min) / median of the repeats, the min column the fastest repeat. Each case
runs in a fresh process of this script (--in-process: all in this one), because the thread pools of numpy's
OpenBLAS, numba and torch leave state behind that slows later cases. Asserts nothing.

    python tools/bench_compile.py [--quick] [--cases chain_fwd,membound,...] [--torch-compile] [--threads N]
                                  [--steps] [--in-process] [--openblas-coretype NAME]

--steps adds, for every nnc.compile variant, the time spent in each executor step (kernel or interpreted group)
and the rest of the call (guards, autograd glue, the eager loss and optimizer), from a short extra run.
"""

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable


if __name__ == "__main__":  # before numpy/torch/numba load: they read thread counts once
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from thread_flag import apply_threads_flag

    apply_threads_flag(sys.argv[1:], ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                      "NUMBA_NUM_THREADS"))
    for _i, _a in enumerate(sys.argv[:-1]):  # --openblas-coretype NAME: OpenBLAS reads it once, when it loads
        if _a == "--openblas-coretype":
            os.environ["OPENBLAS_CORETYPE"] = sys.argv[_i + 1]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import runtime
    from tools.bench_eager import _calibrate, _header, _time_loop, harness_overhead, selected_names
    from tools.bench_mlp import LR, MOMENTUM, _batch, _blas_line, _fmt, _mlp, _spread, infer_step, train_step
except ImportError:  # run as `python tools/bench_compile.py`: put the repo root on sys.path
    sys.path.insert(0, _ROOT)
    import runtime
    from tools.bench_eager import _calibrate, _header, _time_loop, harness_overhead, selected_names
    from tools.bench_mlp import LR, MOMENTUM, _batch, _blas_line, _fmt, _mlp, _spread, infer_step, train_step

sys.path.insert(0, os.path.join(_ROOT, "examples"))  # the LLaMA of case 9 (examples/llama.py)
import numba  # noqa: E402  (imported after the thread flags above are applied)
import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

import nnc  # noqa: E402
from nnc.codegen.approx import sigmoid_f32, tanh_f32  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


# ---------------------------------------------------------------------------------------------------------------
# The models (one code path for runtime and torch: `lib` is the library)
# ---------------------------------------------------------------------------------------------------------------

CHAIN_SHAPE = (4096, 1024)
MEM_SHAPE = (16384, 1024)  # 2**24 elements (case 2b: 2**22)


def _affine_module(lib, w, b, head):
    """head(lib, x, x*w+b) as a lib.nn.Module with w and b as parameters."""

    class AffineChain(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = lib.nn.Parameter(lib.tensor(w))
            self.b = lib.nn.Parameter(lib.tensor(b))

        def forward(self, x):
            return head(lib, x, x * self.w + self.b)

    return AffineChain()


def _chain_module(lib, w, b):
    """gelu_tanh(x*w+b)*sigmoid(x)+0.5*x."""
    return _affine_module(lib, w, b, lambda lib, x, u: lib.nn.functional.gelu(u, approximate="tanh")
                          * lib.sigmoid(x) + 0.5 * x)


def _mem_module(lib, w, b):
    """relu(x*w+b)+0.5*x."""
    return _affine_module(lib, w, b, lambda lib, x, u: lib.relu(u) + 0.5 * x)


def _data(shape, seed=0):
    """x [rows, cols] and per-column w, b as float32 numpy arrays (x ~ 3 * N(0, 1) exercises both tanh ranges)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    gy = rng.standard_normal(shape).astype(np.float32)  # the upstream gradient for the backward cases
    return x, w, b, gy


# ---------------------------------------------------------------------------------------------------------------
# Hand-fused numba kernels (the baselines)
# ---------------------------------------------------------------------------------------------------------------

# NOTE: float32 constants as globals: a Python float literal would make numba compute in float64.
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_TWO = np.float32(2.0)
_K0 = np.float32(math.sqrt(2.0 / math.pi))
_K1 = np.float32(0.044715)
_K3 = np.float32(3 * 0.044715)


def _aligned_copy(a: np.ndarray, skew: int = 0) -> np.ndarray:
    """A copy of `a` starting `skew` bytes after a 64-byte cache line (skew 16: where numpy's own large allocations
    start, 16 bytes into a page)."""
    raw = np.empty(a.nbytes + 64 + skew, dtype=np.uint8)
    start = -raw.ctypes.data % 64 + skew
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _skewed_parameters(model, skew=16):
    """`model` with every parameter moved into memory `skew` bytes after a cache line (runtime's factories align
    large tensors): the diagnostic variants show what the alignment is worth."""
    for p in model.parameters():
        p.data = runtime.from_numpy(_aligned_copy(p.detach().numpy(), skew))
    return model


@njit(parallel=True, error_model="numpy")
def chain_fwd_kernel(x, w, b, out):
    """gelu_tanh(x*w+b)*sigmoid(x)+0.5*x: one pass, approx.py's tanh/sigmoid inlined and vectorized."""
    rows, cols = x.shape
    for i in prange(rows):
        xr, outr = x[i], out[i]
        for j in range(cols):
            xv = xr[j]
            u = xv * w[j] + b[j]
            g = _HALF * u * (_ONE + tanh_f32(_K0 * (u + _K1 * u * u * u)))
            outr[j] = g * sigmoid_f32(xv) + _HALF * xv


@njit(parallel=True, error_model="numpy")
def chain_bwd_kernel(x, w, b, gy, gx, gw_part, gb_part):
    """The chain's backward, recomputing the forward from x: gx in full, gw/gb as per-chunk partial column sums.

    Chunk c of the rows accumulates into gw_part[c] / gb_part[c]; the caller sums the partials (a [chunks, cols]
    array, tiny)."""
    rows, cols = x.shape
    chunks = gw_part.shape[0]
    per = (rows + chunks - 1) // chunks
    for c in prange(chunks):
        accw, accb = gw_part[c], gb_part[c]
        for j in range(cols):
            accw[j] = _ZERO
            accb[j] = _ZERO
        for i in range(c * per, min(rows, (c + 1) * per)):
            xr, gyr, gxr = x[i], gy[i], gx[i]
            for j in range(cols):
                xv = xr[j]
                wv = w[j]
                u = xv * wv + b[j]
                t = tanh_f32(_K0 * (u + _K1 * u * u * u))
                g = _HALF * u * (_ONE + t)
                s = sigmoid_f32(xv)
                dg = _HALF * (_ONE + t) + _HALF * u * (_ONE - t * t) * _K0 * (_ONE + _K3 * u * u)
                gv = gyr[j]
                du = gv * s * dg
                gxr[j] = du * wv + gv * (g * s * (_ONE - s) + _HALF)
                accw[j] += du * xv
                accb[j] += du


@njit(parallel=True, error_model="numpy")
def mem_fwd_kernel(x, w, b, out):
    """relu(x*w+b)+0.5*x, hand-fused."""
    rows, cols = x.shape
    for i in prange(rows):
        xr, outr = x[i], out[i]
        for j in range(cols):
            xv = xr[j]
            u = xv * w[j] + b[j]
            outr[j] = (u if u > _ZERO else _ZERO) + _HALF * xv


@njit(parallel=True, error_model="numpy")
def copy_kernel(x, out):
    """out[i] = x[i] over flat arrays: read every byte once, write every byte once (the bandwidth limit)."""
    for i in prange(x.shape[0]):
        out[i] = x[i]


@njit(parallel=True, error_model="numpy")
def scale_kernel(x, out):
    """out[i] = x[i] * 2 over flat arrays: the copy's bytes, with a computed value stored (no memcpy)."""
    for i in prange(x.shape[0]):
        out[i] = x[i] * _TWO


# ---------------------------------------------------------------------------------------------------------------
# Measurement: variants of one case, interleaved per repeat
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Variant:
    """One way to run a case: `setup()` builds the state once (untimed), `step(state)` is the timed call.

    `ctx()` is the context every call runs in (no_grad for inference); `result(state)` returns numpy arrays to
    compare across variants; `compiled(state)` returns the nnc CompiledModule (for --steps)."""

    label: str
    setup: Callable
    step: Callable
    ctx: Callable = contextlib.nullcontext
    result: Callable = None
    compiled: Callable = None
    note: str = ""


@dataclass
class Measured:
    label: str
    median: float = None
    low: float = None
    high: float = None
    error: str = None
    state: object = field(default=None, repr=False)
    setup_s: float = 0.0

    @property
    def ok(self):
        return self.error is None and self.median is not None

    def spread(self):
        return _spread((self.median, self.low, self.high)) if self.ok else f"{'-':>6}"


# NOTE: at least this many warm-up calls, whatever their time: the first compiles, and runtime's SGD times its
# serial and parallel updates on its first 2 * LaunchChoice.TRIALS steps before keeping one (optim/_launch.py)
_MIN_WARM_CALLS = 10


def _warm(step, state, count, limit_s):
    """Up to `count` calls: the first min(_MIN_WARM_CALLS, count) however long they take, then until limit_s has
    passed."""
    start = time.perf_counter()
    least = min(_MIN_WARM_CALLS, max(2, count))
    for k in range(max(least, count)):
        step(state)
        if k >= least - 1 and time.perf_counter() - start > limit_s:
            break


def measure_variants(variants, *, target_s=0.25, repeats=9, warmup=20, settle_s=0.2, warm_s=2.0):
    """{label: Measured} for each variant; repeats interleaved across variants, each after a settle_s pause.

    A variant whose setup or step raises is reported with its error (report, don't fix)."""
    out, loops = {}, {}
    for v in variants:
        m = Measured(v.label)
        out[v.label] = m
        try:
            t0 = time.perf_counter()
            m.state = v.setup()
            with v.ctx():
                _warm(v.step, m.state, warmup, warm_s)
                m.setup_s = time.perf_counter() - t0
                loops[v.label] = _calibrate(v.step, m.state, target_s)
        except Exception as e:  # noqa: BLE001
            m.error = f"{type(e).__name__}: {e}"
    times = {v.label: [] for v in variants if out[v.label].error is None}
    for _ in range(repeats):
        for v in variants:
            m = out[v.label]
            if m.error is not None:
                continue
            time.sleep(settle_s)
            try:
                with v.ctx():
                    n = loops[v.label]
                    times[v.label].append(_time_loop(v.step, m.state, n) / n)
            except Exception as e:  # noqa: BLE001
                m.error = f"{type(e).__name__}: {e}"
    for label, ts in times.items():
        m = out[label]
        if m.error is None and ts:
            m.median, m.low, m.high = statistics.median(ts), min(ts), max(ts)
    return out


def _max_dev(a, b):
    """max |a - b| / max(|b|, 1e-3) over all elements (relative deviation with a floor)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3)))


# ---------------------------------------------------------------------------------------------------------------
# Per-step timing of compiled modules (--steps)
# ---------------------------------------------------------------------------------------------------------------

def _plans_of(compiled):
    """[(plan label, Plan)] of every artifact a CompiledModule has compiled."""
    plans = []
    for k, artifact in enumerate(compiled._cache.values()):
        for label in ("forward_plan", "training_plan", "backward_plan"):
            plan = getattr(artifact, label, None)
            if plan is not None:
                plans.append((f"v{k}.{label[:-5]}", plan))
    return plans


def _step_label(step):
    kernels = getattr(step, "kernels", None)
    if kernels is not None:
        return f"whole graph: one numba call ({len(kernels)} kernels: {', '.join(k.name for k in kernels[:4])}" \
               f"{', ...' if len(kernels) > 4 else ''})"
    kernel = getattr(step, "kernel", None)
    if kernel is not None:
        ops = kernel.meta.get("ops") or []
        return f"{kernel.name} ({len(ops)} ops: {', '.join(ops[:6])}{', ...' if len(ops) > 6 else ''})"
    names = [getattr(n.target, "__name__", str(n.target)) for n in getattr(step, "nodes", [])]
    return f"interpreted [{', '.join(names)}]"


def step_profile(variant, state, calls):
    """Run `calls` steps with every executor step (and Plan.run) timed; returns (total per call, rows).

    Timing wrappers are set as instance attributes on the plan and step objects of this run only, and removed
    afterwards."""
    compiled = variant.compiled(state)
    plans = _plans_of(compiled)
    acc = {}

    def timed(key, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0
        return wrapper

    patched = []
    for plabel, plan in plans:
        plan.run = timed((plabel, None), plan.run)
        patched.append(plan)
        for k, st in enumerate(plan.steps):
            # NOTE: Plan.run calls a whole-graph step's compiled function itself (the step's own run is for
            # nnc.profile), so that is what is timed there
            target = st.compiled if hasattr(st, "kernels") else st
            target.run = timed((plabel, k), target.run)
            patched.append(target)
    try:
        with variant.ctx():
            t0 = time.perf_counter()
            for _ in range(calls):
                variant.step(state)
            total = (time.perf_counter() - t0) / calls
    finally:
        for obj in patched:
            obj.__dict__.pop("run", None)
    rows = []
    for plabel, plan in plans:
        plan_s = acc.get((plabel, None), 0.0) / calls
        if not plan_s:
            continue
        step_sum = 0.0
        for k, st in enumerate(plan.steps):
            s = acc.get((plabel, k), 0.0) / calls
            step_sum += s
            rows.append((f"{plabel} step {k}: {_step_label(st)}", s))
        rows.append((f"{plabel} Plan.run outside its steps (env dict, attrs, output)", plan_s - step_sum))
    plan_total = sum(acc.get((p, None), 0.0) for p, _ in plans) / calls
    rows.append(("outside Plan.run (guards, autograd glue, eager loss/optimizer, harness)", total - plan_total))
    return total, rows


# ---------------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Target:
    text: str         # what is asked, e.g. "compiled <= 1.25x hand-fused"
    measured: str     # the measured figure, e.g. "1.12x"
    met: object       # True / False / None (not measured)


def _nograd(lib):
    return lambda: lib.no_grad()


def _grads_to_none(params):
    for p in params:
        p.grad = None


def _torch_threads_note():
    return f"torch {torch.get_num_threads()} threads" if torch is not None else "torch missing"


def case_chain_fwd(opts, args):
    x, w, b, _ = _data(CHAIN_SHAPE)
    variants = []

    def nnc_setup():
        cm = nnc.compile(_chain_module(runtime, w, b))
        return cm, runtime.tensor(x)
    variants.append(Variant("nnc.compile", nnc_setup, lambda s: s[0](s[1]), _nograd(runtime),
                            result=lambda s: [s[0](s[1]).numpy()], compiled=lambda s: s[0]))

    def hand_setup():
        return x, w, b, np.empty_like(x)
    variants.append(Variant("hand-fused numba", hand_setup, lambda s: chain_fwd_kernel(*s),
                            result=lambda s: [(chain_fwd_kernel(*s), s[3])[1].copy()],
                            note="preallocated output"))
    variants.append(Variant("hand-fused numba + np.empty", lambda: (x, w, b),
                            lambda s: chain_fwd_kernel(*s, np.empty_like(s[0])),
                            note="a fresh output array per call, as compiled and eager calls return one"))
    if torch is not None:
        def torch_setup():
            return _chain_module(torch, w, b), torch.from_numpy(x)
        variants.append(Variant("torch eager", torch_setup, lambda s: s[0](s[1]), _nograd(torch),
                                result=lambda s: [s[0](s[1]).numpy()]))
        if args.torch_compile:
            def tc_setup():
                return torch.compile(_chain_module(torch, w, b)), torch.from_numpy(x)
            variants.append(Variant("torch.compile", tc_setup, lambda s: s[0](s[1]), _nograd(torch),
                                    result=lambda s: [s[0](s[1]).numpy()]))
    res = measure_variants(variants, **opts)
    ratios = [("nnc.compile", "hand-fused numba"), ("nnc.compile", "hand-fused numba + np.empty"),
              ("nnc.compile", "torch eager"), ("nnc.compile", "torch.compile"), ("hand-fused numba", "torch eager")]
    r = _ratio(res, "nnc.compile", "hand-fused numba")
    targets = [Target("compiled <= 1.25x hand-fused numba", _x(r), None if r is None else r <= 1.25)]
    return variants, res, ratios, targets, "torch eager"


def _membound_case(shape):
    def case(opts, args):
        return _membound(shape, opts)
    return case


def _membound(shape, opts):
    x, w, b, _ = _data(shape, seed=2)
    variants = []

    def nnc_setup(skew=None):
        data = runtime.tensor(x) if skew is None else runtime.from_numpy(_aligned_copy(x, skew))
        return nnc.compile(_mem_module(runtime, w, b)), data
    variants.append(Variant("nnc.compile", nnc_setup, lambda s: s[0](s[1]), _nograd(runtime),
                            result=lambda s: [s[0](s[1]).numpy()], compiled=lambda s: s[0]))
    variants.append(Variant("nnc.compile (x 16 B off)", lambda: nnc_setup(skew=16), lambda s: s[0](s[1]),
                            _nograd(runtime), note="diagnostic: x 16 bytes after a cache line, as numpy allocates"))
    x = _aligned_copy(x)  # the baselines' arrays start on a cache line, as runtime.tensor's copy does
    flat = x.reshape(-1)
    variants.append(Variant("numba copy (bandwidth)", lambda: (flat, _aligned_copy(flat)),
                            lambda s: copy_kernel(*s), note="out[i] = x[i] prange, preallocated out"))
    variants.append(Variant("numba copy + np.empty", lambda: (flat,),
                            lambda s: copy_kernel(s[0], np.empty_like(s[0])),
                            note="the same copy into a fresh array per call (page faults included)"))
    variants.append(Variant("numba scale", lambda: (flat, _aligned_copy(flat)), lambda s: scale_kernel(*s),
                            note="out[i] = x[i] * 2 prange, preallocated out: a computed store (no memcpy)"))
    variants.append(Variant("hand-fused numba", lambda: (x, w, b, _aligned_copy(x)),
                            lambda s: mem_fwd_kernel(*s), result=lambda s: [(mem_fwd_kernel(*s), s[3])[1].copy()],
                            note="preallocated output"))
    if torch is not None:
        variants.append(Variant("torch eager", lambda: (_mem_module(torch, w, b), torch.from_numpy(x)),
                                lambda s: s[0](s[1]), _nograd(torch), result=lambda s: [s[0](s[1]).numpy()]))
    res = measure_variants(variants, **opts)
    ratios = [("nnc.compile", "numba copy (bandwidth)"), ("nnc.compile", "numba copy + np.empty"),
              ("nnc.compile", "numba scale"), ("nnc.compile", "hand-fused numba"), ("nnc.compile", "torch eager"),
              ("nnc.compile", "nnc.compile (x 16 B off)")]
    r = _ratio(res, "numba copy (bandwidth)", "nnc.compile")  # achieved fraction of the copy's speed
    extra = ""
    if res["numba copy (bandwidth)"].ok:
        gbs = 2 * x.nbytes / res["numba copy (bandwidth)"].median / 1e9
        extra = f" (copy moves {2 * x.nbytes / 2**20:.0f} MiB at {gbs:.1f} GB/s)"
    targets = [Target(f"compiled >= 85% of the copy bandwidth at {x.size} elements" + extra,
                      "-" if r is None else f"{r * 100:.0f}%", None if r is None else r >= 0.85)]
    return variants, res, ratios, targets, "torch eager"


def case_chain_fwd_bwd(opts, args):
    x, w, b, gy = _data(CHAIN_SHAPE)
    variants = []

    def lib_setup(lib, compile_fn):
        def setup():
            model = compile_fn(_chain_module(lib, w, b))
            xt = lib.tensor(x).requires_grad_() if lib is runtime else torch.from_numpy(x.copy()).requires_grad_()
            gyt = lib.tensor(gy) if lib is runtime else torch.from_numpy(gy)
            params = [xt] + list(model.parameters())
            return model, xt, gyt, params
        return setup

    def fwd_bwd(s):
        model, xt, gyt, params = s
        _grads_to_none(params)
        model(xt).backward(gyt)

    def grads(s):
        fwd_bwd(s)
        return [p.grad.numpy() for p in s[3]]

    variants.append(Variant("nnc.compile", lib_setup(runtime, nnc.compile), fwd_bwd, result=grads,
                            compiled=lambda s: s[0]))
    chunks = 4 * numba.get_num_threads()

    def hand_setup():
        return (x, w, b, gy, np.empty_like(x), np.empty_like(x), np.empty((chunks, x.shape[1]), np.float32),
                np.empty((chunks, x.shape[1]), np.float32))

    def hand_step(s):
        x_, w_, b_, gy_, out, gx, gwp, gbp = s
        chain_fwd_kernel(x_, w_, b_, out)
        chain_bwd_kernel(x_, w_, b_, gy_, gx, gwp, gbp)
        return gx, gwp.sum(0), gbp.sum(0)

    variants.append(Variant("hand-fused numba", hand_setup, hand_step, result=lambda s: list(hand_step(s)),
                            note=f"forward kernel + backward kernel (recomputes from x), preallocated outputs, "
                                 f"{chunks} row chunks for the column sums"))
    variants.append(Variant("hand-fused numba (forward only)", lambda: hand_setup()[:3] + (np.empty_like(x),),
                            lambda s: chain_fwd_kernel(*s)))
    if torch is not None:
        variants.append(Variant("torch eager", lib_setup(torch, lambda m: m), fwd_bwd, result=grads))
        if args.torch_compile:
            variants.append(Variant("torch.compile", lib_setup(torch, torch.compile), fwd_bwd, result=grads))
    res = measure_variants(variants, **opts)
    ratios = [("nnc.compile", "hand-fused numba"), ("nnc.compile", "torch eager"), ("nnc.compile", "torch.compile"),
              ("hand-fused numba", "torch eager")]
    r = _ratio(res, "torch.compile", "nnc.compile")  # speedup over torch.compile
    targets = [Target("compiled >= 2.5x faster than torch.compile",
                      "-" if r is None else f"{r:.2f}x faster",
                      None if r is None else r >= 2.5)]
    if r is None and not args.torch_compile:
        targets[0].measured = "needs --torch-compile"
    return variants, res, ratios, targets, "torch eager"


def _mlp_train_setup(lib, batch, compiled):
    def setup():
        model = _mlp(lib)
        run = nnc.compile(model) if compiled else model
        opt = lib.optim.SGD(run.parameters(), lr=LR, momentum=MOMENTUM)
        xb, yb = _batch(lib, batch)
        return run, opt, lib.nn.CrossEntropyLoss(), xb, yb
    return setup


class _WithLoss(runtime.nn.Module):
    """The MLP and its CrossEntropyLoss as one module, so that nnc compiles the loss and its backward too."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.loss = runtime.nn.CrossEntropyLoss()

    def forward(self, x, y):
        return self.loss(self.model(x), y)


def _mlp_train_with_loss_setup(batch):
    def setup():
        model = _mlp(runtime)
        opt = runtime.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        xb, yb = _batch(runtime, batch)
        return nnc.compile(_WithLoss(model)), opt, xb, yb
    return setup


def _train_step_with_loss(state):
    """zero_grad, compiled forward+loss, compiled backward, optimizer step."""
    run, opt, xb, yb = state
    opt.zero_grad()
    run(xb, yb).backward()
    opt.step()


def _mlp_case(batch):
    def case(opts, args):
        variants = [Variant("nnc.compile", _mlp_train_setup(runtime, batch, True), train_step,
                            compiled=lambda s: s[0], note="model compiled; loss and SGD step eager runtime"),
                    Variant("nnc.compile (model+loss)", _mlp_train_with_loss_setup(batch), _train_step_with_loss,
                            compiled=lambda s: s[0], note="diagnostic: the loss compiled too; SGD step eager"),
                    Variant("runtime eager", _mlp_train_setup(runtime, batch, False), train_step)]
        if torch is not None:
            variants.append(Variant("torch eager", _mlp_train_setup(torch, batch, False), train_step))
        res = measure_variants(variants, **opts)
        ratios = [("nnc.compile", "torch eager"), ("nnc.compile (model+loss)", "torch eager"),
                  ("nnc.compile", "runtime eager"), ("runtime eager", "torch eager")]
        r = _ratio(res, "nnc.compile", "torch eager")
        targets = [Target(f"compiled <= 1.0x torch eager (batch {batch})", _x(r), None if r is None else r <= 1.0)]
        return variants, res, ratios, targets, "torch eager"
    return case


def _mlp_infer_setup(lib, compiled, whole_graph=None, skew=None):
    def setup():
        model = _mlp(lib) if skew is None else _skewed_parameters(_mlp(lib), skew)
        model.eval()
        run = nnc.compile(model, whole_graph=whole_graph) if compiled else model
        xb, _ = _batch(lib, 1)
        return run, xb
    return setup


def _onnxruntime_setup(batch=1, threads=None):
    """The torch MLP exported to ONNX (torch.onnx.export, dynamo=False) in an onnxruntime session with this run's
    thread count (or `threads`); raises ImportError when torch, onnx or onnxruntime is missing (the variant then
    reports it)."""
    def setup():
        import onnxruntime as ort

        if torch is None:
            raise ImportError("torch is needed to export the model to ONNX")
        model = _mlp(torch)
        model.eval()
        x, _ = _batch(torch, batch)
        path = os.path.join(tempfile.mkdtemp(prefix="nnc_bench_onnx_"), "mlp.onnx")
        with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(model, (x,), path, input_names=["x"], dynamo=False)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or numba.get_num_threads()
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        return session, {"x": x.numpy()}
    return setup


def _onnxruntime_step(state):
    session, feed = state
    session.run(None, feed)


@contextlib.contextmanager
def _no_helper(lib):
    """no_grad, with nnc.codegen.nowait's helper thread left out (every batch-1 product serial on the caller)."""
    from nnc.codegen import nowait

    before = nowait.MAILBOX[nowait._RUNNING]
    nowait.MAILBOX[nowait._RUNNING] = 0
    try:
        with lib.no_grad():
            yield
    finally:
        nowait.MAILBOX[nowait._RUNNING] = before


def _helper_note(variants, before):
    """The nnc.compile variant with a note saying how many chunks of its products the helper thread computed."""
    from nnc.codegen import nowait

    now = nowait.counts()
    jobs, chunks = now["jobs"] - before["jobs"], now["chunks"] - before["chunks"]
    helped, stolen = now["helped"] - before["helped"], now["stolen"] - before["stolen"]
    note = (f"helper thread computed {helped / chunks:.0%} of {chunks} chunks ({jobs} products; the caller stole "
            f"{stolen})" if chunks else "the helper thread took no product")
    return [dataclasses.replace(v, note=note) if v.label == "nnc.compile" else v for v in variants]


def _mlp_infer_variants():
    variants = [Variant("nnc.compile", _mlp_infer_setup(runtime, True), infer_step, _nograd(runtime),
                        compiled=lambda s: s[0]),
                Variant("nnc.compile (no helper)", _mlp_infer_setup(runtime, True), infer_step,
                        lambda: _no_helper(runtime), compiled=lambda s: s[0],
                        note="diagnostic: nnc.codegen.nowait's helper thread left out (products serial)"),
                Variant("kernel by kernel", _mlp_infer_setup(runtime, True, whole_graph=False), infer_step,
                        _nograd(runtime), compiled=lambda s: s[0]),
                Variant("nnc.compile (weights 16 B off)", _mlp_infer_setup(runtime, True, skew=16), infer_step,
                        _nograd(runtime), note="diagnostic: parameters 16 bytes after a cache line, as numpy "
                                               "allocates"),
                Variant("runtime eager", _mlp_infer_setup(runtime, False), infer_step, _nograd(runtime)),
                Variant("onnxruntime", _onnxruntime_setup(), _onnxruntime_step,
                        note="torch.onnx.export(dynamo=False); same thread count"),
                Variant("onnxruntime 1 thread", _onnxruntime_setup(threads=1), _onnxruntime_step,
                        note="the same session on one thread (nnc runs these small matmuls serially)")]
    if torch is not None:
        variants.append(Variant("torch eager", _mlp_infer_setup(torch, False), infer_step, _nograd(torch)))
    return variants


def case_mlp_infer_b1(opts, args):
    from nnc.codegen import nowait

    variants = _mlp_infer_variants()
    before = nowait.counts()
    res = measure_variants(variants, **opts)
    variants = _helper_note(variants, before)
    ratios = [("nnc.compile", "torch eager"), ("nnc.compile", "onnxruntime"), ("nnc.compile", "onnxruntime 1 thread"),
              ("nnc.compile", "nnc.compile (no helper)"),
              ("nnc.compile", "kernel by kernel"), ("nnc.compile", "nnc.compile (weights 16 B off)"),
              ("nnc.compile", "runtime eager")]
    m = res["nnc.compile"]
    r = _ratio(res, "nnc.compile", "onnxruntime")
    targets = [Target("compiled <= 45 us per batch-1 forward", _fmt(m.median).strip() if m.ok else "-",
                      m.median <= 45e-6 if m.ok else None),
               Target("compiled <= onnxruntime (batch 1)", _x(r), None if r is None else r <= 1.0)]
    return variants, res, ratios, targets, "torch eager"


@contextlib.contextmanager
def _busy_neighbours(count):
    """`count` CPU-bound processes (pure-Python spin loops) running beside the measurement, killed afterwards."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)  # let the scheduler see them as CPU-bound
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _quiet_then_loaded(variants, opts, loads):
    """Measure the variants quiet, then beside each count of busy neighbours in `loads` ((count, suffix) pairs):
    (rows shown, results by row label, (loaded, quiet) label pairs). Rows beside neighbours are labelled
    "<label> (<suffix>)"; the nnc.compile row notes the helper thread's share of the chunks."""
    from nnc.codegen import nowait

    quiet = measure_variants(variants, **opts)
    res = {f"{v.label} (quiet)": quiet[v.label] for v in variants}
    shown = [dataclasses.replace(v, label=f"{v.label} (quiet)", note="no neighbours") for v in variants]
    pairs = []
    for neighbours, suffix in loads:
        with _busy_neighbours(neighbours):
            before = nowait.counts()
            loaded = measure_variants(variants, **opts)
            noted = _helper_note(variants, before)
        for v in noted:
            label = f"{v.label} ({suffix})"
            shown.append(dataclasses.replace(v, label=label))
            res[label] = loaded[v.label]
            pairs.append((label, f"{v.label} (quiet)"))
    return shown, res, pairs


def _beside_target(res, label, what):
    r = _ratio(res, f"{label} (1 neighbour)", f"{label} (quiet)")
    return Target(f"{what} beside a CPU-bound neighbour <= 2x its quiet time", _x(r), None if r is None else r <= 2.0)


def case_mlp_infer_b1_loaded(opts, args):
    """Batch-1 inference quiet, beside one spinning process, then beside one per core: the loaded/quiet ratios."""
    cores = os.cpu_count() or 1
    shown, res, ratios = _quiet_then_loaded(_mlp_infer_variants(), opts,
                                            ((1, "1 neighbour"), (cores, f"{cores} neighbours")))
    return shown, res, ratios, [_beside_target(res, "nnc.compile", "compiled")], "torch eager"


def case_models_infer_b1_loaded(opts, args):
    """The GPT's and the CNN's batch-1 inference (cases 8b, 7b) quiet, then beside one spinning process."""
    variants = []
    for name, build_setup in (("GPT", lambda lib, c: _gpt_setup(lib, c, train=False, batch=1)),
                              ("CNN", _cnn_infer_setup)):
        variants.append(Variant(f"{name} nnc.compile", build_setup(runtime, True), _gpt_infer_step,
                                compiled=lambda s: s[0]))
        if torch is not None:
            variants.append(Variant(f"{name} torch eager", build_setup(torch, False), _gpt_infer_step))
    shown, res, ratios = _quiet_then_loaded(variants, opts, ((1, "1 neighbour"),))
    targets = [_beside_target(res, f"{name} nnc.compile", f"{name} batch-1 compiled") for name in ("GPT", "CNN")]
    return shown, res, ratios, targets, "torch eager"


def _mnist_cnn(lib, dropout=True):
    """pytorch/examples' MNIST CNN with its loss: conv 1->32->64 (3x3), relu, max-pool 2, dropout, two linears,
    log_softmax + nll_loss, as one module (so nnc compiles the loss and its backward too)."""
    nn, F = lib.nn, lib.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
            self.dropout1, self.dropout2 = nn.Dropout(0.25 if dropout else 0.0), nn.Dropout(0.5 if dropout else 0.0)
            self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

        def forward(self, x, y):
            x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
            x = self.dropout2(F.relu(self.fc1(lib.flatten(self.dropout1(x), 1))))
            return F.nll_loss(F.log_softmax(self.fc2(x), dim=1), y)
    return Net()


def _wrapped(model, compiled):
    """The model run eagerly (compiled False), by nnc.compile (True), or by the compiler given (torch.compile)."""
    if compiled is True:
        return nnc.compile(model)
    return compiled(model) if compiled else model


def _cnn_train_setup(lib, compiled, dropout=True, batch=64):
    def setup():
        model = _mnist_cnn(lib, dropout)
        run = _wrapped(model, compiled)
        opt = lib.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        rng = np.random.default_rng(0)
        xb = lib.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32))
        yb = lib.tensor(rng.integers(0, 10, batch))
        return run, opt, xb, yb
    return setup


@contextlib.contextmanager
def _numba_serial():
    """numba's parallel kernels run on one thread inside (numba.set_num_threads(1))."""
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def case_cnn_train(opts, args):
    variants = [Variant("nnc.compile", _cnn_train_setup(runtime, True), _train_step_with_loss, compiled=lambda s: s[0],
                        note="model+loss compiled; dropout masks drawn in the kernels (Philox)"),
                Variant("nnc.compile (no dropout)", _cnn_train_setup(runtime, True, False), _train_step_with_loss,
                        compiled=lambda s: s[0], note="diagnostic: p=0 dropout (no random draws)"),
                Variant("nnc.compile (1 thread)", _cnn_train_setup(runtime, True), _train_step_with_loss,
                        ctx=_numba_serial, compiled=lambda s: s[0],
                        note="diagnostic: numba set to 1 thread, so kernels and products (OpenBLAS on one thread "
                             "under nnc's one pool) all run on one"),
                Variant("runtime eager", _cnn_train_setup(runtime, False), _train_step_with_loss)]
    if torch is not None:
        variants.append(Variant("torch eager", _cnn_train_setup(torch, False), _train_step_with_loss))
        variants.append(Variant("torch eager (no dropout)", _cnn_train_setup(torch, False, False),
                                _train_step_with_loss))
        if args.torch_compile:
            variants.append(Variant("torch.compile", _cnn_train_setup(torch, torch.compile), _train_step_with_loss))
    res = measure_variants(variants, **opts)
    ratios = [("nnc.compile", "torch eager"), ("nnc.compile (no dropout)", "torch eager (no dropout)"),
              ("nnc.compile", "nnc.compile (1 thread)"), ("nnc.compile", "torch.compile"),
              ("nnc.compile", "runtime eager"), ("runtime eager", "torch eager")]
    r = _ratio(res, "nnc.compile", "torch eager")
    targets = [Target("CNN training step compiled <= 0.8x torch eager", _x(r), None if r is None else r <= 0.8)]
    return variants, res, ratios, targets, "torch eager"


def _gpt(lib, dropout=0.1, n_layer=2, n_head=2, n_embd=64, block=64, vocab=65):
    """A nanoGPT-shaped model written once for runtime and torch: causal self-attention blocks (pre-LayerNorm,
    GELU MLP), tied embeddings, size asserts; forward(idx, targets) returns the cross-entropy loss, or the last
    position's logits without targets."""
    nn, F = lib.nn, lib.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
            self.fc, self.out = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)
            self.drop = nn.Dropout(dropout)
            self.register_buffer("mask", lib.tril(lib.ones(block, block)).view(1, 1, block, block))

        def forward(self, x):
            b, t, c = x.size()
            q, k, v = self.qkv(self.ln1(x)).split(n_embd, dim=2)
            q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = self.drop(att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(-1))
            x = x + self.drop(self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, c)))
            return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
            self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
            self.ln_f, self.head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab, bias=False)
            self.head.weight = self.wte.weight
            self.drop = nn.Dropout(dropout)

        def forward(self, idx, targets=None):
            b, t = idx.size()
            assert t <= block
            x = self.drop(self.wte(idx) + self.wpe(lib.arange(0, t, dtype=lib.long)))
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.ln_f(x))
            if targets is None:
                return logits[:, -1, :]
            return F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
    return GPT()


def _gpt_setup(lib, compiled, train=True, batch=8, length=64):
    def setup():
        lib.manual_seed(0)
        model = _gpt(lib, dropout=0.1 if train else 0.0)
        if not train:
            model.eval()
        run = nnc.compile(model) if compiled else model
        opt = lib.optim.AdamW(model.parameters(), lr=1e-3)
        rng = np.random.default_rng(0)
        idx = lib.tensor(rng.integers(0, 65, (batch, length)))
        targets = lib.tensor(rng.integers(0, 65, (batch, length)))
        return (run, opt, idx, targets) if train else (run, idx)
    return setup


def _gpt_infer_step(state):
    run, x = state
    with (torch if _is_torch(run) else runtime).no_grad():
        return run(x)


def _is_torch(module) -> bool:
    return torch is not None and isinstance(module, torch.nn.Module)


def _training_case(build_setup, note, target=None):
    """A training-step case (the model's forward with its loss, backward, and optimizer step), compiled vs runtime
    eager vs torch eager; `target` names the case in its <= 0.8x torch eager target, None for no target."""
    def case(opts, args):
        variants = [Variant("nnc.compile", build_setup(runtime, True), _train_step_with_loss,
                            compiled=lambda s: s[0], note=note),
                    Variant("runtime eager", build_setup(runtime, False), _train_step_with_loss)]
        if torch is not None:
            variants.append(Variant("torch eager", build_setup(torch, False), _train_step_with_loss))
        res = measure_variants(variants, **opts)
        ratios = [("nnc.compile", "torch eager"), ("nnc.compile", "runtime eager"), ("runtime eager", "torch eager")]
        r = _ratio(res, "nnc.compile", "torch eager")
        targets = [] if target is None else [Target(f"{target} training step compiled <= 0.8x torch eager", _x(r),
                                                    None if r is None else r <= 0.8)]
        return variants, res, ratios, targets, "torch eager"
    return case


def _llama_setup(lib, compiled, batch=8, length=64, vocab=256):
    def setup():
        from llama import make_llama  # examples/llama.py

        lib.manual_seed(0)
        model = make_llama(lib, vocab=vocab, dim=64, heads=4, layers=2, max_len=length)
        run = nnc.compile(model) if compiled else model
        opt = lib.optim.AdamW(model.parameters(), lr=1e-3)
        rng = np.random.default_rng(0)
        return run, opt, lib.tensor(rng.integers(0, vocab, (batch, length))), \
            lib.tensor(rng.integers(0, vocab, (batch, length)))
    return setup


def _infer_case(build_setup, label, torch_compile=False):
    """A batch-1 inference case; with torch_compile, build_setup(torch, torch.compile) is a --torch-compile row."""
    def case(opts, args):
        variants = [Variant("nnc.compile", build_setup(runtime, True), _gpt_infer_step, compiled=lambda s: s[0]),
                    Variant("runtime eager", build_setup(runtime, False), _gpt_infer_step)]
        if torch is not None:
            variants.append(Variant("torch eager", build_setup(torch, False), _gpt_infer_step))
            if torch_compile and args.torch_compile:
                variants.append(Variant("torch.compile", build_setup(torch, torch.compile), _gpt_infer_step))
        res = measure_variants(variants, **opts)
        ratios = [("nnc.compile", "torch eager"), ("nnc.compile", "torch.compile"), ("nnc.compile", "runtime eager")]
        r = _ratio(res, "nnc.compile", "torch eager")
        targets = [Target(f"{label} batch-1 inference compiled <= 0.5x torch eager", _x(r),
                          None if r is None else r <= 0.5)]
        return variants, res, ratios, targets, "torch eager"
    return case


def _cnn_infer_setup(lib, compiled):
    def setup():
        lib.manual_seed(0)
        model = _mnist_cnn(lib, dropout=False)
        model.eval()
        body = _Logits(lib, model)
        run = _wrapped(body, compiled)
        x = lib.tensor(np.random.default_rng(0).standard_normal((1, 1, 28, 28)).astype(np.float32))
        return run, x
    return setup


def _Logits(lib, net):
    """The MNIST CNN's log-probabilities for an input (its forward without the loss)."""
    F = lib.nn.functional

    class Logits(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            n = self.net
            x = F.max_pool2d(F.relu(n.conv2(F.relu(n.conv1(x)))), 2)
            return F.log_softmax(n.fc2(F.relu(n.fc1(lib.flatten(x, 1)))), dim=1)
    return Logits()


# The child process of case 6: imports only runtime and nnc (no torch), compiles the MLP's forward+backward.
_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
import numpy as np
import numba  # imported by nnc on first use; its import is not compile time (the table says so)
import runtime
import nnc
import_s = time.perf_counter() - t0
batch = int(sys.argv[2])
sizes = (784, 512, 512, 10)
layers = []
for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
    if i:
        layers.append(runtime.nn.ReLU())
    layers.append(runtime.nn.Linear(a, b))
model = runtime.nn.Sequential(*layers)
rng = np.random.default_rng(1)
x = runtime.tensor(rng.standard_normal((batch, 784)).astype(np.float32))
y = runtime.tensor(rng.integers(0, 10, batch).astype(np.int64))
loss_fn = runtime.nn.CrossEntropyLoss()
def step(m):
    for p in m.parameters():
        p.grad = None
    loss_fn(m(x), y).backward()
step(model)  # eager warm-up: one-time costs of eager runtime are not compile time
cm = nnc.compile(model)
t = time.perf_counter()
step(cm)
first_s = time.perf_counter() - t
warm = []
for _ in range(5):
    t = time.perf_counter()
    step(cm)
    warm.append(time.perf_counter() - t)
arts = [a for a in cm._cache.values() if hasattr(a, "plans")]
print(json.dumps({
    "import_s": import_s, "first_call_s": first_s, "warm_call_s": min(warm),
    "artifact_compile_s": sum(a.compile_seconds for a in arts),
    "plan_compile_s": sum(p.compile_seconds for a in arts for p in a.plans),
    "kernels": sum(len(p.kernels) for a in arts for p in a.plans),
    "generated": sum(hasattr(s, "compiled") for a in arts for p in a.plans for s in p.steps),
    "cache_hits": sum(p.cache_hits for a in arts for p in a.plans),
    "training_plan": all(a.training_plan is not None for a in arts),
}))
"""


def _child_run(cache_dir, batch=128, timeout=600):
    env = dict(os.environ, NNC_CACHE_DIR=cache_dir)
    proc = subprocess.run([sys.executable, "-c", _CHILD, _ROOT, str(batch)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_compile_time(args):
    """Case 6: returns the targets (its table is printed as it runs)."""
    targets = []
    with tempfile.TemporaryDirectory(prefix="nnc_bench_cache_") as d:
        try:
            cold = _child_run(d)
            warm = _child_run(d)
        except Exception as e:  # noqa: BLE001
            print(f"  compile_time: {type(e).__name__}: {e}")
            return [Target("cold compile < 3 s", "error", None), Target("from the disk cache < 0.5 s", "error", None)]
    print(f"  {'run':<22} {'compile (first call - warm call)':>32} {'Artifact.compile_seconds':>25} "
          f"{'first call':>11} {'warm call':>10} {'import':>8} {'kernels':>8} {'cache hits':>10}")
    for label, r in (("cold (fresh cache dir)", cold), ("from the disk cache", warm)):
        r["compile_s"] = r["first_call_s"] - r["warm_call_s"]
        print(f"  {label:<22} {r['compile_s']:>30.3f} s {r['artifact_compile_s']:>23.3f} s "
              f"{r['first_call_s']:>9.3f} s {_fmt(r['warm_call_s']):>10} {r['import_s']:>6.2f} s "
              f"{r['generated']:>3}/{r['kernels']:<4} {r['cache_hits']:>10}")
    if not cold["training_plan"]:
        print("  note: no compiled training plan (the backward ran through eager autograd)")
    print("  (compile = wall time of the first forward+backward call minus a warm one: tracing, passes, code "
          "generation, numba compile or cache load, first launches; import of runtime+nnc+numba not included)")
    targets.append(Target("cold compile of MLP fwd+bwd < 3 s", f"{cold['compile_s']:.2f} s", cold["compile_s"] < 3.0))
    targets.append(Target("compile from the disk cache (new process) < 0.5 s", f"{warm['compile_s']:.2f} s",
                          warm["compile_s"] < 0.5))
    return targets


CASES = {
    "chain_fwd": ("1", "gelu_tanh(x*w+b)*sigmoid(x)+0.5*x, no_grad forward", "[4096,1024]", case_chain_fwd),
    "membound": ("2", "relu(x*w+b)+0.5*x, no_grad forward", "[16384,1024]", _membound_case(MEM_SHAPE)),
    "membound_2e22": ("2b", "relu(x*w+b)+0.5*x, no_grad forward", "[4096,1024]", _membound_case((4096, 1024))),
    "chain_fwd_bwd": ("3", "chain forward+backward (grads of x, w, b)", "[4096,1024]", case_chain_fwd_bwd),
    "mlp_train_b128": ("4a", "MLP 784-512-512-10 SGD step: zero_grad+fwd+CE+bwd+step", "[128,784]", _mlp_case(128)),
    "mlp_train_b8": ("4b", "MLP 784-512-512-10 SGD step: zero_grad+fwd+CE+bwd+step", "[8,784]", _mlp_case(8)),
    "mlp_infer_b1": ("5", "MLP 784-512-512-10 no_grad forward", "[1,784]", case_mlp_infer_b1),
    "mlp_infer_b1_loaded": ("5b", "case 5 quiet, beside one CPU-bound process, then one per core", "[1,784]",
                            case_mlp_infer_b1_loaded),
    "cnn_train_b64": ("7", "MNIST CNN (conv 1-32-64, max-pool, dropout, 2 linears) SGD step", "[64,1,28,28]",
                      case_cnn_train),
    "compile_time": ("6", "MLP fwd+bwd compile time, cold and from the disk cache (subprocesses)", "[128,784]",
                     None),
    "gpt_train_b8": ("8a", "GPT (2 layers, 2 heads, n_embd 64, block 64, dropout 0.1) AdamW step", "[8,64]",
                     _training_case(_gpt_setup, "dropout 0.1 drawn in the kernels: one graph, forward and backward",
                                    "GPT")),
    "llama_train_b8": ("9", "LLaMA (2 layers, 4 heads, dim 64, complex RoPE) AdamW step", "[8,64]",
                       _training_case(_llama_setup, "complex rotary products in numpy, the rest in kernels")),
    "gpt_infer_b1": ("8b", "the GPT's no_grad forward, last position's logits", "[1,64]",
                     _infer_case(lambda lib, c: _gpt_setup(lib, c, train=False, batch=1), "GPT")),
    "cnn_infer_b1": ("7b", "the MNIST CNN's no_grad forward", "[1,1,28,28]",
                     _infer_case(_cnn_infer_setup, "CNN", torch_compile=True)),
    "models_infer_b1_loaded": ("5c", "cases 8b and 7b quiet, then beside one CPU-bound process", "[1,64] [1,1,28,28]",
                               case_models_infer_b1_loaded),
}


def _ratio(res, a, b, stat="median"):
    ma, mb = res.get(a), res.get(b)
    if ma is None or mb is None or not ma.ok or not mb.ok:
        return None
    return getattr(ma, stat) / getattr(mb, stat)


def _x(r):
    return "-" if r is None else f"{r:.2f}x"


def _verdict(met):
    return "n/a" if met is None else ("met" if met else "NOT met")


def _print_case(variants, res, ratios, reference, args):
    width = max(len(v.label) for v in variants)
    ref = res.get(reference)
    print(f"  {'variant':<{width}} {'median':>10} {'min':>10} {'spread':>7} {'vs ' + reference:>16}  note")
    for v in variants:
        m = res[v.label]
        if not m.ok:
            print(f"  {v.label:<{width}} {'error':>10}          {m.error[:200]}")
            continue
        vs = f"{m.median / ref.median:.2f}x" if ref is not None and ref.ok else "-"
        print(f"  {v.label:<{width}} {_fmt(m.median)} {_fmt(m.low)} {m.spread():>7} {vs:>16}  {v.note}")
    parts = [f"{a} / {b} = {_x(_ratio(res, a, b))} ({_x(_ratio(res, a, b, 'low'))})" for a, b in ratios
             if _ratio(res, a, b) is not None]
    if parts:
        print("  ratios of medians (of minimums): " + "; ".join(parts))
    # correctness sanity check (once, after timing): every variant with a result against the reference
    want = None
    with contextlib.suppress(Exception):
        rv = next(v for v in variants if v.label == reference)
        if rv.result is not None and res[reference].ok:
            with rv.ctx():
                want = rv.result(res[reference].state)
    if want is not None:
        devs = []
        for v in variants:
            m = res[v.label]
            if v.result is None or v.label == reference or not m.ok:
                continue
            try:
                with v.ctx():
                    got = v.result(m.state)
                devs.append(f"{v.label} {max(_max_dev(g, w_) for g, w_ in zip(got, want)):.1e}")
            except Exception as e:  # noqa: BLE001
                devs.append(f"{v.label} raised {type(e).__name__}: {e}")
        if devs:
            print(f"  max rel deviation from {reference} (outputs/grads): " + "; ".join(devs))
    if args.steps:
        for v in variants:
            m = res[v.label]
            if v.compiled is None or not m.ok:
                continue
            calls = max(3, min(200, int(0.5 / max(m.median, 1e-6))))
            total, rows = step_profile(v, m.state, calls)
            print(f"  steps of {v.label} ({calls} calls, {_fmt(total).strip()} per call while timed step by step):")
            for label, s in rows:
                print(f"    {_fmt(s)} {s / total * 100:5.1f}%  {label}")


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short run (smoke test): ~20 ms x 3 repeats")
    p.add_argument("--cases", default=None, help="comma-separated subset of: " + ",".join(CASES))
    p.add_argument("--torch-compile", action="store_true",
                   help="also time torch.compile (cases 1, 3, 7 and 7b; compiling takes long on this machine)")
    p.add_argument("--threads", type=int, default=None,
                   help="thread count for numba, numpy's BLAS and torch (set before they load); default: all cores")
    p.add_argument("--openblas-coretype", default=None, metavar="NAME",
                   help="OPENBLAS_CORETYPE for numpy's OpenBLAS (set before it loads; overrides the environment's), "
                        "e.g. SkylakeX on an AVX-512 machine whose environment pins Haswell")
    p.add_argument("--steps", action="store_true",
                   help="per-step timing of every nnc.compile variant (kernels, interpreted steps, glue)")
    p.add_argument("--in-process", dest="isolate", action="store_false",
                   help="run every case in this process (default: each case in a fresh process of this script)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be at least 1")
    args.selected = selected_names(p, args.cases, list(CASES))
    return args


def _openblas_kernels() -> str:
    """The kernel family OpenBLAS picked for this CPU (threadpoolctl's 'architecture'), when threadpoolctl is here."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return ""
    arch = [i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"]
    coretype = os.environ.get("OPENBLAS_CORETYPE")
    return f"  OpenBLAS kernels: {', '.join(a for a in arch if a) or '?'}" + \
        (f" (OPENBLAS_CORETYPE={coretype})" if coretype else "")


def _loadavg():
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def _numba_line():
    copy_kernel(np.zeros(4, np.float32), np.empty(4, np.float32))  # starts numba's thread pool
    try:
        layer = numba.threading_layer()
    except Exception:  # noqa: BLE001
        layer = "?"
    return (f"numba {numba.__version__}: {numba.get_num_threads()} threads, threading layer {layer}; "
            f"NNC_CACHE_DIR={os.environ.get('NNC_CACHE_DIR', '(unset: ~/.cache/nnc/kernels)')}")


def _opts(args):
    if args.quick:
        return dict(target_s=0.02, repeats=3, warmup=3, settle_s=0.2, warm_s=0.5)
    return dict(target_s=0.25, repeats=9, warmup=20, settle_s=0.2, warm_s=2.0)


def main(argv=None):
    """Run the selected cases and print each case's table, its targets and a summary."""
    args = _parse(argv)
    if args.child:
        return _child_main(args)
    if args.threads is not None and torch is not None:
        torch.set_num_threads(args.threads)
    opts = _opts(args)
    for line in _header():
        print(line)
    print(_numba_line())
    print(_blas_line() + _openblas_kernels())
    print(f"load average at start: {_loadavg()} (other processes on a machine with few cores skew every figure; "
          f"the spread and min columns show it)")
    print(f"mode: {'quick' if args.quick else 'full'}  (~{opts['target_s'] * 1e3:.0f} ms per repeat, median of "
          f"{opts['repeats']}, up to {opts['warmup']} warm-up calls, variants alternate per repeat after a "
          f"{opts['settle_s']:.2f} s untimed pause); harness overhead "
          f"{harness_overhead(target_s=0.005, repeats=3) * 1e6:.3f} us/call is included in every figure; "
          f"torch.compile {'on' if args.torch_compile else 'off (--torch-compile)'}; "
          f"{'each case in a fresh process' if args.isolate else 'all cases in this process (--in-process)'}")
    if torch is None:
        print("note: torch is not importable; no torch baselines")
    print()
    summary = []
    for name in args.selected:
        number = CASES[name][0]
        targets = _run_case_isolated(name, args) if args.isolate else _run_case(name, args, opts)
        summary.extend((number, name, t) for t in targets)
    print("summary of targets:")
    for number, name, t in summary:
        print(f"  [{number:>2}] {name:<15} {_verdict(t.met):<8} {t.measured:<22} {t.text}")
    return 0


_MARK = "@@bench_compile targets@@ "


def _run_case(name, args, opts):
    """Run one case in this process, print its table and targets; returns its Targets."""
    number, what, shape, fn = CASES[name]
    print(f"[{number}] {name}: {what}  float32 {shape}", flush=True)
    t0 = time.perf_counter()
    if fn is None:
        targets = run_compile_time(args)
    else:
        variants, res, ratios, targets, reference = fn(opts, args)
        _print_case(variants, res, ratios, reference, args)
    for t in targets:
        print(f"  target: {t.text}: measured {t.measured} -> {_verdict(t.met)}")
    print(f"  (case took {time.perf_counter() - t0:.1f} s; load average now {_loadavg()})")
    print(flush=True)
    return targets


def _run_case_isolated(name, args):
    """Run one case in a fresh process of this script (its output streamed through); returns its Targets.

    NOTE: one process per case because the thread pools of numpy's OpenBLAS, numba and torch leave state behind
    on a machine with few cores: after a case with large multi-threaded GEMMs, the batch-8 training step of every
    library measured up to 2x slower in the same process (0.96 -> 1.66 ms for torch eager)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--cases", name]
    cmd += [flag for flag, on in (("--quick", args.quick), ("--torch-compile", args.torch_compile),
                                  ("--steps", args.steps)) if on]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    if args.openblas_coretype is not None:
        cmd += ["--openblas-coretype", args.openblas_coretype]
    targets = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=_ROOT) as proc:
        for line in proc.stdout:
            if line.startswith(_MARK):
                targets = [Target(**t) for t in json.loads(line[len(_MARK):])]
            else:
                print(line, end="", flush=True)
    if proc.returncode != 0:
        print(f"  case {name}: its process exited with status {proc.returncode}\n", flush=True)
        if not targets:
            targets = [Target(f"case {name}", "process failed", None)]
    return targets


def _child_main(args):
    """--child: run the selected cases in this process (no header) and report their targets to the parent."""
    if args.threads is not None and torch is not None:
        torch.set_num_threads(args.threads)
    opts = _opts(args)
    targets = []
    for name in args.selected:
        targets += _run_case(name, args, opts)
    print(_MARK + json.dumps([vars(t) for t in targets]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
