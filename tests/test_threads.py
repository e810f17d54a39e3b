"""A compiled module called from several threads at once gives each call eager's result, and no threading layer
can crash the process."""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import nnc
import runtime
from runtime import nn

from helpers import run_in_threads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model():
    runtime.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 16), nn.Softmax(-1))


def _hammer(call, inputs, expected, threads=4, calls=40) -> list:
    """Run `call` on the inputs from several threads; the (thread, call) pairs whose result was wrong."""
    wrong = []

    def work(k):
        for i in range(calls):
            j = (k + i) % len(inputs)
            if not np.allclose(call(inputs[j]), expected[j], rtol=1e-4, atol=1e-5):
                wrong.append((k, i))

    run_in_threads(work, threads)
    return wrong


def test_inference_from_threads_kernel_by_kernel():
    """Each thread has its own intermediate buffers (they were shared: 28-80 of 300 calls came out wrong)."""
    model = _model()
    compiled = nnc.compile(model, whole_graph=False)
    inputs = [runtime.randn(64, 32) for _ in range(6)]
    with runtime.no_grad():
        expected = [model(x).numpy().copy() for x in inputs]

        def call(x):
            with runtime.no_grad():
                return compiled(x).numpy()

        call(inputs[0])
        assert _hammer(call, inputs, expected) == []


def test_training_mode_forwards_from_threads():
    model = _model()
    compiled = nnc.compile(model)
    inputs = [runtime.randn(16, 32) for _ in range(6)]
    expected = [model(x).detach().numpy().copy() for x in inputs]

    def call(x):
        out = compiled(x)
        assert out.requires_grad
        return out.detach().numpy()

    call(inputs[0])
    assert _hammer(call, inputs, expected, calls=20) == []


def test_each_thread_reuses_only_its_own_dropped_outputs():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    compiled = nnc.compile(model, whole_graph=False)
    x = runtime.randn(4, 8)
    with runtime.no_grad():
        kept = compiled(x)
    seen = []

    def work():
        with runtime.no_grad():
            seen.append(compiled(x).numpy().__array_interface__["data"][0])

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen[0] != kept.numpy().__array_interface__["data"][0]  # the main thread still holds its output


def test_workqueue_threading_layer_does_not_abort_under_threads():
    """numba's workqueue layer (its fallback without TBB or OpenMP) aborts when two threads enter parallel
    regions at once; compiled kernels then take turns. Forced here with NUMBA_THREADING_LAYER."""
    script = textwrap.dedent("""
        import threading
        import numpy as np
        import nnc, runtime
        from runtime import nn
        from nnc.executor import threading_layer_is_threadsafe

        class Chain(nn.Module):
            def forward(self, x):
                return (x.tanh() * 2 + 1).sigmoid().sum(-1)

        compiled = nnc.compile(Chain(), whole_graph=False)
        x = runtime.randn(1024, 1024)
        with runtime.no_grad():
            want = Chain()(x).numpy().copy()
            compiled(x)
        (artifact,) = compiled._cache.values()
        assert any(getattr(s, "compiled", None) is not None and s.compiled.parallel
                   for s in artifact.forward_plan.steps)  # a parallel region, which workqueue cannot share
        assert not threading_layer_is_threadsafe()
        wrong = []
        def work():
            for _ in range(30):
                with runtime.no_grad():
                    if not np.allclose(compiled(x).numpy(), want, rtol=1e-4, atol=1e-3):
                        wrong.append(1)
        pool = [threading.Thread(target=work) for _ in range(6)]
        [t.start() for t in pool]
        [t.join() for t in pool]
        import numba
        print(numba.threading_layer(), len(wrong))
    """)
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue", NUMBA_NUM_THREADS="2")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["workqueue", "0"]


def test_two_threads_compiling_the_same_new_kernels_both_get_them(monkeypatch, tmp_path):
    """Two modules of one graph compiled at once from two threads, into an empty kernel cache: each plan runs every
    kernel compiled (numba refuses to compile a dispatcher another thread just disabled; nnc.codegen.cpu's
    COMPILE_LOCK makes the second thread find the first's overload instead of falling back to the interpreter)."""
    from nnc.codegen import cache

    monkeypatch.setenv("NNC_CACHE_DIR", str(tmp_path))
    cache.forget()
    scale = float(np.random.default_rng().integers(1, 10**6)) + 0.5  # new kernel sources: nothing compiled yet

    class Chain(nn.Module):
        def forward(self, x):
            return (runtime.tanh(x * scale) + x).sum(-1)

    compiled = [nnc.compile(Chain(), whole_graph=False) for _ in range(2)]
    x = runtime.randn(16, 8)
    start, results = threading.Barrier(2), {}

    def first_call(i):
        start.wait()
        with runtime.no_grad():
            results[i] = compiled[i](x).numpy()

    run_in_threads(first_call, 2)
    plans = [p for c in compiled for a in c._cache.values() for p in a.plans]
    assert plans and all(not p.fallbacks for p in plans), [p.fallbacks for p in plans]
    with runtime.no_grad():
        want = Chain()(x).numpy()
    for i in range(2):
        np.testing.assert_allclose(results[i], want, rtol=1e-5, atol=1e-5)


