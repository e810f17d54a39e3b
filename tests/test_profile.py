"""nnc.profile: kernel launches, eager ops and interpreted steps in its table and its Chrome trace; nothing recorded,
and no observer left, when it is off."""
from __future__ import annotations

import json
import sys

import pytest

import nnc
import runtime
from runtime import _profiling, nn

from models import MLP

PROFILE = sys.modules["nnc.profile"]  # the module (nnc.profile is the class)


def small_mlp():
    return MLP(sizes=(8, 16, 16, 4))


def test_compiled_training_step_records_kernels_of_both_graphs_and_eager_ops():
    model = small_mlp()
    compiled = nnc.compile(model)
    x = runtime.randn(4, 8)
    compiled(x).sum().backward()  # compile outside the profile
    with nnc.profile() as prof:
        for _ in range(2):
            compiled(x).sum().backward()
    rows = {(r.name, r.cat): r for r in prof.key_averages()}
    kernels = [r for r in rows.values() if r.cat == "kernel"]
    assert any(r.name.startswith("MLP.k") for r in kernels), rows.keys()
    assert any(r.name.startswith("Backward.k") for r in kernels), rows.keys()
    assert all(r.calls == 2 and r.nbytes > 0 and r.gbps > 0 for r in kernels)
    assert rows[("MLP", "graph")].calls == 2 and rows[("Backward", "graph")].calls == 2
    assert ("sum", "op") in rows  # the eager .sum() on the compiled output
    assert not any(r.cat == "compile" for r in rows.values())  # compiled before the block
    table = prof.table()
    for name in ("Name", "Calls", "Total ms", "Mean us", "Self %", "Bytes", "GB/s", "MLP.k0_matmul", "sum"):
        assert name in table
    # the kernels of a plan nest inside its graph event
    graph = next(e for e in prof.events if e.cat == "graph" and e.name == "MLP")
    inside = [e for e in prof.events if e.cat == "kernel" and graph.start <= e.start and e.end <= graph.end]
    assert len(inside) == len(compiled_kernels(inside))


def compiled_kernels(events):
    return [e for e in events if e.name.startswith("MLP.k")]


def test_eager_model_records_its_ops_with_bytes():
    model = small_mlp()
    x = runtime.randn(4, 8)
    with nnc.profile() as prof:
        model(x).sum().backward()
        with runtime.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)
    rows = {(r.name, r.cat): r for r in prof.key_averages()}
    assert rows[("linear", "op")].calls >= 3  # forward, and the backward's rules
    relu = rows[("relu", "op")]
    assert relu.nbytes == relu.calls * 2 * 4 * 16 * 4  # each reads and writes a float32 [4, 16]
    assert any(cat == "op_" for _, cat in rows)  # the in-place update
    assert not any(r.cat in ("kernel", "graph") for r in rows.values())
    lines = prof.table(sort_by="calls").splitlines()
    calls = [int(line.split()[2]) for line in lines[3:-2]]
    assert calls == sorted(calls, reverse=True)
    with pytest.raises(ValueError, match="sort_by"):
        prof.table(sort_by="speed")


def test_chrome_trace_is_well_formed_trace_event_json(tmp_path):
    model = small_mlp()
    compiled = nnc.compile(model)
    x = runtime.randn(4, 8)
    with nnc.profile() as prof:
        with prof.record("step"):
            compiled(x).sum().backward()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(prof.events) > 0
    for e in complete:
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["args"], dict) and e["cat"]
    cats = {e["cat"] for e in complete}
    assert {"kernel", "graph", "op", "user", "compile"} <= cats  # the compile happened inside the block
    step = next(e for e in complete if e["name"] == "step")
    for e in complete:  # everything ran inside the user's range
        if e["cat"] != "compile":
            assert step["ts"] <= e["ts"] + 1e-3 and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1e-3
    kernel = next(e for e in complete if e["cat"] == "kernel")
    assert kernel["args"]["bytes"] > 0 and "GB/s" in kernel["args"] and kernel["args"]["graph"]
    assert any(e["ph"] == "M" and e["name"] == "thread_name" for e in events)


def test_interpreted_steps_and_whole_graph_runs_are_recorded():
    class Scan(nn.Module):
        def forward(self, x):
            return (x.cumsum(1) * 2).exp()  # cumsum is an "other" op: run by the interpreter

    compiled = nnc.compile(Scan())
    x = runtime.randn(3, 5)
    with runtime.no_grad():
        compiled(x)
        with nnc.profile() as prof:
            compiled(x)
    cats = {e.cat for e in prof.events}
    assert "interpreted" in cats, prof.table()
    interpreted = [e for e in prof.events if e.cat == "interpreted"]
    for e in interpreted:
        assert e.args["reason"]
        assert any(o.cat == "op" and o.name == "cumsum" and e.start <= o.start and o.end <= e.end
                   for o in prof.events)


def test_nothing_is_observed_when_off():
    compiled = nnc.compile(small_mlp())
    x = runtime.randn(4, 8)
    assert _profiling.op_observers == [] and PROFILE.ACTIVE == []
    prof = nnc.profile()
    with pytest.raises(RuntimeError, match="boom"):
        with prof:
            assert len(_profiling.op_observers) == 1 and PROFILE.ACTIVE == [prof]
            raise RuntimeError("boom")
    assert _profiling.op_observers == [] and PROFILE.ACTIVE == []  # unregistered even after an error
    seen = len(prof.events)
    compiled(x).sum().backward()
    (x * 2).sum()
    assert len(prof.events) == seen  # nothing recorded outside the block


def test_report_takes_its_kernel_times_from_a_profile(monkeypatch):
    import base64

    from nnc.compile import bind_arguments, split_arguments
    from nnc.pipeline import Compilation, run_stages
    from nnc.report import _kernel_infos, _plans, _profile_extras, profile_plans

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    concrete, examples = split_arguments(bind_arguments(model, (runtime.randn(3, 4),), {}))
    compilation = Compilation(model, concrete, examples, needs_grad=True)
    with runtime.no_grad():
        run_stages(compilation)
    plans = _plans(compilation)
    kernels = {info.id: info for i, (label, plan) in enumerate(plans) for info in _kernel_infos(i, label, plan)}
    result = profile_plans(compilation, plans, kernels, needs_grad=True, seconds=60.0, max_calls=3)
    prof = result["profile"]
    assert result["calls"] == 3 and all(len(k.seconds) == 3 for k in kernels.values())
    assert sum(e.cat == "kernel" for e in prof.events) == 3 * sum(k.how == "numba" for k in kernels.values())
    assert _profiling.op_observers == [] and PROFILE.ACTIVE == []
    extras = _profile_extras(prof)
    assert "key averages" in extras and "Sequential.k0" in extras
    url = extras.split('href="', 1)[1].split('"', 1)[0]
    trace = json.loads(base64.b64decode(url.split(",", 1)[1]))
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    monkeypatch.setattr("nnc.report._MAX_TRACE_BYTES", len(json.dumps(prof.chrome_trace())) - 1)
    assert "the first 1 profiled calls" in _profile_extras(prof)  # too large: the first call's events only
