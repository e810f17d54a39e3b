"""`nnc report`: the page's pieces (layout, highlighter, profile, guards) and the page itself in a headless Chromium.

The browser test needs Debian's chromium (/usr/bin/chromium, or $NNC_CHROMIUM) and the playwright package; it
skips without them (`.ci/run` installs both). It keeps a screenshot under $NNC_TEST_ARTIFACTS (default: a folder in
the system's temp dir) and prints where.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

import runtime
from nnc import cli
from nnc.report import build_report, graph_svg, highlight_python, layered_svg
from runtime import nn

from models import MLP

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def artifacts_dir() -> Path:
    path = Path(os.environ.get("NNC_TEST_ARTIFACTS") or Path(tempfile.gettempdir()) / "nnc-test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def chromium_path() -> str | None:
    for candidate in (os.environ.get("NNC_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def make_page(directory: Path, renderer: str) -> Path:
    """The report page of the examples' transformer block, written by the `nnc report` command."""
    out = directory / f"block_{renderer}.html"
    status = cli.main(["report", str(ROOT / "examples/models.py") + ":TransformerBlock", "--input", "float32[2,5,32]",
                       "-o", str(out), "--renderer", renderer, "--profile-seconds", "0.2"])
    assert status == 0
    return out


@pytest.fixture(scope="module")
def block_page(tmp_path_factory):
    return make_page(tmp_path_factory.mktemp("report"), "python")


@pytest.fixture(scope="module", params=["python", "dot"])
def any_block_page(request, tmp_path_factory):
    """The page drawn by each renderer (dot's only where Graphviz is installed)."""
    if request.param == "dot" and shutil.which("dot") is None:
        _missing("Graphviz's dot is not installed")
    return make_page(tmp_path_factory.mktemp("report"), request.param)


def _page_data(text: str) -> dict:
    match = re.search(r'<script type="application/json" id="nnc-data">(.*?)</script>', text, re.S)
    return json.loads(match.group(1))


def test_layered_layout_draws_every_node_and_edge_downwards():
    gm = __import__("nnc").trace(MLP((6, 5, 4, 3)))
    svg = layered_svg(gm.graph)
    names = re.findall(r'<g class="node" data-node="([^"]+)">', svg)
    assert names == [n.name for n in gm.graph.nodes]
    edges = re.findall(r'data-from="([^"]+)" data-to="([^"]+)" d="M([\d.]+),([\d.]+).* ([\d.]+),([\d.]+)"', svg)
    assert len(edges) == sum(len(set(n.all_input_nodes)) for n in gm.graph.nodes)
    for _, _, _, y0, _, y1 in edges:
        assert float(y1) > float(y0)  # producers above their users


def test_graph_svg_uses_the_python_layout_when_asked():
    gm = __import__("nnc").trace(MLP((6, 5, 4, 3)))
    assert 'data-node="fc1"' in graph_svg(gm.graph, renderer="python")


def test_graph_svg_uses_dot_when_installed():
    if shutil.which("dot") is None:
        _missing("Graphviz's dot is not installed")
    gm = __import__("nnc").trace(MLP((6, 5, 4, 3)))
    svg = graph_svg(gm.graph, renderer="dot")
    assert svg.startswith("<svg") and "<title>fc1</title>" in svg and "data-node" not in svg


def test_highlighter_keeps_the_text_and_marks_tokens():
    source = "@numba.njit\ndef k0(x, out):  # a kernel\n    for i in range(3):\n        out[i] = x[i] * 2.5 + 'a'\n"
    marked = highlight_python(source)
    assert re.sub(r"<[^>]+>", "", marked).replace("&#x27;", "'") == source
    assert '<span class="kw">def</span>' in marked and '<span class="def">k0</span>' in marked
    assert '<span class="num">2.5</span>' in marked and '<span class="com"># a kernel</span>' in marked
    assert '<span class="bi">range</span>' in marked and '<span class="str">&#x27;a&#x27;</span>' in marked


def test_page_has_every_stage_kernels_timings_and_guards(block_page):
    text = block_page.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")  # nothing to fetch
    assert "https://" not in text and "<link" not in text and "src=" not in text
    for stage in ("trace", "shapes", "decompose", "simplify", "autodiff", "simplify_backward"):
        assert f'id="stage-{stage}"' in text
    data = _page_data(text)
    kernels = data["kernels"]
    assert kernels and all(k["nodes"] for k in kernels.values())
    generated = [k for k in kernels.values() if k["how"] == "numba"]
    assert generated and all('<span class="kw">def</span>' in k["source"] for k in generated)
    assert all(k["mean_us"] is not None and k["mean_us"] > 0 for k in generated)  # every launched kernel timed
    assert any(k["reason"] for k in kernels.values())
    assert {k["plan"] for k in kernels.values()} >= {"TransformerBlock training forward", "TransformerBlock backward"}
    assert "compiling TransformerBlock: first call" in text
    assert "changed: grad mode" in text  # the no_grad call recompiled, and the page says why
    assert "dtype float32, requires_grad=False" in text and "grad mode is off" in text


