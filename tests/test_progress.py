"""A long compile shows its stage and kernels on a terminal's stderr (nnc.pipeline.Progress), and nothing elsewhere."""
from __future__ import annotations

import io
import re

import pytest

import runtime
from nnc import pipeline
from nnc.compile import bind_arguments, split_arguments
from runtime import nn


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def compile_small(model=None) -> pipeline.Compilation:
    model = model or nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    concrete, examples = split_arguments(bind_arguments(model, (runtime.randn(3, 4),), {}))
    with runtime.no_grad():
        return pipeline.compile_arguments(model, concrete, examples, needs_grad=True)


@pytest.fixture
def no_setting(monkeypatch):
    monkeypatch.delenv("NNC_PROGRESS", raising=False)


def test_a_compile_past_the_threshold_shows_stages_and_kernels_on_a_terminal(monkeypatch, no_setting):
    terminal = FakeTerminal()
    monkeypatch.setattr(pipeline, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(pipeline.sys, "stderr", terminal)
    c = compile_small()
    text = terminal.getvalue()
    lines = text.split("\r")
    for stage in pipeline.STAGE_NAMES:
        assert any(f"nnc: compiling Sequential: stage {stage} (" in line for line in lines), text
    total = sum(len(plan.kernels) for plan in c.plans)
    assert total > 0
    assert f"stage codegen (11/11), kernel {total}/{total}" in text
    counts = [int(m) for m in re.findall(r"kernel (\d+)/", text)]
    assert counts == sorted(counts) and counts[0] < total  # counted up as kernels compiled
    assert re.search(rf"\({len(pipeline.STAGES)} stages, {total} kernels\) *\n$", text)  # padded over the last
    assert re.search(r"\rnnc: compiled Sequential in \d+\.\d s", text)
    assert pipeline.Progress._showing is None


def test_no_output_when_stderr_is_not_a_terminal(monkeypatch, no_setting):
    stream = io.StringIO()  # isatty() is False
    monkeypatch.setattr(pipeline, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(pipeline.sys, "stderr", stream)
    compile_small()
    assert stream.getvalue() == ""


def test_no_output_for_a_compile_shorter_than_the_threshold(monkeypatch, no_setting):
    terminal = FakeTerminal()
    monkeypatch.setattr(pipeline, "PROGRESS_AFTER", 3600.0)
    monkeypatch.setattr(pipeline.sys, "stderr", terminal)
    compile_small()
    assert terminal.getvalue() == ""


def test_the_setting_forces_or_silences_it(monkeypatch):
    monkeypatch.setattr(pipeline, "PROGRESS_AFTER", 0.0)
    stream = io.StringIO()
    monkeypatch.setattr(pipeline.sys, "stderr", stream)
    monkeypatch.setenv("NNC_PROGRESS", "1")
    compile_small()
    assert "nnc: compiled Sequential" in stream.getvalue()
    terminal = FakeTerminal()
    monkeypatch.setattr(pipeline.sys, "stderr", terminal)
    monkeypatch.setenv("NNC_PROGRESS", "0")
    compile_small()
    assert terminal.getvalue() == ""


def test_a_failing_compile_says_where_it_stopped(monkeypatch, no_setting):
    class Bad(nn.Module):
        def forward(self, x):
            return x.reshape(5, 7)  # 12 values: shape propagation fails

    terminal = FakeTerminal()
    monkeypatch.setattr(pipeline, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(pipeline.sys, "stderr", terminal)
    with pytest.raises(pipeline.PipelineError):
        compile_small(Bad())
    assert "nnc: compiling Bad stopped at stage" in terminal.getvalue()
    assert terminal.getvalue().endswith("\n") and pipeline.Progress._showing is None
