"""What training scripts touch around the model: torch.backends flags, torch.accelerator, torch.cuda, autocast and
GradScaler, torch.compile's spelling, torch.version, torch.nn.attention's sdpa_kernel."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import runtime


def test_backends_flags_have_torchs_defaults_and_are_settable(torch):
    for path in ("cuda.matmul.allow_tf32", "cudnn.allow_tf32", "cudnn.benchmark", "cudnn.deterministic",
                 "cudnn.enabled", "cuda.matmul.allow_fp16_reduced_precision_reduction"):
        ours, theirs = runtime.backends, torch.backends
        for part in path.split("."):
            ours, theirs = getattr(ours, part), getattr(theirs, part)
        assert ours == theirs, path
    runtime.backends.cuda.matmul.allow_tf32 = True
    runtime.backends.cudnn.benchmark = True
    assert runtime.backends.cuda.matmul.allow_tf32 and runtime.backends.cudnn.benchmark
    runtime.backends.cuda.matmul.allow_tf32 = False
    runtime.backends.cudnn.benchmark = False
    with pytest.raises(AttributeError, match="no flag"):
        runtime.backends.cudnn.bencmark = True  # a typo is an error, not a silent new attribute
    assert not runtime.backends.mps.is_available() and not runtime.backends.cudnn.is_available()


@pytest.mark.skipif(runtime.cuda.is_available(), reason="this machine has CUDA (tests/cuda covers it)")
def test_no_accelerator_and_no_cuda():
    assert not runtime.accelerator.is_available() and runtime.accelerator.current_accelerator() is None
    assert runtime.accelerator.device_count() == 0
    assert not runtime.cuda.is_available() and runtime.cuda.device_count() == 0
    runtime.cuda.synchronize()
    with pytest.raises(RuntimeError, match="no CUDA"):
        runtime.cuda.current_device()


def test_version_reports_like_a_cpu_build_of_torch(torch):
    """An environment report (`torch.version.cuda`, `torch.version.debug`, ...) runs unchanged: the fields exist
    with the types of a CPU build's, and CUDA's is None where runtime's CUDA backend finds no GPU."""
    assert runtime.version.__version__ == runtime.__version__
    for name in ("debug", "git_version", "hip", "rocm", "xpu"):
        assert type(getattr(runtime.version, name)) is type(getattr(torch.version, name)), name
    cuda = runtime.version.cuda
    if not runtime.cuda.is_available():
        assert cuda is None
    else:
        assert cuda is None or all(part.isdigit() for part in cuda.split("."))
    with pytest.raises(AttributeError, match="no attribute 'cudnn'"):
        runtime.version.cudnn


def test_autocast_runs_matmuls_in_float16(torch):
    a, b = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    x, w = runtime.tensor(a, requires_grad=True), runtime.tensor(b)
    tx, tw = torch.tensor(a, requires_grad=True), torch.tensor(b)
    with runtime.autocast("cpu", dtype=runtime.float16):
        y = x @ w.T
        assert runtime.is_autocast_enabled("cpu") and runtime.get_autocast_dtype("cpu") is runtime.float16
        assert (x + 1).dtype is runtime.float32  # elementwise ops are not cast
        z = runtime.nn.functional.linear(x, w)
    with torch.autocast("cpu", dtype=torch.float16):
        ty = tx @ tw.T
    assert y.dtype is runtime.float16 and z.dtype is runtime.float16 and ty.dtype == torch.float16
    np.testing.assert_allclose(y.float().detach().numpy(), ty.float().detach().numpy(), rtol=2e-2, atol=2e-2)
    assert not runtime.is_autocast_enabled("cpu")
    y.float().sum().backward()
    assert x.grad.dtype is runtime.float32  # the gradient comes back through the recorded cast


