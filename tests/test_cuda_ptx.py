"""Real compilation of nnc's CUDA kernels, no GPU needed: every kernel the test models make (MLP, CNN, transformer
block; training forward and backward) and the hand-built edge cases compile to PTX for sm_90 with
numba.cuda.compile_ptx (the CUDA toolkit's NVVM from numba-cuda's wheels), and assemble with the toolkit's ptxas
without spilling registers; for sm_80, the hand-built cases and one kernel of each kind do. This catches code
numba's simulator would run but the real compiler rejects.
Skips where numba-cuda is not installed, and under the simulator (which has no compiler)."""
from __future__ import annotations

import collections
import os

import pytest

pytest.importorskip("numba.cuda")
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("numba's CUDA simulator compiles nothing to PTX", allow_module_level=True)

import cuda_cases  # noqa: E402
from nnc.codegen import cuda, targets  # noqa: E402
from nnc.codegen.scalar import KernelCompileError  # noqa: E402


def _nvvm_problem() -> str | None:
    """Why numba.cuda cannot compile to PTX here (no CUDA toolkit's NVVM: numba-cuda without its [cu12] wheels)."""
    from numba import cuda as numba_cuda, types

    def probe(a):
        a[0] = 1.0

    try:
        numba_cuda.compile_ptx(probe, (types.float32[::1],), cc=(8, 0))
    except Exception as error:
        return f"{type(error).__name__}: {str(error)[:200]}"
    return None


_PROBLEM = _nvvm_problem()
if _PROBLEM:
    pytest.skip(f"numba.cuda cannot compile to PTX here (install numba-cuda[cu12]): {_PROBLEM}",
                allow_module_level=True)


@pytest.fixture(scope="module")
def generated():
    """(label, kind, generated module) per distinct module the models and the hand-built cases make."""
    unique = {}
    for case in cuda_cases.kernel_cases(small=False) + cuda_cases.hand_cases():
        module = cuda.generate(case.kernel)
        unique.setdefault(module.source, (case.label, cuda_cases.kind_of(case.kernel), module))
    return list(unique.values())


def _for_architecture(generated, cc) -> list:
    """What compiles for `cc`: everything for the newest architecture; for the older ones, the hand-built edge cases
    and the first kernel of each kind: NVVM's PTX of one source for sm_80 and sm_90 differed only in the .target line
    and symbol numbers (checked on every kind), so every module for both would double this file's time (40 s
    each) to compare twice what is the same."""
    if cc == max(cuda.ARCHITECTURES):
        return generated
    hand = {case.label for case in cuda_cases.hand_cases()}
    first_of_kind = {}
    for entry in generated:
        first_of_kind.setdefault(entry[1], entry)
    return [e for e in generated if e[0] in hand or first_of_kind[e[1]] is e]


_PTX: dict = {}


def ptx_of(label, module, cc) -> dict:
    """compile_ptx's result, once per module and compute capability (the tests below share it)."""
    key = (module.source, cc)
    if key not in _PTX:
        _PTX[key] = cuda.compile_ptx(module, cc, label)
    return _PTX[key]


def test_the_models_make_every_generated_kernel_kind(generated):
    kinds = collections.Counter(kind for _, kind, _ in generated)
    assert set(kinds) == set(cuda_cases.GENERATED_KINDS), kinds


