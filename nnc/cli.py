"""The `nnc` command: look inside what the compiler makes of a Module (`nnc dump FILE.py:ATTR ...`)."""
from __future__ import annotations

import argparse
import difflib
import importlib.machinery
import importlib.util
import inspect
import math
import os
import re
import sys
import traceback

PROG = "nnc"
FORMATS = ("text", "table", "python", "dot", "json")
# NOTE: the compiler's stages (nnc.pipeline.STAGE_NAMES, kept here so --help needs no compiler import; a test holds
# them equal), then the inference view; the old stage names stay as aliases so existing commands keep working.
STAGES = ("trace", "shapes", "decompose", "functionalize", "simplify", "split", "autodiff", "simplify_backward",
          "fuse", "memory", "codegen", "inference")
STAGE_ALIASES = {"traced": "trace", "decomposed": "simplify", "backward": "simplify_backward", "fused": "fuse",
                 "kernels": "codegen"}
GRAPH_STAGES = STAGES[:STAGES.index("fuse")]
DTYPES = ("bfloat16", "float16", "float32", "float64", "uint8", "int8", "int16", "int32", "int64", "bool")
SEED = 0
MAX_INPUT_BYTES = 4 * 2**30  # example inputs are for shapes: a bigger one is a typo, not a model

INPUT_GRAMMAR = ("an input spec is DTYPE[DIMS]: DTYPE is one of " + ", ".join(DTYPES)
                 + "; DIMS is a comma-separated list of non-negative integers, empty for a scalar "
                   "(e.g. 'float32[8,784]', 'int64[4]', 'float32[]')")

_DESCRIPTION = """\
nnc compiles runtime Modules (`import runtime as torch` code): it traces them into a graph IR and
lowers that to fused numba kernels. `nnc dump` shows what any stage of that pipeline makes; `nnc report`
writes it all, with timings, as one HTML page."""

_EPILOG = """\
examples:
  nnc dump examples/models.py:mlp --input 'float32[8,784]' --stage shapes
  nnc dump examples/models.py:mlp --input 'float32[8,784]' --stage fuse
  nnc dump examples/models.py:cnn --input 'float32[2,1,28,28]' --format dot --out cnn.dot
  nnc report examples/models.py:block --input 'float32[2,5,32]' -o block.html
  nnc dump --help

`python -m nnc.cli` runs the same command."""

_DUMP_DESCRIPTION = """\
Load FILE.py as a module, take its attribute ATTR, run the compiler's pipeline on it up to the chosen
--stage (the same stages nnc.compile runs) and print what that stage made in the chosen --format.

ATTR names a runtime.nn.Module instance, a Module subclass, or a zero-argument callable that returns
a Module (classes and callables are instantiated/called with no arguments); it may be dotted
(e.g. 'zoo.resnet'). The file's directory is on sys.path while it loads, so it can import its
neighbours.

Each --input gives one positional argument of forward(), in order, as DTYPE[DIMS] with DTYPE one of
bfloat16, float16, float32, float64, uint8, int8, int16, int32, int64, bool ('float32[]' is a scalar).
Floating inputs are drawn from a standard normal distribution with a fixed seed, integer and bool inputs
are zeros. Inputs do not require grad; the backward stages differentiate the parameters, as a training step does.

Stages, in the order nnc.compile runs them (graph stages print in any --format):
  trace              the traced graph; without --input, traced symbolically (sizes stay symbolic)
  shapes             the traced graph with each node's shape and dtype
  decompose          primitive ops from runtime's op table
  functionalize      in-place writes gone: an input or buffer written in forward is an extra output
  simplify           the forward after no-op removal, CSE, constant folding and dead-code removal
  split              the graphs compiled: the forward, or with eager (opaque) nodes its pieces
  autodiff           the backward graph derived for the parameters (and inputs) that require grad
  simplify_backward  the backward after no-op removal, CSE and dead-code removal
  fuse               the kernels (forward and backward): ops, why each boundary exists, bytes moved
                     (format text or json)
  memory             each graph's buffers for intermediate results, and the bytes reuse saves (text)
  codegen            the generated numba source of every kernel (text); with --target cuda the CUDA source,
                     launch configuration and ptxas's registers per thread of every kernel (nothing runs)
  inference          the forward without gradients as nnc.compile runs it: the one numba function of
                     whole-graph mode (or why the forward runs kernel by kernel), then its kernels' source
Old names still accepted: traced, decomposed (= simplify), backward (= simplify_backward),
fused (= fuse), kernels (= codegen)."""