def test_autocast_disabled_forms_are_no_ops():
    x = runtime.randn(2, 3)
    with runtime.amp.autocast(device_type="cuda", dtype=runtime.float16, enabled=False):
        assert (x @ x.T).dtype is runtime.float32
    with pytest.warns(UserWarning, match="CUDA is not available"):
        ctx = runtime.autocast("cuda", dtype=runtime.float16)
    with ctx:
        assert (x @ x.T).dtype is runtime.float32
    with pytest.warns(UserWarning, match="target dtype is not supported"):
        ctx = runtime.autocast("cpu", dtype=runtime.float32)
    with ctx:
        assert (x @ x.T).dtype is runtime.float32
    assert runtime.get_autocast_dtype("cpu") is runtime.bfloat16  # torch's CPU default, outside autocast too
    with runtime.autocast("cpu"):
        assert runtime.get_autocast_dtype("cpu") is runtime.bfloat16 and (x @ x.T).dtype is runtime.bfloat16
        assert (x + 1).dtype is runtime.float32

    @runtime.autocast("cpu", dtype=runtime.float16)
    def f(t):
        return t @ t.T

    assert f(x).dtype is runtime.float16


def test_grad_scaler_scales_unscales_and_skips_non_finite_steps():
    p = runtime.nn.Parameter(runtime.ones(3))
    opt = runtime.optim.SGD([p], lr=0.1)
    scaler = runtime.amp.GradScaler(init_scale=4.0, growth_interval=1)
    loss = (p * 2).sum()
    scaler.scale(loss).backward()
    assert p.grad.tolist() == [8.0, 8.0, 8.0]
    scaler.step(opt)
    scaler.update()
    assert p.detach().tolist() == pytest.approx([0.8] * 3) and scaler.get_scale() == 8.0
    opt.zero_grad()
    (p * float("inf")).sum().backward()
    scaler.step(opt)  # skipped: the gradients hold inf
    scaler.update()
    assert p.detach().tolist() == pytest.approx([0.8] * 3) and scaler.get_scale() == 4.0
    off = runtime.amp.GradScaler(enabled=False)
    assert off.scale(loss) is loss and off.state_dict() == {}
    assert not runtime.cuda.amp.GradScaler(enabled=False).is_enabled()


def test_compile_returns_the_model_with_a_note():
    model = runtime.nn.Linear(2, 2)
    with pytest.warns(UserWarning, match="nnc.compile"):
        assert runtime.compile(model) is model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert runtime.compile(mode="max-autotune")(len) is len


@pytest.mark.parametrize("backends,works", [("MATH", True), (["FLASH_ATTENTION", "EFFICIENT_ATTENTION"], True),
                                            ("EFFICIENT_ATTENTION", False), (["CUDNN_ATTENTION"], False)])
def test_sdpa_kernel_restricts_the_backends_as_torch_does_on_cpu(torch, backends, works):
    names = backends if isinstance(backends, list) else [backends]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    outcomes = []
    for lib in (runtime, torch):
        chosen = [getattr(lib.nn.attention.SDPBackend, n) for n in names]
        with lib.nn.attention.sdpa_kernel(chosen if isinstance(backends, list) else chosen[0]):
            try:
                out = lib.nn.functional.scaled_dot_product_attention(*(lib.tensor(q),) * 3)
                outcomes.append(out.numpy())
            except RuntimeError as error:
                outcomes.append(str(error))
    assert isinstance(outcomes[0], np.ndarray) == works
    if works:
        np.testing.assert_allclose(outcomes[0], outcomes[1], rtol=1e-5, atol=1e-6)
    else:
        assert outcomes[0] == outcomes[1]  # torch's message
    runtime.nn.functional.scaled_dot_product_attention(*(runtime.tensor(q),) * 3)  # restored after the block
    with pytest.raises(AssertionError, match="SDPBackend"):
        with runtime.nn.attention.sdpa_kernel("math"):
            pass


