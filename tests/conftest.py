"""pytest set-up shared by every test module: hypothesis profiles, the examples/ folder on sys.path, per-test seeds,
and fixtures for the optional torch oracle and a private kernel cache. Plain helpers live in tests/helpers.py."""
from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

import helpers

# Hypothesis: "ci" runs the same examples every time (derandomize: a red CI run replays locally, a green one stays
# green until the code changes) and keeps no example database; "dev" explores new examples on every run.
# Neither has a deadline: the first call of a compiled model includes numba's compilation.
# HYPOTHESIS_PROFILE picks one explicitly; otherwise CI (set by .ci/run and by most CI services) selects "ci".
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

# tests/cuda/ runs as a pytest invocation of its own under numba's CUDA simulator, which must be switched on before
# numba is imported (`NUMBA_ENABLE_CUDASIM=1 python -m pytest -q -n 2 --dist loadfile tests/cuda`: .ci/run and the
# README's test command run it after this suite); a run without the simulator leaves that folder out.
collect_ignore = [] if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else ["cuda"]

# examples/ holds the models several tests import (models.py, modules_note.py, real_models.py).
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)


@pytest.fixture
def torch():
    """The real torch, for a test that compares with it; the test skips where torch is not installed."""
    return helpers.require_torch()



@pytest.fixture(scope="module")
def fresh_kernel_cache(tmp_path_factory):
    """A kernel cache of the module's own, so its tests compile rather than load what an earlier run left; use with
    `pytestmark = pytest.mark.usefixtures("fresh_kernel_cache")`. Yields the cache directory."""
    from nnc.codegen import cache

    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("nnc_kernels")
        patch.setenv(cache.ENV_VAR, str(path))
        yield path


@pytest.fixture(autouse=True)
def _seed_random_generators():
    """Every test starts from the same random state, whichever tests ran before it (runtime's default generator
    is otherwise seeded from entropy at import). A test that wants other draws seeds its own generator."""
    import runtime

    runtime.manual_seed(0)
    if helpers.torch is not None:
        helpers.torch.manual_seed(0)
