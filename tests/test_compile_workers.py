"""Helper processes compile a compilation's new kernels into numba's disk cache; this process then loads them, and
compiles itself whatever a helper did not finish."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import nnc
import runtime
from nnc.codegen import cache, compile_workers
from nnc.codegen.cpu import compile_generated, generate
from nnc.graph import Graph
from nnc.kernel import Kernel
from nnc.passes import propagate_shapes
from nnc.prims import prims
from runtime import nn


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    directory = tmp_path / "kernels"
    monkeypatch.setenv(cache.ENV_VAR, str(directory))
    cache.forget()
    with compile_workers._lock:  # modules an earlier compilation in this process queued and never needed
        compile_workers._queue.clear()
        compile_workers._pending.clear()
    yield directory
    cache.forget()


def _kernel(cols: int) -> Kernel:
    """tanh(x * w + b) over [6, cols]: a different source for each cols."""
    g = Graph()
    x, w, b = (g.placeholder(n) for n in "xwb")
    t = g.call_function(prims["tanh"], (g.call_function(prims["add"], (g.call_function(prims["mul"], (x, w)), b)),))
    g.output(t)
    propagate_shapes(nnc.GraphModule(nn.Module(), g), runtime.zeros(6, cols), runtime.zeros(cols), runtime.zeros(cols))
    nodes = [n for n in g.nodes if n.op == "call_function"]
    return Kernel(f"k_{cols}", "elementwise", nodes, [x, w, b], [t], (6, cols))


def _index_files(directory: Path) -> set[str]:
    pycache = directory / "__pycache__"
    return {p.name for p in pycache.glob("*.nbi")} if pycache.exists() else set()


def _run(compiled, cols: int) -> np.ndarray:
    rng = np.random.default_rng(cols)
    x, w, b = rng.standard_normal((6, cols)), rng.standard_normal(cols), rng.standard_normal(cols)
    x, w, b = (a.astype(np.float32) for a in (x, w, b))
    got = compiled.run([x, w, b])[0]
    np.testing.assert_allclose(got, np.tanh(x * w + b), rtol=2e-6, atol=2e-6)
    return got


def test_helpers_compile_the_queued_modules_into_the_disk_cache(fresh_cache, monkeypatch):
    monkeypatch.setenv(compile_workers.ENV_VAR, "1")
    kernels = [_kernel(cols) for cols in range(10, 18)]
    generated = [generate(k) for k in kernels]
    queued = compile_workers.precompile(generated)
    assert queued == len(generated) - 1  # this process keeps the first
    with compile_workers._lock:  # None: the helper is done with it already
        events = [compile_workers._pending.get(cache.digest(g.source)) for g in generated[1:]]
    for event in events:  # left to the helper: wait for its answers, taking nothing from the queue
        assert event is None or event.wait(300)
    assert not compile_workers._pending  # a finished module is no longer waited for
    assert len(_index_files(fresh_cache)) >= queued  # the helper's modules are in numba's disk cache
    results = [compile_generated(k, g) for k, g in zip(kernels, generated)]
    assert [r.cache_hit for r in results] == [False] + [True] * queued
    for r, cols in zip(results, range(10, 18)):
        _run(r, cols)


def test_this_process_takes_the_queued_modules_no_helper_has_started(fresh_cache, monkeypatch):
    """Work splits by who gets there first: a module still queued when this process reaches it is compiled here."""
    monkeypatch.setenv(compile_workers.ENV_VAR, "1")
    monkeypatch.setattr(compile_workers, "_worker", lambda k: None)  # no helper takes anything
    kernels = [_kernel(cols) for cols in range(50, 56)]
    generated = [generate(k) for k in kernels]
    assert compile_workers.precompile(generated) == len(generated) - 1
    assert len(compile_workers._queue) == len(generated) - 1
    for k, g, cols in zip(kernels, generated, range(50, 56)):
        compile_workers.wait_for(g.source)  # returns at once: the module leaves the queue
        assert cache.digest(g.source) not in compile_workers._pending
        _run(compile_generated(k, g), cols)
    assert not compile_workers._queue and not compile_workers._pending


def test_kernels_already_compiled_are_not_sent(fresh_cache, monkeypatch):
    monkeypatch.setenv(compile_workers.ENV_VAR, "1")
    kernels = [_kernel(cols) for cols in range(20, 26)]
    generated = [generate(k) for k in kernels]
    for k, g in zip(kernels, generated):
        compile_generated(k, g)
    assert compile_workers.precompile(generated) == 0
    cache.forget()  # a new process would find them on disk
    assert compile_workers.precompile(generated) == 0


def test_no_helpers_when_turned_off_or_for_few_kernels(fresh_cache, monkeypatch):
    generated = [generate(_kernel(cols)) for cols in range(30, 36)]
    monkeypatch.setenv(compile_workers.ENV_VAR, "0")
    assert compile_workers.worker_count() == 0 and compile_workers.precompile(generated) == 0
    monkeypatch.setenv(compile_workers.ENV_VAR, "1")
    assert compile_workers.precompile(generated[:compile_workers.MIN_NEW_KERNELS - 1]) == 0


def test_a_helper_that_dies_leaves_its_kernels_to_this_process(fresh_cache, monkeypatch):
    monkeypatch.setenv(compile_workers.ENV_VAR, "1")
    worker = compile_workers._worker(0)
    worker.process.kill()
    worker.process.wait()
    kernels = [_kernel(cols) for cols in range(40, 46)]
    generated = [generate(k) for k in kernels]
    compile_workers._workers[0] = worker  # the dead helper is still registered: sending to it fails or is lost
    for g in generated:
        key = cache.digest(g.source)
        compile_workers._pending[key] = compile_workers.threading.Event()
        worker.jobs.add(key)
    worker._release_all()
    for k, g, cols in zip(kernels, generated, range(40, 46)):
        compile_workers.wait_for(g.source)  # returns: nothing is pending any more
        _run(compile_generated(k, g), cols)
    assert not compile_workers._pending


def test_a_model_compiled_with_helpers_matches_eager(fresh_cache, monkeypatch):
    monkeypatch.setenv(compile_workers.ENV_VAR, "1")
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 24), nn.GELU(), nn.LayerNorm(24),
                          nn.Linear(24, 5))
    x = runtime.randn(7, 12, dtype=runtime.float64)
    model = model.double()
    compiled = nnc.compile(model)
    out = compiled(x)
    out.sum().backward()
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    want = model(x)
    want.sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    for got, p in zip(grads, model.parameters()):
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=1e-12, atol=1e-12)
    plans = [p for c in compiled.compilations for p in c.plans]
    assert sum(p.cache_hits for p in plans) > 0  # some kernels came from the helper through the disk cache


def test_a_module_lock_makes_a_second_holder_wait(tmp_path):
    """cache.compiling is an exclusive lock on a module's source across open files (so across processes): a second
    holder gets it only once the first has let go."""
    path = tmp_path / "k_module.py"
    path.write_text("x = 1\n")
    events, trying = [], threading.Event()

    def second():
        trying.set()
        with cache.compiling(path):
            events.append("second holds it")

    with cache.compiling(path):
        other = threading.Thread(target=second)
        other.start()
        assert trying.wait(30)
        time.sleep(0.3)  # the second holder is now waiting for the lock
        events.append("first lets go")
    other.join(30)
    assert events == ["first lets go", "second holds it"]


def test_a_module_lock_held_too_long_is_given_up(tmp_path, monkeypatch):
    """A holder that never lets go (a hung process) costs a waiter LOCK_WAIT_S, then it compiles anyway."""
    monkeypatch.setattr(cache, "LOCK_WAIT_S", 0.2)
    path = tmp_path / "k_module.py"
    path.write_text("x = 1\n")
    entered = []

    def waiter():
        with cache.compiling(path):
            entered.append(True)

    with cache.compiling(path):
        thread = threading.Thread(target=waiter)
        thread.start()
        thread.join(30)
        assert entered == [True]  # entered while the lock was still held here


_COMPILE_AND_LIST = """
import sys
import runtime, nnc
from runtime import nn
runtime.manual_seed(0)
model = nn.Sequential(nn.Linear(9, 20), nn.GELU(), nn.LayerNorm(20), nn.Linear(20, 3), nn.Softmax(-1)).double()
compiled = nnc.compile(model)
compiled(runtime.randn(4, 9, dtype=runtime.float64)).sum().backward()
steps = [s for c in compiled.compilations for p in c.plans for s in p.steps if hasattr(s, "compiled")]
print(" ".join(s.compiled.path.name for s in steps if not s.compiled.cache_hit))
print(len(steps))
"""


def test_two_processes_compiling_one_model_into_one_cache_compile_each_module_once(tmp_path):
    """DDP ranks on one machine share the kernel cache: each module is compiled by one process, and the other loads
    it from the disk cache when that compile is done (both compiled everything before, on contended cores)."""
    env = dict(os.environ, **{cache.ENV_VAR: str(tmp_path / "shared"), compile_workers.ENV_VAR: "0"})
    command = [sys.executable, "-c", _COMPILE_AND_LIST]
    processes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in processes]
    assert all(p.returncode == 0 for p in processes), [err[-2000:] for _, err in outputs]
    (compiled_a, steps_a), (compiled_b, steps_b) = ([line.split() for line in out.splitlines()] for out, _ in outputs)
    assert steps_a == steps_b and int(steps_a[0]) >= 4
    assert compiled_a or compiled_b
    assert not set(compiled_a) & set(compiled_b), (compiled_a, compiled_b)


def test_helpers_start_early_only_for_a_compilation_not_seen_before(fresh_cache, monkeypatch):
    """A compilation that never finished with this cache starts its helpers while it traces (they take about 1.3 s
    to start); one that did, whose kernels are on disk, starts none, nor does a small one or a forward without
    gradients (whole-graph mode compiles it in this process). A finished
    compilation marks its fingerprint, which changes with the inputs' shapes."""
    from nnc import pipeline

    monkeypatch.setenv(compile_workers.ENV_VAR, "1")
    started = []
    monkeypatch.setattr(compile_workers, "_worker", lambda k: started.append(k))
    monkeypatch.setattr(compile_workers, "precompile", lambda generated: 0)  # the start at codegen: not this test's
    model = nn.Sequential(*[layer for _ in range(4) for layer in (nn.Linear(5, 5), nn.Tanh())])

    def compile_for(batch, module=model, needs_grad=True):
        c = pipeline.Compilation(module, {}, {"input": runtime.randn(batch, 5)}, needs_grad=needs_grad)
        return pipeline.run_stages(c)

    small = compile_for(3, nn.Sequential(nn.Linear(5, 7), nn.Tanh()))
    assert started == [] and cache.seen(small.fingerprint)
    inference = compile_for(3, needs_grad=False)  # may run as one numba function, which no helper compiles
    assert started == [] and cache.seen(inference.fingerprint)
    first = compile_for(3)
    assert started == [0] and cache.seen(first.fingerprint)
    again = compile_for(3)
    assert again.fingerprint == first.fingerprint and started == [0]  # seen: no helper started
    other = compile_for(4)
    assert other.fingerprint != first.fingerprint and started == [0, 0]
