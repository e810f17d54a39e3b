"""Every ```python and ```bash block of README.md runs, as a reader would paste it, in a fresh process.

A block runs in a scratch directory where `examples/` and `tools/` are the repository's (so its relative paths work
and the files it writes stay out of the checkout), with the `nnc` command on PATH. A bash block directly followed by
a ```text block must print that text. A block preceded by `<!-- no-test: why -->` is skipped: installs, the whole
suite, MPI launches and minute-long benchmarks; those are counted and kept few.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_UNTESTED = 6  # the README's no-test blocks: keep them few

FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
NO_TEST = re.compile(r"<!--\s*no-test:?\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    lang: str
    code: str
    line: int
    skip: str | None      # the no-test reason, or None
    expected: str | None  # the ```text block right after it


def readme_blocks(text: str) -> list[Block]:
    matches = list(FENCE.finditer(text))
    blocks = []
    for i, match in enumerate(matches):
        lang, code = match.group(1), match.group(2)
        if lang not in ("python", "bash"):
            continue
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NO_TEST.search(before)
        expected = None
        if i + 1 < len(matches) and matches[i + 1].group(1) == "text" and \
                not text[match.end():matches[i + 1].start()].strip():
            expected = matches[i + 1].group(2)
        blocks.append(Block(lang, code, text.count("\n", 0, match.start()) + 1,
                            (marker.group(1) or "unexplained") if marker else None, expected))
    return blocks


BLOCKS = readme_blocks(README.read_text())


def test_the_readme_has_runnable_blocks_and_few_untested_ones():
    assert sum(b.lang == "python" and b.skip is None for b in BLOCKS) >= 2
    assert sum(b.lang == "bash" and b.skip is None for b in BLOCKS) >= 1
    untested = [b for b in BLOCKS if b.skip is not None]
    assert len(untested) <= MAX_UNTESTED, [f"line {b.line}: {b.skip}" for b in untested]
    assert all(b.skip != "unexplained" for b in untested), "say why a block is not tested: <!-- no-test: why -->"
    assert any(b.expected for b in BLOCKS if b.skip is None)  # some block's output is checked, not only its status
    # the two set-up commands stay exactly these
    code = [b.code.strip() for b in BLOCKS]
    assert any(c.startswith('pip install -e ".[test]" && python examples/quickstart.py') for c in code)
    assert any(c.startswith("python -m pytest -q") for c in code)


def test_the_no_test_marker_is_honoured():
    text = "a\n\n<!-- no-test: installs -->\n```bash\npip install x\n```\n\n```bash\nls\n```\n```text\nout\n```\n"
    first, second = readme_blocks(text)
    assert first.skip == "installs" and first.line == 4 and first.expected is None
    assert second.skip is None and second.expected == "out\n"


@pytest.fixture
def scratch(tmp_path):
    """A directory with the repository's examples and tools linked in, and a bin/ holding an `nnc` command that runs
    this interpreter's nnc (what `pip install -e .` puts on PATH)."""
    for name in ("examples", "tools"):
        (tmp_path / name).symlink_to(ROOT / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "nnc"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "import sys; from nnc.cli import main; '
                    f'sys.exit(main())" "$@"\n')
    shim.chmod(0o755)
    return tmp_path


def _env(scratch: Path) -> dict:
    return dict(os.environ, MPLBACKEND="Agg", PATH=os.pathsep.join([str(scratch / "bin"), os.environ["PATH"]]),
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.skip is None], ids=lambda b: f"{b.lang}-line{b.line}")
def test_readme_block_runs(block, scratch):
    if block.lang == "python":
        command = [sys.executable, "-c", block.code]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    result = subprocess.run(command, cwd=scratch, env=_env(scratch), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (f"README.md line {block.line} failed:\n{block.code}\n--- stdout\n"
                                    f"{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")
    if block.expected is not None:
        assert result.stdout.strip() == block.expected.strip(), f"README.md line {block.line} printed other text"
