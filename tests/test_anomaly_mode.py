"""Anomaly detection, as torch's: inside detect_anomaly a backward node returning nan raises torch's error, and a
node that fails warns with the user's forward line that made it; set_detect_anomaly switches it, and restores the
previous setting after a `with` block."""
import warnings

import pytest

import runtime
from helpers import needs_torch


def _divide_by_itself(lib):
    x = lib.tensor([0.0, 1.0], requires_grad=True)
    return (x / x).sum()  # the line the warning names


def test_a_nan_gradient_raises_and_names_the_forward_line():
    with pytest.warns(UserWarning, match="Anomaly Detection has been enabled"):
        mode = runtime.autograd.detect_anomaly()
    with mode:
        loss = _divide_by_itself(runtime)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(RuntimeError, match=r"^Function 'DivBackward0' returned nan values in its 1th "
                                                   r"output\.$"):
                loss.backward()
    (warning,) = [w for w in caught if "Error detected in" in str(w.message)]
    text = str(warning.message)
    assert text.startswith("Error detected in DivBackward0. Traceback of forward call that caused the error:")
    assert "in _divide_by_itself" in text and "return (x / x).sum()" in text
    assert "runtime/" not in text.replace("\\", "/")  # the user's frames, not runtime's own
    assert not runtime.is_anomaly_enabled()


@needs_torch
def test_the_error_is_torchs(torch):
    with pytest.warns(UserWarning), torch.autograd.detect_anomaly():
        loss = _divide_by_itself(torch)
        with pytest.raises(RuntimeError) as theirs:
            loss.backward()
    with pytest.warns(UserWarning), runtime.autograd.detect_anomaly():
        loss = _divide_by_itself(runtime)
        with pytest.raises(RuntimeError) as ours:
            loss.backward()
    assert str(ours.value) == str(theirs.value)


def test_without_it_or_without_the_nan_check_nan_gradients_pass():
    _divide_by_itself(runtime).backward()  # off: no check, as in torch
    with pytest.warns(UserWarning), runtime.autograd.detect_anomaly(check_nan=False):
        assert runtime.is_anomaly_enabled() and not runtime.is_anomaly_check_nan_enabled()
        loss = _divide_by_itself(runtime)
        loss.backward()
    assert not runtime.is_anomaly_enabled() and runtime.is_anomaly_check_nan_enabled()


def test_a_failing_node_names_its_forward_line_and_its_own_error_propagates():
    def refuse(grad):
        raise ValueError("a hook refused")

    with runtime.autograd.set_detect_anomaly(True):
        x = runtime.ones(2, requires_grad=True)
        y = x * 3  # made while anomaly detection is on
        y.register_hook(refuse)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match="a hook refused"):
                y.sum().backward()
    assert any("Error detected in MulBackward0" in str(w.message) and "y = x * 3" in str(w.message) for w in caught)


def test_set_detect_anomaly_switches_now_and_restores_after_a_with_block():
    runtime.autograd.set_detect_anomaly(True)
    try:
        assert runtime.is_anomaly_enabled()
        with runtime.autograd.set_detect_anomaly(False):
            assert not runtime.is_anomaly_enabled()
        assert runtime.is_anomaly_enabled()
    finally:
        runtime.autograd.set_detect_anomaly(False)
    assert not runtime.is_anomaly_enabled()


def test_the_trace_keeps_a_users_file_whose_name_starts_like_runtimes_directory(tmp_path, monkeypatch):
    import importlib.util

    from runtime.autograd import anomaly_mode

    monkeypatch.setattr(anomaly_mode, "_RUNTIME_DIR", str(tmp_path / "runtime"))
    user_file = tmp_path / "runtime_helpers.py"
    user_file.write_text("from runtime.autograd import anomaly_mode\n\n\ndef where():\n"
                         "    return anomaly_mode.forward_trace()\n")
    spec = importlib.util.spec_from_file_location("runtime_helpers", user_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert f'File "{user_file}", line 5, in where' in module.where()
