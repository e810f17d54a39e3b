"""The examples run, on their tiny settings (the flag each has for a smoke run), as a user runs them: `python
examples/NAME.py ...` in a fresh process. What they print is checked; their timings are not."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str, *args: str, timeout: int = 300) -> str:
    """Standard output of `python examples/NAME ARGS` (the repository importable, plots to files only)."""
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                                     os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr
    return result.stdout


def test_quickstart_compiles_and_reports_both_step_times():
    out = run_example("quickstart.py", "--quick")
    assert re.search(r"eager:\s+loss [\d.]+, accuracy [\d.]+%", out)
    assert re.search(r"compiled vs eager output differs by at most ([\d.e+-]+)", out)
    difference = float(re.search(r"differs by at most ([\d.e+-]+)", out).group(1))
    assert difference < 1e-4
    assert re.search(r"eager\s+[\d.]+ ms", out) and re.search(r"compiled\s+[\d.]+ ms\s+[\d.]+x (faster|slower)", out)
    kernels = re.search(r"kernels: (\d+) forward \+ (\d+) backward", out)
    assert kernels and int(kernels.group(1)) > 0 and int(kernels.group(2)) > 0
    for pointer in ("nnc.explain", "nnc dump", "nnc report"):
        assert pointer in out


def test_digits_trains_eager_and_compiled_alike_and_plots(tmp_path):
    pytest.importorskip("sklearn", reason="the examples extra (scikit-learn) is not installed")
    pytest.importorskip("matplotlib", reason="the examples extra (matplotlib) is not installed")
    png = tmp_path / "digits.png"
    out = run_example("digits.py", "--quick", "-o", str(png))
    eager = re.search(r"eager\s*: test accuracy ([\d.]+)%, final loss ([\d.]+)", out)
    compiled = re.search(r"compiled: test accuracy ([\d.]+)%, final loss ([\d.]+)", out)
    assert eager and compiled
    assert float(eager.group(1)) > 50  # two epochs learn most digits
    assert abs(float(eager.group(2)) - float(compiled.group(2))) < 1e-3  # same weights, same batches
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_hooks_fire_compiled_as_eager_and_clip_gradients():
    out = run_example("hooks.py", "--quick")
    losses = re.search(r"loss eager ([\d.]+), compiled ([\d.]+)", out)
    assert losses and losses.group(1) == losses.group(2)
    differences = re.findall(r"captured activations differ from eager's by ([\d.e+-]+)", out)
    assert len(differences) == 2 and all(float(d) < 1e-5 for d in differences)
    clipped = re.search(r"clipped ([\d,]+) of ([\d,]+) gradient entries to \+-([\d.]+); largest \|grad\| now ([\d.]+)",
                        out)
    assert clipped and int(clipped.group(2).replace(",", "")) > 0
    assert float(clipped.group(4)) <= float(clipped.group(3)) + 1e-6
    assert re.search(r"with hooks: 3 modules run as calls", out)
    assert re.search(r"hooks removed: recompiled \(1 new variant\), \d+ forward \+ \d+ backward kernels, 0 calls", out)


def test_char_gpt_trains_compiled_and_samples_text():
    out = run_example("char_gpt.py", "--quick")
    loss = re.search(r"held-out ([\d.]+) \(uniform guessing: ([\d.]+)\)", out)
    assert loss and float(loss.group(1)) < float(loss.group(2))  # it learned something about the text
    assert re.search(r"time per step: eager [\d.]+ ms, compiled [\d.]+ ms", out)
    sample = out.split("--- sample (prompt, then the model's continuation) ---\n", 1)[1]
    sample = sample.split("\n--- end of sample ---", 1)[0]
    assert len(sample) == 16 + 40  # the prompt (one context) and 40 new characters
    import string

    assert set(sample) <= set(string.printable)
