"""`nnc report`: one self-contained HTML page showing what the compiler makes of a module (graphs, kernels, timings).

The page needs no server and no network: the graphs of every stage are inline SVG (Graphviz's `dot` when it is on
PATH, else the layered layout below), the kernels' generated sources are highlighted with Python's tokenize, and a
little inline JavaScript switches stages and highlights a kernel's nodes when the kernel is clicked.

What it shows comes from the entry points everything else uses: `pipeline.run_stages` (stopped after each graph
stage, as `nnc dump --stage` is), the kernels and plans of the finished `Compilation`, `explain.report`, and
`nnc.compile` itself for the guards and recompiles. The timings come from `nnc.profile` around a few forward (and
backward) calls of the compiled graphs: its events give each kernel's times, its table and Chrome trace go on the page.
"""
from __future__ import annotations

import base64
import contextlib
import copy
import html
import io
import json
import os
import shutil
import statistics
import subprocess
import time
import tokenize
from dataclasses import dataclass, field

from .graph import Graph, target_name

KIND_COLORS = {"elementwise": "#cfe3ff", "reduction": "#ffd9a8", "row": "#ffc080", "matmul": "#c7ecc5",
               "opaque": "#e4e4e4", "view": "#f2f2f2", "whole": "#e9d8ff"}
_PLACEHOLDER_COLOR = "#fff6c4"


# -- graph drawing: Graphviz when installed, else a layered layout of our own --------------------------------------


def node_label(node) -> list[str]:
    """The lines a node's box shows: name, target, and type."""
    lines = [node.name]
    if node.op in ("placeholder", "get_attr", "output"):
        lines.append(node.op if node.op != "get_attr" else f"get_attr {node.target}")
    else:
        lines.append(target_name(node.target).replace("runtime.", ""))
    shape, dtype = node.meta.get("shape"), node.meta.get("dtype")
    if shape is not None or dtype is not None:
        lines.append((getattr(dtype, "name", "") or "") + ("" if shape is None else f"[{', '.join(map(str, shape))}]"))
    return lines


def graph_svg(graph: Graph, renderer: str = "auto") -> str:
    """The graph as an SVG element: each node a `<g class="node">` whose `<title>` is the node's name."""
    if renderer == "dot" or (renderer == "auto" and shutil.which("dot")):
        svg = _dot_svg(graph)
        if svg is not None:
            return svg
    return layered_svg(graph)


# small type and tight spacing, close to the layered layout's (the printer's DOT sets neither)
DOT_COMMAND = ["dot", "-Tsvg", "-Nfontsize=10", "-Nmargin=0.06,0.02", "-Granksep=0.3", "-Gnodesep=0.15"]


