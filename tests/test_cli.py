"""The `nnc` command line: `nnc dump FILE.py:ATTR` in every format and stage, its errors and its help."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import runtime
from nnc import cli
from nnc.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "examples", "models.py")
EXAMPLES = {  # attribute in examples/models.py -> (input spec, shape of the output)
    "mlp": ("float32[8,784]", (8, 10)),
    "cnn": ("float32[2,1,28,28]", (2, 10)),
    "block": ("float32[2,5,32]", (2, 5, 32)),
}
FORMATS = ["text", "table", "python", "dot", "json"]

BAD_MODELS = textwrap.dedent('''
    """Modules that nnc dump cannot use, one per error case."""
    import runtime as torch
    from runtime import nn


    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:          # data-dependent control flow
                return x
            return -x


    class NeedsArgs(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.fc = nn.Linear(width, width)

        def forward(self, x):
            return self.fc(x)


    class Plain:
        pass


    def make_linear():
        return nn.Linear(3, 4)


    def make_number():
        return 42


    def make_broken():
        raise ValueError("cannot build this one")


    branchy = Branchy()
    linear = nn.Linear(3, 4)
    number = 7
''')


@pytest.fixture
def bad_file(tmp_path):
    path = tmp_path / "bad_models.py"
    path.write_text(BAD_MODELS)
    return str(path)


def dump(*args):
    return main(["dump", *args])


# -- success: every example model, format and available stage ---------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("stage", ["traced", "shapes"])
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_dump_examples(capsys, name, stage, fmt):
    spec, _ = EXAMPLES[name]
    status = dump(f"{MODELS}:{name}", "--input", spec, "--stage", stage, "--format", fmt)
    out, err = capsys.readouterr()
    assert status == 0, err
    assert err == ""
    assert out.strip()
    if fmt == "json":
        json.loads(out)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_dump_matches_format_graph(capsys, name):
    """The command prints exactly what format_graph gives for the traced, shape-propagated module."""
    import nnc
    from nnc.passes.shapes import propagate_shapes
    from nnc.printer import format_graph

    spec, out_shape = EXAMPLES[name]
    assert dump(f"{MODELS}:{name}", "--input", spec, "--stage", "shapes") == 0
    out = capsys.readouterr().out

    module = cli.resolve_module(cli.load_file(MODELS), name, MODELS)
    gm = nnc.symbolic_trace(module)
    propagate_shapes(gm, *cli.make_inputs([cli.parse_input_spec(spec)]))
    assert gm.graph.output_node.meta["shape"] == out_shape
    assert out.rstrip("\n") == format_graph(gm.graph, "text", module=gm).rstrip("\n")


def test_dump_traced_needs_no_inputs(capsys):
    assert dump(f"{MODELS}:mlp") == 0            # the default stage without --input is 'traced'
    assert "fc1" in capsys.readouterr().out


def test_dump_shapes_records_shapes(capsys):
    assert dump(f"{MODELS}:mlp", "-i", "float32[8,784]", "--format", "json") == 0   # default stage: shapes
    out = capsys.readouterr().out
    assert "784" in out and "512" in out


def test_dump_class_factory_and_dotted_attribute(capsys, bad_file):
    assert dump(f"{MODELS}:TransformerBlock", "--input", "float32[2,5,32]") == 0     # a class, instantiated
    assert dump(f"{bad_file}:make_linear", "--input", "float32[2,3]") == 0          # a zero-argument factory
    assert dump(f"{MODELS}:block.mlp", "--input", "float32[2,5,32]") == 0           # a dotted attribute
    assert dump(f"{bad_file}:linear", "--input", "float32[3]", "--stage", "shapes") == 0
    capsys.readouterr()


def test_dump_imports_neighbours(capsys, tmp_path):
    """The file's directory is on sys.path while it loads, so it can import the files beside it."""
    (tmp_path / "widths_for_nnc_cli_test.py").write_text("WIDTH = 6\n")
    (tmp_path / "net.py").write_text(textwrap.dedent('''
        from widths_for_nnc_cli_test import WIDTH
        from runtime import nn

        net = nn.Sequential(nn.Linear(WIDTH, 2), nn.Tanh())
    '''))
    assert dump(f"{tmp_path / 'net.py'}:net", "--input", "float32[4,6]") == 0
    assert str(tmp_path) not in sys.path
    capsys.readouterr()