@pytest.mark.parametrize("cc", cuda.ARCHITECTURES, ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
def test_every_kernel_compiles_to_ptx(generated, cc):
    for label, _, module in _for_architecture(generated, cc):
        ptx = ptx_of(label, module, cc)
        assert set(ptx) == set(module.signatures), label
        for name, text in ptx.items():
            assert f".target sm_{cc[0]}{cc[1]}" in text and ".entry" in text and name in text, label


def test_ptxas_assembles_without_spills_or_local_memory(generated):
    ptxas = cuda.find_ptxas()
    if ptxas is None:
        pytest.skip("the CUDA toolkit's ptxas is not installed")
    report = []
    for label, kind, module in generated:
        for name, ptx in ptx_of(label, module, (9, 0)).items():
            used = cuda.ptx_resources(ptx, (9, 0), ptxas)
            report.append((label, kind, used))
            assert used.spill_stores == 0 and used.spill_loads == 0 and used.stack == 0, (label, used)
            assert 0 < used.registers <= 255, (label, used)
    most = max(report, key=lambda r: r[2].registers)
    print(f"\n{len(report)} kernels for sm_90; most registers: {most[0]} ({most[1]}) {most[2]}")


def test_a_kernel_with_no_cuda_skeleton_is_a_clear_compile_error():
    case = cuda_cases.hand_case("nan maximum minimum sign clamp")
    case.kernel.kind = "opaque"  # several nodes: not a view
    with pytest.raises(KernelCompileError, match="an opaque kernel other than one view of one tensor"):
        targets.generate(case.kernel, "cuda")
    case.kernel.kind = "fancy"
    with pytest.raises(KernelCompileError, match="kind 'fancy' has no CUDA code generation"):
        targets.generate(case.kernel, "cuda")


def test_generation_dispatches_by_target():
    case = cuda_cases.hand_case("nan maximum minimum sign clamp")
    on_gpu, on_cpu = targets.generate(case.kernel, "cuda"), targets.generate(case.kernel, "cpu")
    assert "@cuda.jit" in on_gpu.source and "@njit" in on_cpu.source
    assert targets.launch_configuration(on_gpu) and not targets.launch_configuration(on_cpu)
    with pytest.raises(ValueError, match="unknown code generation target 'tpu'.*cpu, cuda"):
        targets.generate(case.kernel, "tpu")


def test_the_source_is_a_function_of_the_computation_only():
    first, second = (cuda_cases.hand_case("row amax with nan and logsumexp") for _ in range(2))
    for node in second.kernel.nodes:
        node.name = f"renamed_{node.name}"
    a, b = cuda.generate(first.kernel), cuda.generate(second.kernel)
    assert a.source == b.source and a.legend != b.legend
    assert not any(n.name in a.source for n in second.kernel.nodes)


def test_explain_shows_cuda_source_launches_and_registers():
    import nnc
    import runtime as torch
    from models import MLP

    report = nnc.explain(MLP((12, 8, 6, 3)), torch.randn(4, 12), backward=True, target="cuda")
    kernels = report.kernels + report.backward_kernels
    generated = [k for k in kernels if k.generated]
    views = [k for k in kernels if k.kind == "opaque" and k.ops[0] in ("reshape", "permute", "expand")]
    assert views and report.target == "cuda"
    assert len(generated) == len([k for k in kernels if k.kind != "opaque"]) + len(views) > 3
    for k in generated:
        assert "@cuda.jit" in k.source and "def launch(ins, outs):" in k.source, k.name
        assert k.launch and "grid [" in k.launch[0] and "block [" in k.launch[0], k.name
        if cuda.find_ptxas() is not None:
            assert "registers" in k.resources and "spill" in k.resources, k.resources
    assert "target cuda" in str(report) and "(cuda; k_" in str(report)
    with pytest.raises(ValueError, match="unknown code generation target 'gpu'"):
        nnc.explain(MLP((12, 8, 6, 3)), torch.randn(4, 12), target="gpu")


def test_dump_codegen_for_the_cuda_target(capsys):
    from nnc.cli import main

    assert main(["dump", "examples/models.py:mlp", "--input", "float32[2,784]", "--stage", "codegen",
                 "--target", "cuda"]) == 0
    out = capsys.readouterr().out
    assert out.count("@cuda.jit") >= 3 and "# launch k_" in out and "@njit" not in out


def test_compiled_code_is_cached_only_beside_the_kernel_sources(tmp_path, monkeypatch):
    from nnc.codegen import cache

    module = cuda_cases.hand_case("size one")
    generated = cuda.generate(module.kernel)
    loaded, path = cuda._load("size_one", generated)
    dispatcher = getattr(loaded, next(iter(generated.signatures)))
    assert dispatcher._cache.cache_path == str(path.parent / "__pycache__")
    monkeypatch.setattr(cache, "cache_dir", lambda: tmp_path)  # the cache now lives elsewhere: not this directory
    cuda._keep_compiled_code_private(loaded, generated)
    assert dispatcher._cache.cache_path is None  # compiles in memory