def _dot_svg(graph: Graph) -> str | None:
    from .printer import format_graph

    try:
        result = subprocess.run(DOT_COMMAND, input=format_graph(graph, "dot"), capture_output=True, text=True,
                                timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    svg = result.stdout
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else None


@dataclass
class _Box:
    name: str
    lines: list
    layer: int = 0
    width: float = 8.0
    height: float = 0.0
    x: float = 0.0
    y: float = 0.0
    dummy: bool = False
    op: str = ""
    preds: list = field(default_factory=list)
    succs: list = field(default_factory=list)


_CHAR_W, _LINE_H, _GAP_X, _GAP_Y, _MARGIN = 6.6, 13.0, 22.0, 36.0, 12.0


def layered_svg(graph: Graph) -> str:
    """A top-down layered drawing (Sugiyama-style): longest-path layers, dummy nodes on long edges, barycentre
    ordering sweeps, then x positions pulled towards each node's neighbours."""
    boxes = {}
    for node in graph.nodes:
        lines = node_label(node)
        boxes[node.name] = _Box(node.name, lines, width=max(map(len, lines)) * _CHAR_W + 14,
                                height=len(lines) * _LINE_H + 8, op=node.op)
    edges = [(arg.name, node.name) for node in graph.nodes for arg in dict.fromkeys(node.all_input_nodes)]
    for u, v in edges:
        boxes[u].succs.append(v)
        boxes[v].preds.append(u)
    for node in graph.nodes:  # graph order is topological
        box = boxes[node.name]
        box.layer = max((boxes[p].layer + 1 for p in box.preds), default=0)
    for node in reversed(graph.nodes):  # then as late as the users allow: a parameter sits above its first reader
        box = boxes[node.name]
        if box.succs:
            box.layer = max(box.layer, min(boxes[s].layer for s in box.succs) - 1)
    # long edges go through one dummy per layer they cross
    routes = []
    for u, v in edges:
        chain = [u]
        for layer in range(boxes[u].layer + 1, boxes[v].layer):
            name = f"\0{u}>{v}>{layer}"
            boxes[name] = _Box(name, [], layer=layer, dummy=True)
            chain.append(name)
        chain.append(v)
        routes.append(chain)
    for box in boxes.values():
        box.preds, box.succs = [], []
    for chain in routes:
        for a, b in zip(chain, chain[1:]):
            boxes[a].succs.append(b)
            boxes[b].preds.append(a)
    layers: list[list[_Box]] = [[] for _ in range(max((b.layer for b in boxes.values()), default=0) + 1)]
    for box in boxes.values():
        layers[box.layer].append(box)
    order = {box.name: i for layer in layers for i, box in enumerate(layer)}

    def sweep(sequence, neighbours):
        for layer in sequence:
            def key(box):
                near = [order[n] for n in getattr(box, neighbours)]
                return sum(near) / len(near) if near else order[box.name]
            layer.sort(key=key)
            order.update({box.name: i for i, box in enumerate(layer)})

    for _ in range(6):
        sweep(layers[1:], "preds")
        sweep(list(reversed(layers[:-1])), "succs")
    # x: pack each layer, then pull towards the neighbours' centres, keeping the order and the gaps
    for layer in layers:
        x = 0.0
        for box in layer:
            box.x = x + box.width / 2
            x += box.width + _GAP_X
    for _ in range(8):
        for sequence, attr in ((layers, "preds"), (list(reversed(layers)), "succs")):
            for layer in sequence:
                wanted = []
                for box in layer:
                    near = [boxes[n].x for n in getattr(box, attr)] or [box.x]
                    wanted.append(sum(near) / len(near))
                _place(layer, wanted)
    left = min((b.x - b.width / 2 for b in boxes.values()), default=0.0)
    y = _MARGIN
    for layer in layers:
        tall = max((b.height for b in layer), default=0.0)
        for box in layer:
            box.x += _MARGIN - left
            box.y = y + tall / 2
        y += tall + _GAP_Y
    width = max((b.x + b.width / 2 for b in boxes.values()), default=0.0) + _MARGIN
    height = y - _GAP_Y + _MARGIN
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width:.0f}" height="{height:.0f}" '
             f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" font-size="11">',
             '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
             'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#777"/></marker></defs>', '<g class="edges">']
    for chain in routes:
        points = [(boxes[n].x, boxes[n].y) for n in chain]
        start, end = boxes[chain[0]], boxes[chain[-1]]
        points[0] = (start.x, start.y + start.height / 2)
        points[-1] = (end.x, end.y - end.height / 2)
        path = f"M{points[0][0]:.1f},{points[0][1]:.1f}"
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            middle = (y0 + y1) / 2
            path += f" C{x0:.1f},{middle:.1f} {x1:.1f},{middle:.1f} {x1:.1f},{y1:.1f}"
        parts.append(f'<path class="edge" data-from="{html.escape(chain[0])}" data-to="{html.escape(chain[-1])}" '
                     f'd="{path}" fill="none" stroke="#999" marker-end="url(#arrow)"/>')
    parts.append("</g>")
    for box in boxes.values():
        if box.dummy:
            continue
        x0, y0 = box.x - box.width / 2, box.y - box.height / 2
        rx = box.height / 2 if box.op in ("placeholder", "output") else 3
        fill = _PLACEHOLDER_COLOR if box.op in ("placeholder", "get_attr") else "#ffffff"
        parts.append(f'<g class="node" data-node="{html.escape(box.name)}"><title>{html.escape(box.name)}</title>'
                     f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{box.width:.1f}" height="{box.height:.1f}" rx="{rx:.1f}" '
                     f'fill="{fill}" stroke="#555"/>')
        for i, line in enumerate(box.lines):
            weight = ' font-weight="bold"' if i == 0 else ""
            parts.append(f'<text x="{box.x:.1f}" y="{y0 + 4 + _LINE_H * (i + 0.8):.1f}" text-anchor="middle"{weight}>'
                         f'{html.escape(line)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


def _place(layer: list, wanted: list) -> None:
    """x positions as close to `wanted` as the order and the gaps allow (left to right, then the whole layer shifted
    so that its mean error is zero, then left to right again)."""
    if not layer:
        return
    xs = []
    for box, want in zip(layer, wanted):
        if xs:
            prev = layer[len(xs) - 1]
            want = max(want, xs[-1] + prev.width / 2 + _GAP_X + box.width / 2)
        xs.append(want)
    shift = sum(w - x for w, x in zip(wanted, xs)) / len(xs)
    for box, x in zip(layer, xs):
        box.x = x + shift


# -- source highlighting ---------------------------------------------------------------------------------------

_KEYWORDS = frozenset(__import__("keyword").kwlist)
_BUILTINS = frozenset(dir(__import__("builtins")))


def highlight_python(source: str) -> str:
    """HTML of `source` with spans for keywords, names of builtins, strings, numbers, comments and decorators."""
    lines = source.splitlines(keepends=True)
    out, row, col = [], 1, 0

    def copy_to(r, c):
        nonlocal row, col
        while row < r:
            out.append(html.escape(lines[row - 1][col:]))
            row, col = row + 1, 0
        if row <= len(lines):
            out.append(html.escape(lines[row - 1][col:c]))
        col = c

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return html.escape(source)
    previous = None
    for token in tokens:
        if token.type in (tokenize.ENDMARKER,):
            break
        (r0, c0), (r1, c1) = token.start, token.end
        copy_to(r0, c0)
        text = token.string
        cls = None
        if token.type == tokenize.COMMENT:
            cls = "com"
        elif token.type == tokenize.STRING:
            cls = "str"
        elif token.type == tokenize.NUMBER:
            cls = "num"
        elif token.type == tokenize.NAME:
            if text in _KEYWORDS:
                cls = "kw"
            elif previous is not None and previous.string in ("def", "class"):
                cls = "def"
            elif text in _BUILTINS:
                cls = "bi"
        elif token.type == tokenize.OP and text == "@":
            cls = "kw"
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            previous = token
        chunk = html.escape(text)
        out.append(f'<span class="{cls}">{chunk}</span>' if cls else chunk)
        row, col = r1, c1
    copy_to(len(lines) + 1, 0)
    return "".join(out)


# -- what the page is made of ------------------------------------------------------------------------------------


@dataclass
class KernelInfo:
    id: str            # unique in the page: plan index + kernel name
    name: str
    kind: str
    plan: str          # the plan's label, e.g. "MLP training forward"
    nodes: list
    ops: list
    reason: str
    boundaries: list   # (producer, consumer, reason)
    bytes_moved: int
    how: str           # numba / numpy view / interpreted: why
    source: str
    seconds: list = field(default_factory=list)  # one per profiled call


@dataclass
class PlanView:
    label: str
    svg: str
    kernels: list


def _plans(compilation) -> list[tuple[str, object]]:
    labelled = []
    for name, graph in zip(compilation.graph_names(), compilation.graphs):
        for role, plan in (("forward", graph.forward_plan), ("training forward", graph.training_plan),
                           ("backward", graph.backward_plan)):
            if plan is not None:
                labelled.append((f"{name} {role}", plan))
    return labelled


def _kernel_infos(index: int, label: str, plan) -> list[KernelInfo]:
    failed = dict(getattr(plan, "fallbacks", ()))
    whole = getattr(plan, "whole_graph", False)
    infos = []
    for k, kernel in enumerate(plan.kernels):
        step = plan.steps[0] if whole else (plan.steps[k] if k < len(plan.steps) else None)
        kind_of_step = type(step).__name__
        if whole:
            how = ("numba, in the one whole-graph function (the time shown is the whole function's)" if k == 0 else
                   "numba, in the one whole-graph function (timed with the first kernel)")
        elif kind_of_step == "KernelStep":
            how = "numba"
        elif kind_of_step == "ViewStep":
            how = "a numpy view (no code)"
        else:
            how = "interpreted" + (f": {failed[kernel.name]}" if kernel.name in failed else
                                   f" ({getattr(step, 'reason', 'opaque')})")
        ops = list(kernel.meta.get("ops") or [target_name(n.target) for n in kernel.nodes])
        boundaries = [(getattr(p, "name", p), getattr(c, "name", c), r)
                      for p, c, r in kernel.meta.get("boundaries", ())]
        infos.append(KernelInfo(f"p{index}-{kernel.name}", kernel.name, kernel.kind, label,
                                [n.name for n in kernel.nodes], ops, kernel.reason, boundaries,
                                int(kernel.meta.get("bytes_moved", 0)), how, kernel.meta.get("source", "") or ""))
    return infos


def profile_plans(compilation, plans: list, kernels: dict, needs_grad: bool, seconds: float = 0.5,
                  max_calls: int = 200) -> dict:
    """Run the compiled graphs (forward, and backward with gradients) for about `seconds` under nnc.profile; each
    plan step's times land in its KernelInfo.seconds (a whole-graph run's in its first kernel's). Returns {"calls",
    "step_seconds" (median forward+backward), "profile" (the nnc.profile, eager ops included)}."""
    from runtime.autograd import enable_grad, no_grad

    from runtime.utils import _pytree as pytree
    from .profile import profile

    info_of = {}  # id(Kernel) or id(Plan) -> KernelInfo
    for index, (_, plan) in enumerate(plans):
        infos = [kernels[f"p{index}-{k.name}"] for k in plan.kernels]
        info_of.update((id(kernel), info) for kernel, info in zip(plan.kernels, infos))
        if infos:
            info_of[id(plan)] = infos[0]
    tensors = compilation.tensors
    prof = profile(record_compile=False)

    def one_call():
        with prof.record("call"):
            if needs_grad:
                with enable_grad():
                    out = compilation.run(tensors, True)
                    leaves = [t for t in pytree.tensor_leaves([out]) if t.requires_grad]
                    if leaves:
                        sum(leaf.float().sum() for leaf in leaves).backward()
            else:
                with no_grad():
                    compilation.run(tensors, False)

    try:
        for _ in range(2):  # warm up: first calls allocate buffers
            one_call()
        with prof:
            began = time.perf_counter()
            calls = 0
            while calls < max_calls and (calls < 5 or time.perf_counter() - began < seconds):
                one_call()
                calls += 1
    finally:
        for p in compilation.module.parameters():
            p.grad = None
    totals = []
    for event in prof.events:
        if event.cat == "user":
            totals.append(event.seconds)
        elif event.cat in ("kernel", "view", "interpreted", "whole_graph"):
            info = info_of.get(id(event.source))
            if info is not None:
                info.seconds.append(event.seconds)
    return {"calls": len(totals), "step_seconds": statistics.median(totals) if totals else 0.0, "profile": prof}


def guards_and_recompiles(module, inputs: list) -> dict:
    """Compile `module` with nnc.compile and call it as training does (with gradients), then for inference (no_grad,
    which is another guard value): what each compiled variant assumes, and why each compile happened."""
    from runtime.autograd import no_grad

    from runtime.utils import _pytree as pytree
    from .compile import compile as nnc_compile

    compiled = nnc_compile(module)
    messages = io.StringIO()
    previous = os.environ.get("NNC_DEBUG")
    os.environ["NNC_DEBUG"] = "1"
    try:
        with contextlib.redirect_stderr(messages):
            out = compiled(*inputs)
            leaves = [t for t in pytree.tensor_leaves([out]) if t.requires_grad]
            if leaves:
                sum(leaf.float().sum() for leaf in leaves).backward()
            with no_grad():
                compiled(*inputs)
    finally:
        if previous is None:
            os.environ.pop("NNC_DEBUG", None)
        else:
            os.environ["NNC_DEBUG"] = previous
        for p in module.parameters():
            p.grad = None
    compiles = [line[len("[nnc] "):] for line in messages.getvalue().splitlines()
                if line.startswith("[nnc] compiling")]
    variants = []
    for key in getattr(compiled, "_keys", []):  # NOTE: the guard keys; their layout is nnc.compile's own business
        variants.append(_describe_guard(key))
    return {"compiles": compiles, "variants": variants, "limit": getattr(compiled, "recompile_limit", None),
            "log": [line for line in messages.getvalue().splitlines() if line.startswith("[nnc]")]}


def _dtype_name(text: str) -> str:
    import numpy as np

    try:
        return np.dtype(text).name
    except TypeError:
        return text


def _device_of_storage(kind) -> str:
    """"the CPU" or "CUDA", from a guard's storage type (numpy's array, or a numba device array)."""
    import numpy as np

    return "the CPU" if kind is np.ndarray else "CUDA"


def _describe_guard(key) -> list[str]:
    """Readable lines for one guard key of nnc.compile (falls back to its repr if the layout is unfamiliar)."""
    try:
        parts, training, grad, params, hooks, storage, autocast, _tree = key
        lines = []
        for part in parts:
            if len(part) == 6 and part[1] == "tensor":
                name, _, shape, dtype, requires, kind = part
                lines.append(f"{name}: tensor, shape {tuple(shape)}, dtype {_dtype_name(dtype)}, "
                             f"requires_grad={bool(requires)}, on {_device_of_storage(kind)}")
            elif len(part) == 3 and part[1] == "python":
                lines.append(f"{part[0]}: the Python value {part[2]!r}")
            else:
                lines.append(f"{part[0]}: nested tensors {part[2]!r}")
        flags = training if isinstance(training, tuple) else (training,)
        sub = f"; {sum(map(bool, flags[1:]))} of {len(flags) - 1} submodules in training mode" if len(flags) > 1 else ""
        lines.append(f"module.training is {bool(flags[0])}{sub}")
        lines.append(f"grad mode is {'on' if grad else 'off'}"
                     + (f"; autocast to {autocast.name}" if autocast is not None else ""))
        lines.append(f"{sum(map(bool, params))} of {len(params)} parameters require grad"
                     + (f", on {_device_of_storage(storage)}" if storage is not None else ""))
        hooked, global_hooks = hooks
        lines.append(f"{sum(map(bool, hooked))} submodules have hooks; global hooks: "
                     f"{'yes' if any(global_hooks) else 'none'}")
        return lines
    except (TypeError, ValueError):
        return [repr(key)[:400]]


# -- the page --------------------------------------------------------------------------------------------------


def build_report(module, inputs: list, title: str = "", renderer: str = "auto", profile_seconds: float = 0.5,
                 progress=None) -> str:
    """The HTML page for `module` called with the tensors `inputs` (forward's positional arguments)."""
    from runtime.autograd import no_grad

    from .compile import bind_arguments, split_arguments
    from .explain import report as explain_report
    from .pipeline import STAGES, Compilation, run_stages, stage_graphs

    say = progress or (lambda message: None)
    title = title or type(module).__name__
    concrete, examples = split_arguments(bind_arguments(module, tuple(inputs), {}))
    needs_grad = any(p.requires_grad for p in module.parameters())
    compilation = Compilation(module, concrete, examples, needs_grad)
    stages = []  # (name, summary, [(label, svg)], seconds)
    graph_stages = [s for s in STAGES if s.name not in ("fuse", "memory", "codegen")]
    with no_grad():  # as nnc.compile builds it
        for stage in STAGES:
            say(f"stage {stage.name}")
            run_stages(compilation, until=stage.name)
            if stage in graph_stages:
                drawn = [(label, graph_svg(gm.graph, renderer)) for label, gm in stage_graphs(compilation, stage.name)]
                stages.append((stage.name, stage.summary, drawn, compilation.seconds.get(stage.name, 0.0)))
    plans = _plans(compilation)
    views, kernels = [], {}
    for index, (label, plan) in enumerate(plans):
        infos = _kernel_infos(index, label, plan)
        kernels.update((info.id, info) for info in infos)
        views.append(PlanView(label, graph_svg(plan.gm.graph, renderer), infos))
    say("profiling")
    profile = profile_plans(compilation, plans, kernels, needs_grad, seconds=profile_seconds)
    say("guards")
    guards = guards_and_recompiles(module, inputs)
    summary = str(explain_report(compilation))
    return _page(title, inputs, stages, views, kernels, profile, guards, summary, compilation, renderer)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _page(title, inputs, stages, views, kernels, profile, guards, summary, compilation, renderer) -> str:
    esc = html.escape
    input_text = ", ".join(f"{t.dtype.name}[{', '.join(map(str, t.shape))}]" for t in inputs)
    drawn_by = "Graphviz dot" if (renderer == "dot" or (renderer == "auto" and shutil.which("dot"))) else \
        "nnc's layered layout (install Graphviz for dot's)"
    total_kernel = sum(sum(k.seconds) for k in kernels.values()) / max(profile["calls"], 1)
    tabs, panes = [], []
    for i, (name, summary_line, drawn, seconds) in enumerate(stages):
        tabs.append(f'<button class="tab" data-pane="stage-{name}">{esc(name)}</button>')
        body = "".join(f'<h3>{esc(label)}</h3><div class="svgbox">{svg}</div>' for label, svg in drawn) or \
            "<p>No graph at this stage (nothing requires grad, so there is no backward).</p>"
        panes.append(f'<section class="pane" id="stage-{name}"><p class="summary">{esc(summary_line)} '
                     f'<span class="muted">({seconds * 1e3:.1f} ms)</span></p>{body}</section>')
    tabs.append('<button class="tab" data-pane="kernels">kernels</button>')
    kernel_sections = []
    for view in views:
        rows = []
        for k in view.kernels:
            mean = statistics.mean(k.seconds) if k.seconds else None
            timing = f"{mean * 1e6:.1f} us" if mean is not None else "-"
            rows.append(f'<li class="kernel" data-kernel="{esc(k.id)}" style="border-left-color:'
                        f'{KIND_COLORS.get(k.kind, "#ccc")}"><b>{esc(k.name)}</b> <span class="muted">{esc(k.kind)}'
                        f' · {len(k.nodes)} nodes · {timing}</span><br><span class="ops">{esc(", ".join(k.ops))}'
                        f'</span></li>')
        kernel_sections.append(
            f'<div class="plan"><h3>{esc(view.label)} <span class="muted">({len(view.kernels)} kernels)</span></h3>'
            f'<div class="plancols"><ul class="kernels">{"".join(rows)}</ul>'
            f'<div class="svgbox plangraph">{view.svg}</div></div></div>')
    panes.append('<section class="pane" id="kernels"><p class="summary">Click a kernel to highlight its nodes and '
                 'see its source; click a node to select its kernel.</p>' + "".join(kernel_sections) +
                 '<div id="detail"><p class="muted">No kernel selected.</p></div></section>')
    # profile table
    prof_rows = []
    for k in sorted(kernels.values(), key=lambda k: -sum(k.seconds)):
        if not k.seconds:
            continue
        mean = statistics.mean(k.seconds)
        share = sum(k.seconds) / max(sum(sum(x.seconds) for x in kernels.values()), 1e-12)
        rate = f"{k.bytes_moved / mean / 1e9:.2f}" if mean > 0 and k.bytes_moved else "-"
        prof_rows.append(f'<tr class="prof" data-kernel="{esc(k.id)}"><td>{esc(k.plan)}</td><td>{esc(k.name)}</td>'
                         f'<td>{esc(k.kind)}</td><td>{len(k.seconds)}</td><td class="r">{mean * 1e6:.1f}</td>'
                         f'<td class="r">{statistics.median(k.seconds) * 1e6:.1f}</td><td class="r">{share:.1%}</td>'
                         f'<td class="r">{_fmt_bytes(k.bytes_moved)}</td><td class="r">{rate}</td></tr>')
    profile_html = (f'<p>{profile["calls"]} profiled calls of the compiled graphs '
                    f'({"forward and backward" if compilation.needs_grad else "forward"}); median call '
                    f'{profile["step_seconds"] * 1e3:.3f} ms, of which the kernels take {total_kernel * 1e3:.3f} ms '
                    f'(the rest is Python between them and autograd).</p>'
                    '<table class="proftable"><tr><th>graph</th><th>kernel</th><th>kind</th><th>calls</th>'
                    '<th>mean us</th><th>median us</th><th>share</th><th>bytes moved</th><th>GB/s</th></tr>'
                    + "".join(prof_rows[:30]) + "</table>"
                    + (f'<details><summary>{len(prof_rows) - 30} more kernels</summary><table class="proftable">'
                       + "".join(prof_rows[30:]) + "</table></details>" if len(prof_rows) > 30 else "")
                    + _profile_extras(profile.get("profile")))
    guard_html = "<ol>" + "".join(f"<li>{esc(line)}</li>" for line in guards["compiles"]) + "</ol>"
    for n, lines in enumerate(guards["variants"], 1):
        guard_html += f"<h4>variant {n} is used while</h4><ul>" + "".join(f"<li>{esc(x)}</li>" for x in lines) + \
            "</ul>"
    guard_html += (f'<p class="muted">A call that breaks a guard compiles a new variant (up to '
                   f'recompile_limit={guards["limit"]}, then the module runs eagerly with a warning).</p>')
    boundary_html = []
    for k in kernels.values():
        if k.reason:
            boundary_html.append(f'<tr class="prof" data-kernel="{esc(k.id)}"><td>{esc(k.plan)}</td>'
                                 f'<td>{esc(k.name)}</td><td>{esc(k.reason)}</td></tr>')
    kernel_data = {k.id: {"name": k.name, "kind": k.kind, "plan": k.plan, "nodes": k.nodes, "ops": k.ops,
                          "reason": k.reason, "boundaries": k.boundaries, "bytes": _fmt_bytes(k.bytes_moved),
                          "how": k.how, "color": KIND_COLORS.get(k.kind, "#ddd"),
                          "mean_us": round(statistics.mean(k.seconds) * 1e6, 2) if k.seconds else None,
                          "source": highlight_python(k.source) if k.source else ""}
                   for k in kernels.values()}
    plan_of_kernel = {k.id: n for n, view in enumerate(views) for k in view.kernels}
    data = json.dumps({"kernels": kernel_data, "plan": plan_of_kernel}).replace("</", "<\\/")
    breaks = "".join(f"<li>graph break: {esc(b.path)} runs eagerly ({esc(b.reason)})</li>"
                     for b in compilation.graph_breaks)
    opaque = "".join(f"<li>opaque node {esc(n.name)}: {esc(n.meta.get('opaque_reason', ''))}</li>"
                     for n in compilation.opaque)
    return _TEMPLATE.format(
        title=esc(title), inputs=esc(input_text), drawn_by=esc(drawn_by), summary=esc(summary),
        compile_ms=f"{compilation.compile_seconds * 1e3:.0f}", n_kernels=len(kernels),
        tabs="".join(tabs), panes="".join(panes), profile=profile_html, guards=guard_html,
        boundaries="".join(boundary_html), extra=(f"<ul>{breaks}{opaque}</ul>" if breaks or opaque else ""),
        css=_CSS, data=data, js=_JS)


# the Chrome trace is embedded as a download link up to this size (a long profile of a large model is left out)
_MAX_TRACE_BYTES = 4 << 20


def _profile_extras(prof) -> str:
    """The nnc.profile behind the timings: its key-averages table (eager ops and graph runs too) and its Chrome
    trace as a download (a data: URL, so the page stays one file)."""
    if prof is None:
        return ""
    esc = html.escape
    parts = ['<details class="keyavg"><summary>Every event: nnc.profile\'s key averages (kernels, graph runs, eager '
             f'ops)</summary><pre>{esc(prof.table(row_limit=60))}</pre></details>']
    trace, which = json.dumps(prof.chrome_trace()), "every profiled call"
    ends = sorted(e.end for e in prof.events if e.cat == "user")  # one "call" range per profiled call
    for keep in (20, 5, 1):  # too large a trace for the page: the first calls only
        if len(trace) <= _MAX_TRACE_BYTES:
            break
        if len(ends) <= keep:
            continue
        first = copy.copy(prof)
        first.events = [e for e in prof.events if e.start <= ends[keep - 1]]
        trace, which = json.dumps(first.chrome_trace()), f"the first {keep} profiled calls"
    if len(trace) <= _MAX_TRACE_BYTES:
        url = "data:application/json;base64," + base64.b64encode(trace.encode()).decode()
        parts.append(f'<p><a id="trace" download="nnc-trace.json" href="{url}">Download the Chrome trace</a> '
                     f'<span class="muted">({which}; open it in ui.perfetto.dev or chrome://tracing)</span></p>')
    return "".join(parts)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#20304a;color:#fff;padding:12px 20px}header h1{margin:0;font-size:20px}
header .muted{color:#c9d3e6}main{padding:8px 20px 40px}h2{border-bottom:1px solid #ddd;padding-bottom:2px}
.muted{color:#777}.tab{border:1px solid #bbb;background:#fff;padding:4px 10px;margin:2px;border-radius:4px;
cursor:pointer;font:13px monospace}.tab.active{background:#20304a;color:#fff}
.pane{display:none}.pane.active{display:block}
.svgbox{overflow:auto;max-height:640px;border:1px solid #ddd;background:#fff;margin:4px 0}
.plancols{display:flex;gap:10px;align-items:flex-start}.kernels{list-style:none;padding:0;margin:0;width:330px;
max-height:640px;overflow:auto;flex:none}.kernel{border:1px solid #ddd;border-left:8px solid #ccc;margin:3px 0;
padding:3px 6px;cursor:pointer;background:#fff;font-size:12px}.kernel.selected{outline:2px solid #e0245e}
.plangraph{flex:1}.ops{font-family:monospace;font-size:11px;color:#444}
g.node{cursor:pointer}g.node.hl rect,g.node.hl polygon,g.node.hl ellipse{stroke:#e0245e;stroke-width:3px}
g.node.dim{opacity:.35}
pre.src{background:#1e1e1e;color:#d4d4d4;padding:10px;overflow:auto;font-size:12px;max-height:520px}
.kw{color:#569cd6}.str{color:#ce9178}.num{color:#b5cea8}.com{color:#6a9955}.bi{color:#4ec9b0}.def{color:#dcdcaa}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
td.r{text-align:right;font-family:monospace}tr.prof{cursor:pointer}tr.prof:hover{background:#eef}
pre.summary{background:#fff;border:1px solid #ddd;padding:8px;overflow:auto;font-size:12px}
#detail{margin-top:10px;background:#fff;border:1px solid #ddd;padding:8px}
"""

_JS = """
const DATA = JSON.parse(document.getElementById('nnc-data').textContent);
function show(id){document.querySelectorAll('.pane').forEach(p=>p.classList.toggle('active',p.id===id));
 document.querySelectorAll('.tab').forEach(t=>t.classList.toggle('active',t.dataset.pane===id));}
document.querySelectorAll('.tab').forEach(t=>t.addEventListener('click',()=>show(t.dataset.pane)));
function nodeName(g){const t=g.querySelector('title');return g.dataset.node||(t?t.textContent:'');}
function shapeOf(g){return g.querySelector('rect,polygon,ellipse');}
const planGraphs=[...document.querySelectorAll('.plangraph')];
planGraphs.forEach((box,n)=>{const owner={};
 for(const [id,k] of Object.entries(DATA.kernels)){if(DATA.plan[id]===n){k.nodes.forEach(x=>owner[x]=id);}}
 box.querySelectorAll('g.node').forEach(g=>{const id=owner[nodeName(g)];if(!id)return;g.dataset.kernel=id;
  const s=shapeOf(g);if(s){s.setAttribute('fill',DATA.kernels[id].color);}
  g.addEventListener('click',()=>select(id));});});
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));}
function select(id){const k=DATA.kernels[id];if(!k)return;show('kernels');
 const detail=document.getElementById('detail');planGraphs[DATA.plan[id]].closest('.plan').appendChild(detail);
 document.querySelectorAll('li.kernel').forEach(li=>li.classList.toggle('selected',li.dataset.kernel===id));
 const box=planGraphs[DATA.plan[id]];let first=null;
 document.querySelectorAll('.plangraph g.node').forEach(g=>{const mine=g.dataset.kernel===id;
  g.classList.toggle('hl',mine);g.classList.toggle('dim',!mine&&box.contains(g));if(mine&&!first)first=g;});
 if(first){const b=first.getBBox();box.scrollTo({left:Math.max(0,b.x-box.clientWidth/3),top:Math.max(0,b.y-80)});}
 const bounds=k.boundaries.map(b=>'<li>%'+esc(b[0])+' &rarr; %'+esc(b[1])+': '+esc(b[2])+'</li>').join('');
 detail.innerHTML='<h3>'+esc(k.plan)+': '+esc(k.name)+' <span class="muted">('+esc(k.kind)+
  ', '+esc(k.how)+')</span></h3><p>nodes: <code>'+esc(k.nodes.join(', '))+'</code><br>bytes moved: '+esc(k.bytes)+
  (k.mean_us!==null?' · mean time '+k.mean_us+' us':'')+'</p><p><b>why the kernel ends here:</b> '+
  esc(k.reason||'(it is the last kernel)')+'</p>'+(bounds?'<ul>'+bounds+'</ul>':'')+
  (k.source?'<pre class="src">'+k.source+'</pre>':'<p class="muted">No generated source: '+esc(k.how)+'.</p>');}
document.querySelectorAll('li.kernel,tr.prof').forEach(el=>el.addEventListener('click',()=>select(el.dataset.kernel)));
show(document.querySelector('.tab').dataset.pane);
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>nnc report: {title}</title><style>{css}</style></head>
<body><header><h1>nnc report: {title}</h1><span class="muted">inputs {inputs} · {n_kernels} kernels ·
compiled in {compile_ms} ms · graphs drawn by {drawn_by}</span></header><main>
<h2>The graph at each stage</h2><nav>{tabs}</nav>{panes}
<h2>Summary</h2>{extra}<details><summary>what <code>nnc.explain</code> prints</summary>
<pre class="summary">{summary}</pre></details>
<h2 id="profile">Time per kernel</h2>{profile}
<h2 id="boundaries">Why each boundary exists</h2><table><tr><th>graph</th><th>kernel</th><th>reason</th></tr>
{boundaries}</table>
<h2 id="guards">Guards and recompiles</h2>{guards}
</main><script type="application/json" id="nnc-data">{data}</script><script>{js}</script></body></html>
"""
