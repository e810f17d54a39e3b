"""runtime.hub: its progress bar, the hub directory, downloads checked by hash, state dicts loaded from a URL, and
the refusal to run a repository's hubconf.py."""
from __future__ import annotations

import hashlib
import io
import pathlib

import numpy as np
import pytest

import runtime
from runtime import hub


def test_the_progress_bar_wraps_a_loader_as_training_scripts_use_it(capsys):
    for bar_class in (hub.tqdm, hub._PlainProgress):
        seen = []
        bar = bar_class(range(3), desc="EPOCH[TRAIN]1/1", disable=False)
        for t, item in enumerate(bar):
            seen.append(item)
            bar.set_postfix({"Loss": "%6f" % (1.0 / (t + 1))})
        assert seen == [0, 1, 2]
    with hub._PlainProgress(total=10, unit="B") as bar:
        bar.update(4)
        bar.update(6)
    assert bar.n == 10 and "10/10 B" in capsys.readouterr().err


def test_downloads_are_checked_against_their_hash_prefix(tmp_path):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"some bytes" * 100)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    hub.download_url_to_file(source.as_uri(), tmp_path / "copy.bin", hash_prefix=digest[:8], progress=False)
    assert (tmp_path / "copy.bin").read_bytes() == source.read_bytes()
    with pytest.raises(RuntimeError, match="invalid hash value"):
        hub.download_url_to_file(source.as_uri(), tmp_path / "bad.bin", hash_prefix="0000", progress=False)
    assert not (tmp_path / "bad.bin").exists() and sorted(p.name for p in tmp_path.iterdir()) == \
        ["copy.bin", "weights.bin"]  # no partial file left behind


def test_a_state_dict_is_downloaded_once_and_loaded(tmp_path):
    model = runtime.nn.Linear(3, 2)
    buffer = io.BytesIO()
    runtime.save(model.state_dict(), buffer)
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    served = tmp_path / "served" / f"linear-{digest[:10]}.pt"
    served.parent.mkdir()
    served.write_bytes(buffer.getvalue())
    hub.set_dir(tmp_path / "hub")
    try:
        state = hub.load_state_dict_from_url(served.as_uri(), check_hash=True, progress=False)
        assert pathlib.Path(hub.get_dir(), "checkpoints", served.name).exists()
        served.unlink()  # the second call reads the downloaded copy
        again = hub.load_state_dict_from_url(served.as_uri(), progress=False)
    finally:
        hub._hub_dir = None
    for loaded in (state, again):
        np.testing.assert_array_equal(loaded["weight"].numpy(), model.weight.detach().numpy())


def test_loading_from_a_repository_is_refused_because_it_runs_its_code():
    for name in ("load", "list", "help"):
        with pytest.raises(RuntimeError, match="hubconf.py"):
            getattr(hub, name)("owner/repo", "model")