def test_top_level_in_place_functions_write_their_tensor():
    x = runtime.tensor([-1.0, 2.0])
    assert runtime.relu_(x) is x and x.tolist() == [0.0, 2.0]
    assert runtime.clamp_(x, max=1.0).tolist() == [0.0, 1.0] and runtime.zero_(x).tolist() == [0.0, 0.0]
    assert runtime.sigmoid_(x).tolist() == [0.5, 0.5]


def test_asarray_shares_memory_unless_asked_to_copy():
    a = np.ones(3, np.float32)
    shared, copied = runtime.asarray(a), runtime.asarray(a, copy=True)
    a[0] = 5
    assert shared.tolist() == [5.0, 1.0, 1.0] and copied.tolist() == [1.0, 1.0, 1.0]
    assert runtime.asarray([1, 2]).dtype is runtime.int64 and runtime.asarray(a, requires_grad=True).requires_grad
    with pytest.raises(ValueError, match="without a copy"):
        runtime.asarray(a, dtype=runtime.float64, copy=False)


def test_vmap_typename_and_is_same_size_at_top_level():
    assert runtime.vmap(lambda row: row.sum())(runtime.ones(3, 2)).tolist() == [2.0, 2.0, 2.0]
    assert runtime.typename(runtime.ones(2)) == "torch.FloatTensor" and runtime.typename(3) == "int"
    assert runtime.is_same_size(runtime.ones(2, 3), runtime.zeros(2, 3))


def test_frombuffer_shares_a_buffers_memory():
    data = bytearray((1).to_bytes(4, "little") + (2).to_bytes(4, "little") + (3).to_bytes(4, "little"))
    t = runtime.frombuffer(data, dtype=runtime.int32)
    data[0] = 9
    assert t.tolist() == [9, 2, 3] and runtime.frombuffer(data, dtype=runtime.int32, count=1, offset=4).tolist() == [2]
    with pytest.warns(UserWarning, match="not writable"):
        assert runtime.frombuffer(bytes(4), dtype=runtime.float32).tolist() == [0.0]
    with pytest.raises(ValueError, match="offset"):
        runtime.frombuffer(data, dtype=runtime.int32, offset=12)


def test_split_methods_take_indices_as_arguments_and_einsum_takes_sublists():
    x = runtime.arange(12.0).reshape(2, 6)
    assert [tuple(t.shape) for t in x.hsplit(1, 2)] == [(2, 1), (2, 1), (2, 4)]
    assert [tuple(t.shape) for t in runtime.arange(24.0).reshape(2, 3, 4).dsplit(1, 3)] == [(2, 3, 1), (2, 3, 2),
                                                                                            (2, 3, 1)]
    np.testing.assert_allclose(runtime.einsum(x, [0, 1], x, [2, 1], [0, 2]).numpy(),
                               runtime.einsum("ij,kj->ik", x, x).numpy())
    assert tuple(runtime.einsum(x, (1, 0)).shape) == (6, 2) and tuple(runtime.einsum(x, runtime.tensor([1, 0])).shape) \
        == (6, 2) and tuple(runtime.einsum(x, [Ellipsis, 1], [1]).shape) == (6,)
    with pytest.raises(ValueError, match="valid range"):
        runtime.einsum(x, [0, 60])


def test_default_device_setting_and_device_blocks():
    """set_default_device and `with torch.device(...)` choose where factories put new tensors (the current
    tutorials call set_default_device); an unavailable device is refused before anything changes."""
    assert runtime.get_default_device() == runtime.device("cpu")
    runtime.set_default_device("cpu")
    try:
        assert runtime.zeros(2).device == runtime.device("cpu")
        with runtime.device("cpu") as d:
            assert d == runtime.device("cpu") and runtime.get_default_device() == d
            assert runtime.ones(1).device == runtime.device("cpu")
        if not runtime.cuda.is_available():
            with pytest.raises(RuntimeError, match="not available"):
                runtime.set_default_device("cuda")
            assert runtime.get_default_device() == runtime.device("cpu")
    finally:
        runtime.set_default_device(None)
