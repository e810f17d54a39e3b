"""nnc.pipeline: one list of stages; `nnc dump --stage X` prints what nnc.compile runs, failures name their stage."""
import json
import os
import textwrap

import numpy as np
import pytest

import nnc
import runtime
from nnc import cli, pipeline
from nnc.printer import format_graph
from runtime import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "examples", "models.py")

# noise from the model's own generator: a draw nnc does not compile (compiled draws use the default generator)
DROPOUT_MODEL = textwrap.dedent('''
    import runtime
    from runtime import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(6, 5), nn.Linear(5, 3)
            self.gen = runtime.Generator().manual_seed(0)

        def forward(self, x):
            h = self.fc1(x).relu()
            return self.fc2(h * runtime.rand(h.shape, generator=self.gen)).tanh()

    net = Net()
''')


def _stage_text(stage: str, c: pipeline.Compilation) -> str:
    """What a stage made, as text independent of how the CLI prints it."""
    if stage in cli.GRAPH_STAGES:
        return "\n\n".join(f"{label}\n{format_graph(gm.graph, 'text', module=gm)}"
                           for label, gm in pipeline.stage_graphs(c, stage))
    if stage == "fuse":
        return json.dumps([[k.name, k.kind, k.reason] for plan in c.plans for k in plan.kernels])
    if stage == "memory":
        return "\n".join(plan.memory.summary() for plan in c.plans)
    return "\n\n".join(k.meta.get("source", "") for plan in c.plans for k in plan.kernels)


def _compile_and_observe(module, inputs) -> dict:
    """{stage: text} of every stage nnc.compile ran for its first call."""
    seen = {}
    with pipeline.observing(lambda stage, c: seen.setdefault(stage, _stage_text(stage, c))):
        nnc.compile(module)(*inputs)
    return seen


def _cli_stage(module, spec: str, stage: str) -> pipeline.Compilation:
    return cli._compile_to(module, [cli.parse_input_spec(spec)], stage, "model", MODELS)


@pytest.mark.parametrize("path, attr, spec", [(MODELS, "mlp", "float32[8,784]"),
                                              (None, "net", "float32[4,6]")])
def test_dump_shows_what_compile_runs_at_every_stage(tmp_path, path, attr, spec):
    if path is None:  # a model drawing random numbers eagerly: it compiles in pieces around the draw
        path = tmp_path / "dropout_net.py"
        path.write_text(DROPOUT_MODEL)
        path = str(path)
    module = cli.resolve_module(cli.load_file(path), attr, path)
    module.train()
    inputs = cli.make_inputs([cli.parse_input_spec(spec)])
    compiled = _compile_and_observe(module, inputs)
    assert list(compiled) == list(pipeline.STAGE_NAMES)
    for stage in pipeline.STAGE_NAMES:
        shown = _cli_stage(module, spec, stage)
        last = stage if stage in cli.GRAPH_STAGES else "codegen"  # kernel views read a finished compilation
        assert shown.done[-1] == last
        assert _stage_text(stage, shown) == compiled[stage], f"nnc dump --stage {stage} differs from compile"


def test_dump_split_stage_prints_each_piece(tmp_path, capsys):
    path = tmp_path / "dropout_net.py"
    path.write_text(DROPOUT_MODEL)
    assert cli.main(["dump", f"{path}:net", "--input", "float32[4,6]", "--stage", "split"]) == 0
    out = capsys.readouterr().out
    assert "# Net_piece0" in out and "# Net_piece2" in out
    assert cli.main(["dump", f"{path}:net", "--input", "float32[4,6]", "--stage", "split", "--format", "dot"]) == 1
    assert "made 2 graphs" in capsys.readouterr().err


@pytest.mark.parametrize("stage", pipeline.STAGE_NAMES)
def test_every_stage_prints_from_the_command_line(capsys, stage):
    fmt = "text"
    assert cli.main(["dump", f"{MODELS}:mlp", "--input", "float32[8,784]", "--stage", stage, "--format", fmt]) == 0
    assert capsys.readouterr().out.strip()


def test_backward_stage_is_the_backward_compile_runs(capsys):
    """The CLI once rebuilt the passes itself and printed a backward with nodes compile had removed."""
    module = cli.resolve_module(cli.load_file(MODELS), "mlp", MODELS)
    inputs = cli.make_inputs([cli.parse_input_spec("float32[8,784]")])
    compiled = nnc.compile(module)
    compiled(*inputs).sum().backward()
    (artifact,) = compiled._cache.values()
    assert cli.main(["dump", f"{MODELS}:mlp", "--input", "float32[8,784]", "--stage", "backward"]) == 0
    backward = artifact.backward.gm
    assert capsys.readouterr().out.rstrip("\n") == format_graph(backward.graph, "text", module=backward).rstrip("\n")


