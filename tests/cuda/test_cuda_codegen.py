"""nnc's generated CUDA kernels run on device arrays and give the interpreter's results: every kernel of the test
models' training forward and backward graphs (MLP, CNN, transformer block) and the hand-built edge cases (nan,
float64, integers, bools, size-1 dims, every reducer, broadcast batch dims).

Under numba's simulator (run this folder as its own pytest with NUMBA_ENABLE_CUDASIM=1 set before numba is
imported) the models are tiny; on a real GPU the `gpu` tests run them again at examples/models.py's sizes.
Without either, everything here skips."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

import cuda_cases  # noqa: E402
from numba import cuda as numba_cuda  # noqa: E402
from nnc.codegen import cuda  # noqa: E402

SIMULATOR = cuda.simulator_enabled()
GPU = not SIMULATOR and numba_cuda.is_available()
on_device = pytest.mark.skipif(not (SIMULATOR or GPU), reason="needs numba's CUDA simulator "
                               "(NUMBA_ENABLE_CUDASIM=1 before numba is imported) or a CUDA GPU")
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")


def check(case: cuda_cases.KernelCase) -> None:
    """Run the case's kernel on device copies of its inputs; its outputs must be the interpreter's."""
    compiled = cuda.compile_kernel(case.kernel)
    outs = compiled.run([numba_cuda.to_device(a) for a in case.inputs])
    assert len(outs) == len(case.outputs)
    for k, (out, want) in enumerate(zip(outs, case.outputs)):
        got = out.copy_to_host()
        assert got.dtype == want.dtype and got.shape == want.shape, (case.label, k)
        if want.dtype.kind == "f":
            tight = want.dtype == np.float64
            np.testing.assert_allclose(got, want, rtol=1e-12 if tight else 2e-5, atol=1e-12 if tight else 1e-6,
                                       equal_nan=True, err_msg=f"{case.label}: output {k}\n{compiled.source}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{case.label}: output {k}\n{compiled.source}")


def _model_cases(small: bool) -> dict[str, list]:
    by_model: dict[str, list] = {}
    for case in cuda_cases.kernel_cases(small):
        by_model.setdefault(case.label.split()[0], []).append(case)
    return by_model


@pytest.fixture(scope="module")
def tiny_models():
    return _model_cases(small=True)


@on_device
@pytest.mark.parametrize("model", ["mlp", "cnn", "transformer"])
def test_model_kernels_match_the_interpreter(tiny_models, model):
    cases = tiny_models[model]
    assert {"forward", "backward"} <= {c.label.split()[1] for c in cases}
    for case in cases:
        check(case)


@on_device
@pytest.mark.parametrize("index", range(len(cuda_cases.hand_cases())),
                         ids=[c.label.replace(" ", "-") for c in cuda_cases.hand_cases()])
def test_edge_case_kernels_match_the_interpreter(index):
    check(cuda_cases.hand_cases()[index])


@on_device
def test_bad_device_arguments_are_clear_errors():
    case = cuda_cases.hand_case("nan maximum minimum sign clamp")
    compiled = cuda.compile_kernel(case.kernel)
    with pytest.raises(TypeError, match="must be a CUDA device array"):
        compiled.run(case.inputs)
    with pytest.raises(ValueError, match="input 1 must be float32"):
        compiled.run([numba_cuda.to_device(case.inputs[0]), numba_cuda.to_device(case.inputs[0])])


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("model", ["mlp", "cnn", "transformer"])
def test_model_kernels_at_full_size_on_a_gpu(model):
    for case in _model_cases(small=False)[model]:
        check(case)


@pytest.mark.skipif(not SIMULATOR, reason="checks tools/bench_cuda_kernels.py under numba's CUDA simulator")
def test_the_cuda_benchmark_runs_in_the_simulator():
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, str(root / "tools" / "bench_cuda_kernels.py"), "--quick", "--repeats", "1",
                           "--cases", "membound,mlp_infer_b1"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "device: numba's simulator" in done.stdout and "of the copy" in done.stdout
    assert "mlp infer b1: all kernels" in done.stdout and "3 launches" in done.stdout