_DUMP_EPILOG = """\
examples:
  # the traced graph of a module-level instance
  nnc dump examples/models.py:mlp

  # with shapes and dtypes, as a table
  nnc dump examples/models.py:mlp --input 'float32[8,784]' --stage shapes --format table

  # a CNN as a Graphviz file (render with: dot -Tsvg cnn.dot -o cnn.svg)
  nnc dump examples/models.py:cnn --input 'float32[2,1,28,28]' --stage shapes --format dot --out cnn.dot

  # a transformer block, as JSON for other tools
  nnc dump examples/models.py:block --input 'float32[2,5,32]' --stage shapes --format json

  # batch-1 inference as one numba function (whole-graph mode)
  nnc dump examples/models.py:mlp --input 'float32[1,784]' --stage inference

  # a class is instantiated with no arguments; add --verbose for full tracebacks on errors
  nnc dump examples/models.py:TransformerBlock --input 'float32[2,5,32]' --verbose"""


_REPORT_DESCRIPTION = """\
Compile FILE.py:ATTR for the --input tensors (loaded as nnc dump loads them) and write one HTML page that
opens in any browser with no server and no network: the graph at every stage as SVG, the kernels with
their nodes highlighted on the graph and their generated source, why each kernel boundary exists, the
guards and recompiles of nnc.compile, and a time per kernel from a profiled run (forward and backward
when parameters require grad)."""

_REPORT_EPILOG = """\
examples:
  nnc report examples/models.py:block --input 'float32[2,5,32]' -o block.html
  nnc report examples/models.py:mlp --input 'float32[8,784]' --renderer python"""


class CliError(Exception):
    """A user-facing error: its message is printed as one paragraph, with no traceback unless --verbose."""

    def __init__(self, message: str, cause: BaseException | None = None):
        super().__init__(message)
        self.message, self.cause = message, cause


# -- argument parsing ------------------------------------------------------------------------------


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=30)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=_DESCRIPTION, epilog=_EPILOG, formatter_class=_Formatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True
    dump = sub.add_parser("dump", help="print a module's graph at a compiler stage",
                          description=_DUMP_DESCRIPTION, epilog=_DUMP_EPILOG, formatter_class=_Formatter)
    dump.add_argument("target", metavar="FILE.py:ATTR",
                      help="the Python file and the attribute in it that holds the module")
    dump.add_argument("--input", "-i", action="append", default=[], metavar="SPEC", dest="inputs",
                      help="one forward() argument as DTYPE[DIMS], e.g. 'float32[8,784]'; repeat for each "
                           "argument, in order")
    dump.add_argument("--stage", "-s", choices=STAGES + tuple(STAGE_ALIASES), default=None, metavar="STAGE",
                      help=f"which stage to show: {', '.join(STAGES)} (default: shapes when --input is given, "
                           f"else trace)")
    dump.add_argument("--format", "-f", choices=FORMATS, default="text", dest="fmt", metavar="FORMAT",
                      help=f"output format: {', '.join(FORMATS)} (default: text)")
    dump.add_argument("--out", "-o", metavar="FILE", default=None,
                      help="write the output to FILE instead of standard output")
    dump.add_argument("--target", "-t", choices=("cpu", "cuda"), default="cpu", dest="codegen_target",
                      help="the code generation target the kernel stages show (default: cpu)")
    dump.add_argument("--verbose", "-v", action="store_true",
                      help="show full Python tracebacks for errors, and progress on standard error")
    dump.set_defaults(run=cmd_dump)
    report = sub.add_parser("report", help="write one self-contained HTML page: graphs, kernels, timings, guards",
                            description=_REPORT_DESCRIPTION, epilog=_REPORT_EPILOG, formatter_class=_Formatter)
    report.add_argument("target", metavar="FILE.py:ATTR",
                        help="the Python file and the attribute in it that holds the module")
    report.add_argument("--input", "-i", action="append", default=[], metavar="SPEC", dest="inputs",
                        help="one forward() argument as DTYPE[DIMS]; repeat for each argument, in order")
    report.add_argument("--out", "-o", metavar="FILE", default="report.html", help="the page (default: report.html)")
    report.add_argument("--renderer", choices=("auto", "dot", "python"), default="auto",
                        help="how graphs are drawn: Graphviz's dot, nnc's own layout, or dot when installed (auto)")
    report.add_argument("--profile-seconds", type=float, default=0.5, metavar="S",
                        help="how long the profiled run of the compiled graphs lasts (default: 0.5)")
    report.add_argument("--verbose", "-v", action="store_true",
                        help="show full Python tracebacks for errors, and progress on standard error")
    report.set_defaults(run=cmd_report)
    return parser