class _ByMode(nn.Module):
    """Doubles in training mode and triples in eval mode (the trace takes the branch: the flag is guarded)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        y = self.inner(x)
        return y * 2 if self.inner.training else y * 3


@pytest.mark.parametrize("final", [True, False])
def test_a_flag_switched_while_threads_call_is_seen_by_every_later_call(final):
    """The fast path re-reads training flags only when runtime's module-state version moves; switches racing with
    calls from other threads never leave a later call on the old mode."""
    runtime.manual_seed(0)
    model, x = _ByMode(), runtime.randn(3, 4)
    compiled = nnc.compile(model)
    with runtime.no_grad():
        base = model.inner(x).numpy()
        for mode in (True, False, True, False):  # both variants compiled and on the fast path
            model.inner.training = mode
            compiled(x), compiled(x)
        stop, odd, errors = threading.Event(), [], []

        def work(k):
            try:
                with runtime.no_grad():  # (grad mode is per thread)
                    while not stop.is_set():
                        out = compiled(x).numpy()
                        if not (np.allclose(out, 2 * base) or np.allclose(out, 3 * base)):
                            odd.append(k)
            except Exception as error:  # noqa: BLE001 - asserted below
                errors.append(error)

        workers = [threading.Thread(target=work, args=(k,)) for k in range(3)]
        for w in workers:
            w.start()
        for i in range(300):
            model.inner.training = bool(i % 2)
        model.inner.training = final
        stop.set()
        for w in workers:
            w.join()
        after = [compiled(x).numpy() for _ in range(3)]
    assert not errors and not odd
    for out in after:
        np.testing.assert_allclose(out, (2 if final else 3) * base, rtol=1e-6)


class _DropoutBlock(nn.Module):
    """A block whose decompose swaps runtime's random draws, its factories and Module's attribute reads."""

    def __init__(self):
        super().__init__()
        self.fc, self.drop, self.norm = nn.Linear(8, 8), nn.Dropout(0.5), nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(self.drop(self.fc(x)) + runtime.ones_like(x))


def _eager_calls(model, x) -> list:
    """The types of what runtime's draws, a like-factory and the model's eager forward return in this thread."""
    return [type(runtime.rand(4)), type(runtime.randn(2, 3)), type(runtime.ones_like(x)), type(model(x))]


def test_another_threads_eager_code_is_untouched_while_a_model_decomposes(monkeypatch):
    """While decompose runs, runtime's functions and Module.__getattr__ are stand-ins process-wide; another
    thread's calls reach the originals (they returned the compiling graph's MetaValues, or raised DecomposeError
    for runtime.rand). The other thread runs its calls in the middle of decompose, at its first replayed node."""
    from nnc import pipeline
    from nnc.passes import decompose

    model, x = _DropoutBlock(), runtime.randn(3, 8)
    seen, done = [], threading.Event()

    def other_thread():
        try:
            seen.extend(_eager_calls(model, x))
        except Exception as error:  # noqa: BLE001 - the assertion below reports it
            seen.append(error)
        done.set()

    replay_node = decompose._replay_node

    def replay_with_another_thread(*args):
        if not done.is_set():
            threading.Thread(target=other_thread).start()
            assert done.wait(60)
        return replay_node(*args)

    monkeypatch.setattr(decompose, "_replay_node", replay_with_another_thread)
    c = pipeline.Compilation(model, {}, {"x": x}, needs_grad=True)
    pipeline.run_stages(c, until="simplify_backward")
    assert seen == [runtime.Tensor] * 4
    assert _eager_calls(model, x) == [runtime.Tensor] * 4  # and every stand-in is gone afterwards


def test_threads_decomposing_at_once_each_build_their_own_graphs():
    """Each thread records into its own GraphBuilder (it was one class attribute for the process): graphs built
    from four threads at once equal the graphs built alone."""
    from nnc import pipeline

    def graphs(model, x) -> list:
        c = pipeline.Compilation(model, {}, {"x": x}, needs_grad=True)
        pipeline.run_stages(c, until="simplify_backward")
        return [gm.code for _, gm in pipeline.stage_graphs(c, "split") + pipeline.stage_graphs(c, "autodiff")]

    cases = [(_DropoutBlock(), runtime.randn(3, 8)), (_model(), runtime.randn(5, 32))]
    alone = [graphs(*case) for case in cases]
    found = {}

    def work(k):
        for i in range(4):
            found[k, i] = graphs(*cases[k % 2])

    run_in_threads(work, 4)
    assert all(found[k, i] == alone[k % 2] for k, i in found)