def test_profile_times_each_kernel_once_per_call():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    from nnc.compile import bind_arguments, split_arguments
    from nnc.pipeline import Compilation, run_stages
    from nnc.report import _kernel_infos, _plans, profile_plans
    from runtime.autograd import no_grad

    concrete, examples = split_arguments(bind_arguments(model, (runtime.randn(3, 4),), {}))
    compilation = Compilation(model, concrete, examples, needs_grad=True)
    with no_grad():
        run_stages(compilation)
    plans = _plans(compilation)
    kernels = {info.id: info for i, (label, plan) in enumerate(plans) for info in _kernel_infos(i, label, plan)}
    result = profile_plans(compilation, plans, kernels, needs_grad=True, seconds=60.0, max_calls=7)
    assert result["calls"] == 7
    assert all(len(k.seconds) == 7 for k in kernels.values())
    assert all("run" not in vars(step) for _, plan in plans for step in plan.steps)  # timers removed
    assert all(p.grad is None for p in model.parameters())


def test_report_command_errors_are_one_line(tmp_path, capsys):
    status = cli.main(["report", str(ROOT / "examples/models.py") + ":mlp", "-o", str(tmp_path / "r.html")])
    assert status == 1
    assert "--input" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_report_without_gradients_profiles_the_forward(tmp_path):
    model = MLP((6, 5, 4, 3)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    page = build_report(model, [runtime.randn(2, 6)], renderer="python", profile_seconds=0.0)
    data = _page_data(page)
    assert {k["plan"] for k in data["kernels"].values()} == {"MLP forward"}
    assert "forward); median call" in page


# -- in a real browser ---------------------------------------------------------------------------------------------


def _missing(reason: str):
    """CI installs the browser and Graphviz (.ci/run): there a missing one fails the test instead of skipping it."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; .ci/run installs it, so CI must not skip this test")
    pytest.skip(reason)


def test_page_in_headless_chromium(any_block_page):
    try:
        from playwright import sync_api
    except ImportError:
        _missing("playwright is not installed (the test extra installs it)")
    executable = chromium_path()
    if executable is None:
        _missing("no chromium: apt-get install chromium (or set NNC_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            requests = []
            page.on("request", lambda request: requests.append(request.url))
            page.goto(any_block_page.as_uri())
            assert errors == []
            assert all(url.startswith("file:") for url in requests)  # no network
            # the first stage's graph is drawn, with every node of the traced graph
            visible = page.locator("section.pane.active g.node")
            assert visible.count() > 5
            box = visible.first.bounding_box()
            assert box is not None and box["width"] > 10 and box["height"] > 10
            # the backward stage's tab shows its graph
            page.click("button.tab[data-pane='stage-simplify_backward']")
            assert page.locator("#stage-simplify_backward").is_visible()
            assert page.locator("#stage-simplify_backward g.node").count() > 10
            # kernels: listed, and their graph coloured by kernel
            page.click("button.tab[data-pane='kernels']")
            items = page.locator("li.kernel")
            assert items.count() > 5
            assert page.locator(".plangraph g.node[data-kernel]").count() > 10
            # click a generated kernel with several nodes: exactly its nodes are highlighted, its source shown
            data = json.loads(page.locator("#nnc-data").text_content())["kernels"]
            chosen = max((k for k, v in data.items() if v["how"] == "numba"), key=lambda k: len(data[k]["nodes"]))
            page.click(f"li.kernel[data-kernel='{chosen}']")
            highlighted = page.eval_on_selector_all(".plangraph g.node.hl", "gs => gs.map(g => g.dataset.kernel)")
            names = page.eval_on_selector_all(
                ".plangraph g.node.hl", "gs => gs.map(g => g.dataset.node || g.querySelector('title').textContent)")
            assert highlighted and set(highlighted) == {chosen}
            assert sorted(names) == sorted(data[chosen]["nodes"])
            stroke = page.eval_on_selector(".plangraph g.node.hl rect, .plangraph g.node.hl polygon",
                                           "s => getComputedStyle(s).stroke")
            assert stroke == "rgb(224, 36, 94)"
            assert page.locator("li.kernel.selected").count() == 1
            detail = page.locator("#detail")
            assert data[chosen]["name"] in detail.text_content()
            assert detail.locator("pre.src span.kw").count() > 0  # highlighted source
            assert page.locator("table.proftable tr.prof").count() > 5
            name = any_block_page.stem
            shot = artifacts_dir() / f"report_{name}.png"
            page.screenshot(path=str(shot), full_page=False)
            page.locator("#detail").screenshot(path=str(artifacts_dir() / f"report_{name}_kernel.png"))
            print(f"screenshot: {shot}")
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()



def test_every_guard_key_of_a_compiled_module_reads_as_lines():
    """The report reads nnc.compile's guard key field by field: a layout change must be followed here."""
    import warnings

    import nnc
    from nnc import report

    compiled = nnc.compile(runtime.nn.Sequential(runtime.nn.Linear(3, 2), runtime.nn.ReLU()))
    compiled(runtime.randn(4, 3))
    with warnings.catch_warnings(), runtime.autocast("cpu", dtype=runtime.float16):
        warnings.simplefilter("ignore", RuntimeWarning)  # float16 kernels run in the interpreter on the CPU
        compiled(runtime.randn(4, 3))
    plain, cast = (report._describe_guard(key) for key in compiled._keys)
    assert "grad mode is on" in plain and plain[0].startswith("input: tensor, shape (4, 3)")
    assert "grad mode is on; autocast to float16" in cast