def test_out_writes_file(capsys, tmp_path):
    target = tmp_path / "mlp.dot"
    assert dump(f"{MODELS}:mlp", "--input", "float32[8,784]", "--format", "dot", "--out", str(target)) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    assert target.read_text().strip()


def test_console_module_in_subprocess(tmp_path):
    """`python -m nnc.cli` (the same main as the installed `nnc` script) runs from any directory."""
    target = tmp_path / "cnn.json"
    result = subprocess.run(
        [sys.executable, "-m", "nnc.cli", "dump", f"{MODELS}:cnn", "--input", "float32[2,1,28,28]",
         "--stage", "shapes", "--format", "json", "--out", str(target)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    json.loads(target.read_text())


def test_console_module_error_in_subprocess(tmp_path):
    result = subprocess.run([sys.executable, "-m", "nnc.cli", "dump", "missing_file.py:net"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 1
    assert "file not found" in result.stderr and "Traceback" not in result.stderr


# -- stages that land with the compiler ---------------------------------------------------------------


@pytest.mark.parametrize("stage", ["decomposed", "backward"])
def test_compiler_stages_show_primitive_graphs(capsys, stage):
    assert dump(f"{MODELS}:mlp", "--input", "float32[8,784]", "--stage", stage, "--format", "python") == 0
    out, _ = capsys.readouterr()
    assert "prims." in out and "self.fc1(" not in out  # modules are decomposed into primitives
    if stage == "backward":
        assert "saved_" in out and "grad_" in out


@pytest.mark.parametrize("stage", ["decomposed", "backward"])
def test_compiler_stages_need_inputs(capsys, stage):
    assert dump(f"{MODELS}:mlp", "--stage", stage) == 1
    assert "needs example inputs" in capsys.readouterr().err


def test_fused_stage_lists_kernels_with_their_boundaries(capsys):
    assert dump(f"{MODELS}:mlp", "--input", "float32[8,784]", "--stage", "fused") == 0
    out = capsys.readouterr().out
    assert "forward kernels" in out and "[linear, add, relu]" in out and "boundary:" in out
    assert dump(f"{MODELS}:mlp", "--input", "float32[8,784]", "--stage", "fused", "--format", "json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["forward"][0]["ops"] == ["linear", "add", "relu"] and report["backward"]


def test_kernels_stage_shows_generated_source(capsys):
    assert dump(f"{MODELS}:mlp", "--input", "float32[8,784]", "--stage", "kernels") == 0
    out = capsys.readouterr().out
    assert "@njit(cache=True" in out and "def launch" in out


def test_inference_stage_shows_the_whole_graph_function_or_why_not(capsys):
    assert dump(f"{MODELS}:mlp", "--input", "float32[1,784]", "--stage", "inference") == 0
    out = capsys.readouterr().out
    assert out.startswith("# forward: one numba function (whole-graph mode)")
    assert "def run_graph(" in out and "# kernel k0_matmul: in0 = x" in out and "_rows(a, b, out):" in out
    assert dump(f"{MODELS}:mlp", "--input", "float32[4096,784]", "--stage", "inference") == 0
    out = capsys.readouterr().out
    assert "kernel by kernel (not whole-graph: node" in out and "elements" in out and "def run_graph(" not in out


def test_kernel_stages_refuse_graph_formats(capsys):
    assert dump(f"{MODELS}:mlp", "--input", "float32[8,784]", "--stage", "kernels", "--format", "dot") == 1
    assert "prints as text" in capsys.readouterr().err


# -- errors: one clear paragraph, exit status 1, no traceback -------------------------------------------


def _error(capsys, *args):
    status = dump(*args)
    out, err = capsys.readouterr()
    assert status == 1
    assert out == ""
    assert "Traceback" not in err
    assert err.startswith("nnc dump: error: ")
    assert err.count("\n") == 1          # one paragraph
    return err


@pytest.mark.parametrize("target", ["examples/models.py", "examples/models.py:", ":mlp", "models.py:1net",
                                    "models.py:a..b"])
def test_bad_target_syntax(capsys, target):
    err = _error(capsys, target)
    assert "expected FILE.py:ATTR" in err


def test_file_not_found(capsys, tmp_path):
    err = _error(capsys, f"{tmp_path / 'nope.py'}:net")
    assert "file not found" in err and "nope.py" in err


def test_missing_attribute_lists_modules(capsys):
    err = _error(capsys, f"{MODELS}:mpl")
    assert "no attribute 'mpl'" in err
    assert "Did you mean 'mlp'?" in err
    for name in ("mlp", "cnn", "block", "MLP (class)", "CNN (class)", "TransformerBlock (class)"):
        assert name in err


def test_missing_dotted_attribute(capsys):
    err = _error(capsys, f"{MODELS}:mlp.fc9")
    assert "no attribute 'fc9'" in err


@pytest.mark.parametrize("attr, expected", [
    ("number", "is an int, not a runtime.nn.Module"),
    ("Plain", "not a runtime.nn.Module subclass"),
    ("make_number", "returned an int, not a runtime.nn.Module"),
    ("NeedsArgs", "needs arguments (width)"),
    ("make_broken", "ValueError: cannot build this one"),
])
def test_not_a_module(capsys, bad_file, attr, expected):
    err = _error(capsys, f"{bad_file}:{attr}")
    assert expected in err


def test_file_that_fails_to_import(capsys, tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("x = 1\nraise RuntimeError('broken at import')\n")
    err = _error(capsys, f"{path}:net")
    assert "could not load" in err and "RuntimeError: broken at import" in err and "broken.py:2" in err


def test_file_with_syntax_error(capsys, tmp_path):
    path = tmp_path / "typo.py"
    path.write_text("def f(:\n    pass\n")
    err = _error(capsys, f"{path}:net")
    assert "could not load" in err and "SyntaxError" in err


@pytest.mark.parametrize("spec, expected", [
    ("float32(8,784)", "DTYPE[DIMS]"),
    ("float33[8,784]", "unknown dtype 'float33' (did you mean 'float32'?)"),
    ("float32[8,-1]", "dimension '-1'"),
    ("float32[8,x]", "dimension 'x'"),
    ("float32[8,,2]", "dimension ''"),
    ("[8,784]", "DTYPE[DIMS]"),
])
def test_bad_input_spec(capsys, spec, expected):
    err = _error(capsys, f"{MODELS}:mlp", "--input", spec)
    assert expected in err
    assert ", ".join(cli.DTYPES) in err     # the grammar


def test_shapes_needs_inputs(capsys):
    err = _error(capsys, f"{MODELS}:mlp", "--stage", "shapes")
    assert "--stage shapes needs example inputs" in err


def test_wrong_number_of_inputs(capsys):
    err = _error(capsys, f"{MODELS}:mlp", "--input", "float32[8,784]", "--input", "float32[8,784]")
    assert "takes 1 input (x), but 2 --input were given" in err


def test_trace_error_names_user_line(capsys, bad_file):
    err = _error(capsys, f"{bad_file}:branchy", "--input", "float32[2,3]")
    assert "could not trace" in err and "control flow" in err
    line = BAD_MODELS.splitlines().index("        if x.sum() > 0:          # data-dependent control flow") + 1
    assert f"{bad_file}:{line}" in err and "if x.sum() > 0:" in err


def test_run_error_shows_exception_and_shapes(capsys):
    err = _error(capsys, f"{MODELS}:mlp", "--input", "float32[8,100]")
    assert "failed to run on the given inputs (x: float32[8,100])" in err
    assert "8x100" in err                         # runtime's own message
    assert "node fc1" in err and "models.py" in err


def test_run_error_in_builtin_root_names_no_bogus_source(capsys, bad_file):
    """A built-in layer as the root: its nodes have no user source line, and the message does not invent one."""
    err = _error(capsys, f"{bad_file}:linear", "--input", "float64[3]")
    assert "failed to run on the given inputs (input: float64[3])" in err
    assert "node linear" in err and "test_cli.py" not in err


def test_out_to_missing_directory(capsys, tmp_path):
    err = _error(capsys, f"{MODELS}:mlp", "--out", str(tmp_path / "no" / "such" / "dir.txt"))
    assert "could not write" in err


# -- --verbose ------------------------------------------------------------------------------------------


def test_verbose_shows_traceback(capsys, bad_file):
    assert dump(f"{bad_file}:branchy", "--input", "float32[2,3]", "--verbose") == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "TraceError" in err
    assert "nnc dump: error: could not trace" in err


def test_verbose_run_error_traceback(capsys):
    assert dump(f"{MODELS}:mlp", "--input", "float32[8,100]", "-v") == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "failed to run on the given inputs" in err


# -- --help ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["dump", "--help"]])
def test_help(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: nnc" in out and "examples:" in out
    assert "nnc dump examples/models.py:mlp" in out
    if argv[0] == "dump":
        for word in ("--input", "--stage", "--format", "--out", "--verbose", "FILE.py:ATTR", "float32[8,784]"):
            assert word in out


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "usage: nnc" in capsys.readouterr().err


# -- input specs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, expected", [
    ("float32[8,784]", ("float32", (8, 784))),
    ("int64[4]", ("int64", (4,))),
    ("float32[]", ("float32", ())),
    (" bool [ 2 , 3 ] ", ("bool", (2, 3))),
    ("float16[0,3]", ("float16", (0, 3))),
    ("uint8[2,28,28]", ("uint8", (2, 28, 28))),
    ("bfloat16[4]", ("bfloat16", (4,))),
])
def test_parse_input_spec(spec, expected):
    assert cli.parse_input_spec(spec) == expected


def test_every_runtime_integer_and_float_dtype_is_an_input_dtype():
    """The dtypes people feed models (images as uint8, bfloat16 activations) each make an input tensor."""
    specs = [(name, (2, 3)) for name in cli.DTYPES]
    made = cli.make_inputs(specs)
    assert [t.dtype for t in made] == [getattr(runtime, name) for name in cli.DTYPES]
    assert made[cli.DTYPES.index("bfloat16")].float().std().item() > 0.1  # drawn, as the other floats are


def test_dump_takes_a_uint8_image_batch(tmp_path, capsys):
    path = tmp_path / "net.py"
    path.write_text("from runtime import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n"
                    "        super().__init__()\n        self.fc = nn.Linear(4, 2)\n\n"
                    "    def forward(self, x):\n        return self.fc(x.float() / 255)\n")
    main(["dump", f"{path}:Net", "--input", "uint8[3,4]", "--stage", "shapes"])
    out = capsys.readouterr().out
    assert "%x : uint8[3, 4] = placeholder" in out


def test_make_inputs_dtypes_shapes_and_seed():
    specs = [("float16", (2, 3)), ("float32", ()), ("float64", (4,)), ("int32", (2,)), ("int64", (3, 1)),
             ("bool", (5,))]
    first = cli.make_inputs(specs)
    for tensor, (dtype, dims) in zip(first, specs):
        assert tensor.dtype == getattr(runtime, dtype)
        assert tuple(tensor.shape) == dims
    assert not first[3].any().item() and not first[5].any().item()          # ints and bools are zeros
    second = cli.make_inputs(specs)
    assert all(runtime.equal(a, b) for a, b in zip(first, second))          # a fixed seed
    assert first[2].std().item() > 0.1                                      # floats are random normal


# -- the README's example is real output -------------------------------------------------------------------


def test_readme_dump_example_is_current(capsys):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("## Looking inside: nnc dump", 1)[1].split("\n## ", 1)[0]
    command = section.split("```bash\n", 1)[1].split("\n```", 1)[0].strip()
    shown = section.split("```text\n", 1)[1].split("\n```", 1)[0]
    assert command.startswith("nnc dump ")
    args = command.split()[2:]
    args = [os.path.join(ROOT, a) if a.startswith("examples/") else a.strip("'") for a in args]
    assert dump(*args) == 0
    assert capsys.readouterr().out.rstrip("\n") == shown.rstrip("\n")


# -- user mistakes that once read as internal errors ---------------------------------------------------------------


def test_a_digit_python_accepts_but_int_does_not_is_a_bad_dimension(capsys):
    err = _error(capsys, f"{MODELS}:mlp", "--input", "float32[8,\u00b2]")
    assert "dimension '\u00b2' is not a non-negative integer" in err and "internal error" not in err


def test_an_absurd_input_size_is_refused_before_allocating(capsys):
    err = _error(capsys, f"{MODELS}:mlp", "--input", "float32[99999999999999,4]")
    assert "would take" in err and "GiB" in err and "internal error" not in err


def test_a_file_raising_a_base_exception_at_import_is_one_error_line(capsys, tmp_path):
    path = tmp_path / "boom.py"
    path.write_text("class Boom(BaseException):\n    pass\n\nraise Boom('at import')\n")
    err = _error(capsys, f"{path}:net")
    assert "could not load" in err and "Boom: at import" in err and "boom.py:4" in err