# -- input specs ------------------------------------------------------------------------------------

_SPEC = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\[\s*([^\]]*?)\s*\]\s*$")


def parse_input_spec(spec: str) -> tuple[str, tuple[int, ...]]:
    """'float32[8,784]' -> ('float32', (8, 784)); raises CliError naming the grammar."""
    match = _SPEC.match(spec)
    if match is None:
        raise CliError(f"bad --input {spec!r}: {INPUT_GRAMMAR}.")
    dtype, dims_text = match.groups()
    if dtype not in DTYPES:
        close = difflib.get_close_matches(dtype, DTYPES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CliError(f"bad --input {spec!r}: unknown dtype {dtype!r}{hint}; {INPUT_GRAMMAR}.")
    dims: list[int] = []
    if dims_text:
        for part in dims_text.split(","):
            part = part.strip()
            if not re.fullmatch(r"[0-9]+", part):  # NOTE: str.isdigit also accepts '²', which int() refuses
                raise CliError(f"bad --input {spec!r}: dimension {part!r} is not a non-negative integer; "
                               f"{INPUT_GRAMMAR}.")
            dims.append(int(part))
    return dtype, tuple(dims)


def format_spec(dtype: str, dims: tuple[int, ...]) -> str:
    return f"{dtype}[{','.join(str(d) for d in dims)}]"


def make_inputs(specs: list[tuple[str, tuple[int, ...]]], seed: int = SEED) -> list:
    """Example tensors for the specs: standard normal floats (seeded), zeros for ints and bools."""
    import runtime

    generator = runtime.Generator()
    generator.manual_seed(seed)
    tensors = []
    for dtype_name, dims in specs:
        dtype = getattr(runtime, dtype_name)
        nbytes = math.prod(dims) * dtype.itemsize
        if nbytes > MAX_INPUT_BYTES:
            raise CliError(f"--input {format_spec(dtype_name, dims)} would take {nbytes / 2**30:.3g} GiB; example "
                           f"inputs are limited to {MAX_INPUT_BYTES // 2**30} GiB (shapes are what matter here).")
        try:
            if dtype_name.startswith(("float", "bfloat")):
                tensors.append(runtime.randn(*dims, generator=generator, dtype=dtype))
            else:
                tensors.append(runtime.zeros(*dims, dtype=dtype))
        except MemoryError as exc:
            raise CliError(f"not enough memory for --input {format_spec(dtype_name, dims)}.", exc) from exc
    return tensors


# -- loading the module -----------------------------------------------------------------------------


def split_target(target: str) -> tuple[str, str]:
    path, sep, attr = target.rpartition(":")
    attr = attr.strip()
    if not sep or not path or not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise CliError(f"bad target {target!r}: expected FILE.py:ATTR, a Python file and the (possibly dotted) "
                       f"name of the module in it, e.g. 'examples/models.py:mlp' or 'net.py:Net'.")
    return path, attr


def load_file(path: str):
    """Import the file at `path` as a fresh module, with its directory on sys.path while it runs."""
    if not os.path.exists(path):
        raise CliError(f"file not found: {path!r} (looked in {os.getcwd()}). Give the path to a Python file that "
                       f"defines the module, e.g. 'examples/models.py:mlp'.")
    if os.path.isdir(path):
        raise CliError(f"{path!r} is a directory: give the path to a Python file, "
                       f"e.g. '{path.rstrip('/')}/model.py:net'.")
    path = os.path.abspath(path)
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    name = f"_nnc_user_{stem}"
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    directory = os.path.dirname(path)
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        sys.modules.pop(name, None)
        raise
    except BaseException as exc:  # noqa: BLE001 - the user's file failed at import (SystemExit and the like too)
        sys.modules.pop(name, None)
        raise CliError(f"could not load {_rel(path)}: {_describe(exc)}{_user_location(exc, path)}.", exc) from exc
    finally:
        if added:
            try:
                sys.path.remove(directory)
            except ValueError:
                pass
    return module


def _module_attributes(module) -> list[str]:
    """Names in the file that `nnc dump` can use: Module instances, and Module subclasses defined there."""
    from runtime.nn import Module

    names = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if isinstance(value, Module):
            names.append(name)
        elif isinstance(value, type) and issubclass(value, Module) and value.__module__ == module.__name__:
            names.append(f"{name} (class)")
    return names


def resolve_module(module, attr: str, path: str):
    """The runtime Module that `attr` names in the loaded file (instantiating a class or calling a factory)."""
    from runtime.nn import Module

    where = f"{path}:{attr}"
    obj = module
    parts = attr.split(".")
    for i, part in enumerate(parts):
        if not hasattr(obj, part):
            if i == 0:
                available = _module_attributes(module)
                close = difflib.get_close_matches(part, [a.split(" ")[0] for a in available] or list(vars(module)), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                listing = (f"Module attributes in {path}: {', '.join(available)}." if available
                           else f"{path} defines no runtime.nn.Module instances or subclasses.")
                raise CliError(f"{path} has no attribute {part!r}.{hint} {listing}")
            raise CliError(f"{path}: {'.'.join(parts[:i])} ({type(obj).__name__} object) has no attribute {part!r}.")
        obj = getattr(obj, part)

    if isinstance(obj, Module):
        return obj
    if isinstance(obj, type):
        if not issubclass(obj, Module):
            raise CliError(f"{where} is the class {obj.__name__}, which is not a runtime.nn.Module subclass; "
                           f"nnc dump needs a Module (an instance, a Module subclass, or a zero-argument factory).")
        return _construct(obj, where, f"class {obj.__name__}", path)
    if callable(obj):
        made = _construct(obj, where, f"{getattr(obj, '__name__', type(obj).__name__)}()", path)
        if not isinstance(made, Module):
            raise CliError(f"{where} is a callable that returned {_type_name(made)}, not a runtime.nn.Module; "
                           f"nnc dump needs a Module (an instance, a Module subclass, or a zero-argument factory).")
        return made
    hint = ""
    if type(obj).__module__.split(".")[0] == "torch":
        hint = " (it is a real torch object: build the module with `import runtime as torch` instead)"
    raise CliError(f"{where} is {_type_name(obj)}, not a runtime.nn.Module{hint}; nnc dump needs a Module "
                   f"(an instance, a Module subclass, or a zero-argument callable that returns one).")


def _construct(factory, where: str, what: str, path: str):
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        required = [p.name for p in signature.parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if required:
            raise CliError(f"{where}: {what} needs arguments ({', '.join(required)}), but nnc dump can only call it "
                           f"with none. Add a module-level instance or a zero-argument factory to {path} and "
                           f"name that instead.")
    try:
        return factory()
    except Exception as exc:  # noqa: BLE001 - the user's constructor
        raise CliError(f"{where}: calling {what} failed: {_describe(exc)}{_user_location(exc, path)}.", exc) from exc


# -- stages -----------------------------------------------------------------------------------------


def _trace(module, where: str, path: str):
    from . import symbolic_trace
    from .trace import TraceError

    try:
        return symbolic_trace(module)
    except TraceError as exc:
        raise CliError(f"could not trace {where}: {exc}", exc) from exc
    except Exception as exc:  # noqa: BLE001 - user code raising under tracing
        raise CliError(f"tracing {where} failed: {_describe(exc)}{_user_location(exc, path)}. "
                       f"Tracing runs forward() on symbolic values, so code that needs real tensor values "
                       f"cannot be traced.", exc) from exc


def _check_arity(module, specs, where: str) -> None:
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        return
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in positional]
    required = [p.name for p in positional if p.default is p.empty]
    if len(specs) > len(names) or len(specs) < len(required):
        wanted = (f"{len(required)}" if len(required) == len(names)
                  else f"{len(required)} to {len(names)}")
        raise CliError(f"{where}: forward() takes {wanted} input{'s' if len(names) != 1 else ''} "
                       f"({', '.join(names) or 'none'}), but {len(specs)} --input "
                       f"{'was' if len(specs) == 1 else 'were'} given. Give one --input DTYPE[DIMS] per argument, "
                       f"in order.")


def _compile_to(module, specs, stage: str, where: str, path: str, codegen: bool = True):
    """The compiler's pipeline run on `module` for the --input tensors, as nnc.compile runs it: up to `stage` for
    a graph stage, to the end for the kernel views (codegen=False: no CPU kernels compiled, for --target cuda)."""
    from runtime.autograd import no_grad

    from .compile import bind_arguments, split_arguments
    from .pipeline import Compilation, PipelineError, run_stages

    concrete, examples = split_arguments(bind_arguments(module, tuple(make_inputs(specs)), {}))
    needs_grad = stage != "inference" and any(p.requires_grad for p in module.parameters())
    compilation = Compilation(module, concrete, examples, needs_grad, codegen=codegen)
    try:
        with no_grad():  # as nnc.compile builds it
            return run_stages(compilation, until=stage if stage in GRAPH_STAGES else None)
    except PipelineError as exc:
        raise _stage_error(exc, list(examples), specs, where, path) from exc.cause


def _stage_error(exc, names: list, specs, where: str, path: str) -> CliError:
    """The CliError for a failed pipeline stage: tracing and shape errors name the user's line or node."""
    from .trace import TraceError

    cause = exc.cause
    if exc.stage == "trace" and isinstance(cause, TraceError):
        return CliError(f"could not trace {where}: {cause}", cause)
    if exc.stage == "trace":
        return CliError(f"tracing {where} failed: {_describe(cause)}{_user_location(cause, path)}. Tracing runs "
                        f"forward() on symbolic values, so code that needs real tensor values cannot be traced.", cause)
    if exc.stage == "shapes":
        return CliError(f"{where} failed to run on the given inputs ({_given(names, specs)}): {_describe(cause)}."
                        f"{_failed_at(cause)} Check that the --input shapes and dtypes match what forward() expects.",
                        cause)
    return CliError(f"{where}: the compiler's {exc.stage} stage failed ({_describe(cause)}).", cause)


def _given(names: list, specs) -> str:
    return ", ".join(f"{n}: {format_spec(*s)}" for n, s in zip(names, specs))


def _failed_at(exc: BaseException) -> str:
    """' It failed at node N (op target), from FILE:LINE: `source`.' for the node the interpreter was running."""
    node = _failing_node(exc)
    if node is None:
        return ""
    at = f" It failed at node {node.name} ({node.op} {_target_text(node)})"
    source = _node_source(node)
    if source:
        at += f", from {source}"
        if node.meta.get("source_line"):
            at += f": `{node.meta['source_line']}`"
    return at + "."


def _failing_node(exc: BaseException):
    """The graph node the Interpreter was running when `exc` was raised (innermost run_node frame)."""
    from .graph import Node

    found = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "run_node" and isinstance(frame.f_locals.get("node"), Node):
            found = frame.f_locals["node"]
        tb = tb.tb_next
    return found


def _node_source(node) -> str | None:
    """node.meta['source'] when it names the user's code. A node recorded inside runtime itself (the traced root
    is a built-in layer) gets the first frame outside runtime/nnc, which is whoever ran nnc: drop that."""
    source = node.meta.get("source")
    if not source:
        return None
    filename, _, line = source.rpartition(":")
    ours = {(os.path.abspath(f.filename), f.lineno) for f in traceback.extract_stack()}
    if not line.isdigit() or not os.path.isfile(filename) or (os.path.abspath(filename), int(line)) in ours:
        return None
    return source


def _graph_stage(compilation, stage: str, fmt: str, where: str) -> str:
    """The graphs a graph stage made: one in any format, several (pieces) as text, table or python."""
    from .pipeline import stage_graphs
    from .printer import format_graph

    graphs = stage_graphs(compilation, stage)
    if not graphs:
        errors = [g.backward_error for g in compilation.graphs if g.backward_error]
        if errors:
            raise CliError(f"{where} has no compiled backward: {errors[0]}. Its gradients run through eager autograd.")
        raise CliError(f"{where} has no backward graph: no parameter requires grad (and --input tensors do not).")
    if len(graphs) == 1:
        (_, gm), = graphs
        return format_graph(gm.graph, fmt, module=gm)
    if fmt in ("dot", "json"):
        raise CliError(f"--stage {stage} made {len(graphs)} graphs ({', '.join(label for label, _ in graphs)}); "
                       f"--format {fmt} shows one graph: use text, table or python.")
    return "\n\n".join(f"# {label}\n{format_graph(gm.graph, fmt, module=gm)}" for label, gm in graphs)


def _kernel_source(k) -> str:
    """A kernel's generated source, or a comment saying how it runs without one."""
    how = "a numpy view of its input" if k.view else "runs in the interpreter"
    return k.source or f"# {k.name} ({k.kind}): {how}"


def _memory_text(compilation) -> str:
    """Each plan's buffers for intermediate results (nnc.passes.memory)."""
    lines = []
    for name, graph in zip(compilation.graph_names(), compilation.graphs):
        for role, plan in (("forward", graph.forward_plan), ("training forward", graph.training_plan),
                           ("backward", graph.backward_plan)):
            if plan is None:
                continue
            lines.append(f"# {name} {role}: {len(plan.kernels)} kernels")
            lines.append(plan.memory.summary() if plan.memory is not None else
                         "no buffers: the graph runs as one numba function, which holds its intermediates")
    return "\n".join(lines)


def _kernel_stage(compilation, stage: str, fmt: str, target: str = "cpu") -> str:
    """The fused kernels (a table or JSON), their buffers, or their generated source (for the target)."""
    import dataclasses
    import json

    from .explain import report as explain_report

    allowed = ("text", "json") if stage == "fuse" else ("text",)
    if fmt not in allowed:
        raise CliError(f"--stage {stage} prints as {' or '.join(allowed)}, not {fmt!r}.")
    if stage == "memory":
        return _memory_text(compilation)
    report = explain_report(compilation, target)
    if stage == "inference":
        sources = [report.whole_graph_source] if report.whole_graph else []
        return "\n\n".join(["# " + report.forward_mode()] + sources + [_kernel_source(k) for k in report.kernels])
    if stage == "codegen":
        return "\n\n".join(_kernel_source(k) for k in report.kernels + report.backward_kernels)
    if fmt == "json":
        strip = lambda k: {key: v for key, v in dataclasses.asdict(k).items() if key != "source"}  # noqa: E731
        return json.dumps({"forward": [strip(k) for k in report.kernels],
                           "backward": [strip(k) for k in report.backward_kernels],
                           "compile_seconds": report.compile_seconds, "cache_hits": report.cache_hits,
                           "opaque_nodes": report.opaque_nodes}, indent=1)
    return str(report)


def _target_text(node) -> str:
    if isinstance(node.target, str):
        return node.target
    from .graph import target_name

    return target_name(node.target)


# -- the dump command -------------------------------------------------------------------------------


def cmd_dump(args) -> int:
    stage = STAGE_ALIASES.get(args.stage, args.stage) or ("shapes" if args.inputs else "trace")
    specs = [parse_input_spec(s) for s in args.inputs]
    if stage != "trace" and not specs:
        raise CliError(f"--stage {stage} needs example inputs: give one --input DTYPE[DIMS] per forward() argument, "
                       "e.g. --input 'float32[8,784]'. Or use --stage trace, which needs none.")
    path, attr = split_target(args.target)
    where = f"{path}:{attr}"
    _progress(args, f"loading {path}")
    module = resolve_module(load_file(path), attr, path)
    if not specs:
        _progress(args, f"tracing {where} ({type(module).__name__}) symbolically")
        gm = _trace(module, where, path)
        return _write(args, _format(gm, args.fmt), stage)
    _check_arity(module, specs, where)
    _progress(args, f"running the compiler's stages up to {stage} on {', '.join(format_spec(*s) for s in specs)}")
    compilation = _compile_to(module, specs, stage, where, path, codegen=args.codegen_target == "cpu")
    if stage in GRAPH_STAGES:
        return _write(args, _graph_stage(compilation, stage, args.fmt, where), stage)
    return _write(args, _kernel_stage(compilation, stage, args.fmt, args.codegen_target), stage)


def cmd_report(args) -> int:
    """`nnc report`: the HTML page of nnc.report for the module and inputs."""
    from .pipeline import PipelineError
    from .report import build_report

    specs = [parse_input_spec(s) for s in args.inputs]
    if not specs:
        raise CliError("nnc report needs example inputs: give one --input DTYPE[DIMS] per forward() argument, "
                       "e.g. --input 'float32[8,784]'.")
    path, attr = split_target(args.target)
    where = f"{path}:{attr}"
    _progress(args, f"loading {path}")
    module = resolve_module(load_file(path), attr, path)
    _check_arity(module, specs, where)
    inputs = make_inputs(specs)
    try:
        page = build_report(module, inputs, title=where, renderer=args.renderer,
                            profile_seconds=max(0.0, args.profile_seconds),
                            progress=lambda message: _progress(args, message))
    except PipelineError as exc:
        raise _stage_error(exc, [f"input {k}" for k in range(len(specs))], specs, where, path) from exc.cause
    args.fmt = "html"
    return _write(args, page, "all")


def _format(gm, fmt: str) -> str:
    from .printer import format_graph

    return format_graph(gm.graph, fmt, module=gm)


def _write(args, text: str, stage: str) -> int:
    if not text.endswith("\n"):
        text += "\n"
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise CliError(f"could not write {args.out!r}: {exc.strerror or exc}.", exc) from exc
        _progress(args, f"wrote {args.out} ({args.fmt}, stage {stage})")
    else:
        sys.stdout.write(text)
    return 0


# -- helpers ----------------------------------------------------------------------------------------


def _progress(args, message: str) -> None:
    if getattr(args, "verbose", False):
        print(f"{PROG}: {message}", file=sys.stderr)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _type_name(obj) -> str:
    if obj is None:
        return "None"
    name = type(obj).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _user_location(exc: BaseException, path: str) -> str:
    """' (at FILE:LINE: `source`)' for the innermost traceback frame in the user's file, or ''."""
    path = os.path.abspath(path)
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.abspath(frame.filename) == path:
            found = frame
    if found is None and isinstance(exc, SyntaxError) and exc.filename and os.path.abspath(exc.filename) == path:
        return f" (at {_rel(path)}:{exc.lineno})"
    if found is None:
        return ""
    line = f": `{found.line.strip()}`" if found.line else ""
    return f" (at {_rel(path)}:{found.lineno}{line})"


def _paragraph(message: str) -> str:
    """The message on one line (one paragraph; the terminal wraps it)."""
    return " ".join(message.split())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `nnc` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", False)
    try:
        return args.run(args)
    except CliError as exc:
        if verbose:
            if exc.cause is not None:
                traceback.print_exception(type(exc.cause), exc.cause, exc.cause.__traceback__, file=sys.stderr)
            else:
                traceback.print_exc(file=sys.stderr)
        print(_paragraph(f"{PROG} {args.command}: error: {exc.message}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug in nnc itself: say so, briefly
        if verbose:
            traceback.print_exc(file=sys.stderr)
        print(_paragraph(f"{PROG} {args.command}: internal error: {_describe(exc)}. This is a bug in nnc; "
                         f"re-run with --verbose for the full traceback."), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
