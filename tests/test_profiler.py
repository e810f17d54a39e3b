"""runtime.profiler (torch.profiler): ops and record_function ranges are recorded with times that nest, the table
and key averages count them (by input shapes too), schedules pick the steps torch's pick, traces are written for
chrome://tracing and TensorBoard, and nothing is observed outside a profile."""
from __future__ import annotations

import json
import warnings

import pytest

import runtime
import runtime.nn as nn
from runtime import _profiling
from runtime.profiler import ProfilerAction, ProfilerActivity, profile, record_function, schedule
from runtime.profiler import tensorboard_trace_handler

from helpers import needs_torch


def _step(model, x):
    with record_function("forward_and_backward"):
        loss = model(x).relu().sum() + model(x).sum()
        loss.backward()


def test_ops_nest_under_their_range_and_self_times_add_up():
    model = nn.Linear(8, 4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(model, runtime.randn(16, 8))
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["linear"].count == 2 and averages["forward_and_backward"].count == 1
    (top,) = [e for e in prof.events() if e.cpu_parent is None]
    assert top.name == "forward_and_backward" and len(top.cpu_children) >= 4
    assert all(e.cpu_parent is top for e in prof.events() if e is not top)
    self_total = sum(e.self_cpu_time_total for e in prof.events())
    assert self_total == pytest.approx(top.cpu_time_total, rel=1e-9)
    assert 0 < top.self_cpu_time_total < top.cpu_time_total
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=3)
    lines = table.splitlines()
    assert "Self CPU %" in lines[1] and lines[3].split()[0] == "forward_and_backward"  # the largest total first
    assert len(lines) == 3 + 3 + 2 and lines[-1].startswith("Self CPU time total:")


def test_input_shapes_split_the_averages_when_asked():
    model = nn.Linear(8, 4)
    with profile(record_shapes=True) as prof:
        model(runtime.randn(2, 8))
        model(runtime.randn(5, 8))
        model(runtime.randn(5, 8))
    linear = [e for e in prof.key_averages(group_by_input_shape=True) if e.key == "linear"]
    assert sorted((e.input_shapes[0], e.count) for e in linear) == [([2, 8], 1), ([5, 8], 2)]
    assert [e.count for e in prof.key_averages() if e.key == "linear"] == [3]
    with pytest.raises(ValueError, match="sort_by"):
        prof.key_averages().table(sort_by="cuda_time_total")


def test_a_schedule_records_its_active_steps_and_hands_them_over():
    model, x = nn.Linear(3, 3), runtime.randn(2, 3)
    traces = []

    def ready(prof):
        traces.append(sorted(e.name for e in prof.events() if e.name.startswith("ProfilerStep")))
    with profile(schedule=schedule(wait=1, warmup=1, active=2, repeat=2), on_trace_ready=ready) as prof:
        for _ in range(10):
            model(x)
            prof.step()
    assert traces == [["ProfilerStep#2", "ProfilerStep#3"], ["ProfilerStep#6", "ProfilerStep#7"]]
    assert not _profiling.op_observers  # nothing observes once the profile has ended


@needs_torch
@pytest.mark.parametrize("kwargs", [dict(wait=1, warmup=1, active=2), dict(wait=0, warmup=0, active=1, repeat=3),
                                    dict(wait=2, warmup=0, active=3, repeat=1, skip_first=2)])
def test_schedules_match_torch(torch, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # both warn that a schedule without warmup skews results
        ours, theirs = schedule(**kwargs), torch.profiler.schedule(**kwargs)
    assert [ours(k).name for k in range(24)] == [theirs(k).name for k in range(24)]
    assert ProfilerAction.RECORD_AND_SAVE.name in {ours(k).name for k in range(24)}


def test_traces_are_written_for_chrome_and_tensorboard(tmp_path):
    model = nn.Linear(3, 3)
    with profile(schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path), worker_name="w0")) as prof:
        for _ in range(3):
            model(runtime.randn(2, 3))
            prof.step()
    (path,) = tmp_path.glob("w0.*.pt.trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    assert {"linear", "ProfilerStep#1"} <= {e["name"] for e in events}
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)


def test_record_function_decorates_and_one_profile_at_a_time():
    @record_function("helper")
    def helper(x):
        return x * 2

    with profile() as prof:
        helper(runtime.ones(3))
        with pytest.raises(RuntimeError, match="already enabled"):
            profile().start()
    assert [e.count for e in prof.key_averages() if e.key == "helper"] == [1]
    helper(runtime.ones(3))  # no profile: nothing records, nothing fails
    assert not _profiling.op_observers