def test_cli_lists_the_pipeline_stages():
    assert cli.STAGES == pipeline.STAGE_NAMES + ("inference",)
    assert set(cli.STAGE_ALIASES.values()) <= set(cli.STAGES)


def _mlp():
    runtime.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2))


def test_stopped_compilation_resumes_to_the_same_result():
    model, x = _mlp(), runtime.randn(3, 5)
    c = pipeline.Compilation(model, {}, {"input": x}, needs_grad=False)
    pipeline.run_stages(c, until="shapes")
    assert c.done == ["trace", "shapes"] and c.forward is None and c.traced.graph.output_node.meta["shape"] == (3, 2)
    pipeline.run_stages(c, until="shapes")  # already there: runs nothing more
    assert c.done == ["trace", "shapes"]
    pipeline.run_stages(c)
    assert c.done == list(pipeline.STAGE_NAMES)
    np.testing.assert_allclose(c.run([x], wants_grad=False).numpy(), model(x).detach().numpy(), rtol=1e-6)


def test_unknown_stage_is_named():
    c = pipeline.Compilation(_mlp(), {}, {"input": runtime.randn(3, 5)}, needs_grad=False)
    with pytest.raises(ValueError, match="unknown stage 'fused'.*trace, shapes"):
        pipeline.run_stages(c, until="fused")


def test_failing_stage_names_itself_and_the_stages_before(monkeypatch):
    def broken(graph, **options):
        raise RuntimeError("fusion broke")

    monkeypatch.setattr("nnc.executor.fuse", broken)
    c = pipeline.Compilation(_mlp(), {}, {"input": runtime.randn(3, 5)}, needs_grad=True)
    with pytest.raises(pipeline.PipelineError) as info:
        pipeline.run_stages(c)
    error = info.value
    assert error.stage == "fuse" and error.done == list(pipeline.STAGE_NAMES[:pipeline.STAGE_NAMES.index("fuse")])
    assert "stage 'fuse' failed (after trace, shapes, decompose" in str(error) and "fusion broke" in str(error)
    assert isinstance(error.__cause__, RuntimeError)


def test_failing_pass_is_named_and_compile_falls_back(monkeypatch):
    def broken(gm):
        raise RuntimeError("cse broke")

    monkeypatch.setattr(pipeline, "FORWARD_CLEANUPS", [("remove_noops", pipeline.remove_noops), ("cse", broken)])
    model, x = _mlp(), runtime.randn(3, 5)
    with pytest.warns(RuntimeWarning, match=r"stage 'simplify' failed .*cse broke; nnc: in pass 'cse' of forward"):
        got = nnc.compile(model)(x)
    np.testing.assert_array_equal(got.detach().numpy(), model(x).detach().numpy())  # eager: the right answer


def test_debug_3_prints_kernel_sources(monkeypatch, capsys):
    monkeypatch.setenv("NNC_DEBUG", "3")
    nnc.compile(_mlp())(runtime.randn(3, 5))
    err = capsys.readouterr().err
    assert "[nnc] kernel k0" in err and "def " in err
    assert "forward after stage simplify" in err  # level 2 is included: graphs after each stage


def test_debug_below_3_prints_no_sources(monkeypatch, capsys):
    monkeypatch.setenv("NNC_DEBUG", "2")
    nnc.compile(_mlp())(runtime.randn(3, 5))
    err = capsys.readouterr().err
    assert "after stage decompose" in err and "[nnc] kernel k0" not in err


def test_each_stage_is_timed_in_order():
    c = pipeline.compile_arguments(_mlp(), {}, {"input": runtime.randn(3, 5)}, needs_grad=True)
    assert list(c.seconds) == list(pipeline.STAGE_NAMES) and all(s >= 0 for s in c.seconds.values())


@pytest.mark.parametrize("shape", [(0, 5), (1, 5)])
def test_size_0_and_size_1_batches_compile_forward_and_backward(shape):
    """A size-0 dimension once reached a generated matmul as reshape(-1, 0), which numpy cannot do: kernels with
    size-0 values run through the interpreter (nothing to loop over), and their gradients are eager's."""
    runtime.manual_seed(0)
    eager = _mlp().double()
    compiled = nnc.compile(_mlp().double())
    x = runtime.randn(*shape, dtype=runtime.float64)
    for model in (eager, compiled):
        model(x).pow(2).sum().backward()
    assert compiled(x).shape == (shape[0], 2)
    for got, want in zip(compiled.parameters(), eager.parameters()):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-9, atol=1e-12)
    if shape[0] == 0:
        c = pipeline.compile_arguments(_mlp(), {}, {"input": runtime.randn(*shape)}, needs_grad=True)
        assert all(type(step).__name__ != "KernelStep" for plan in c.plans for step in plan.steps)
