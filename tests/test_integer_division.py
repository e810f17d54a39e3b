"""Integer division by zero raises torch's ZeroDivisionError, eagerly and compiled; float division gives inf/nan."""
import numpy as np
import pytest

import nnc
import runtime
from runtime import nn


@pytest.mark.parametrize("divide", [lambda a, b: a // b, lambda a, b: a % b,
                                    lambda a, b: runtime.div(a, b, rounding_mode="trunc"),
                                    lambda a, b: runtime.div(a, b, rounding_mode="floor"),
                                    lambda a, b: runtime.remainder(a, 0)])
def test_integer_division_by_zero_raises(divide):
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        divide(runtime.tensor([5, 3]), runtime.tensor([0, 2]))


def test_integer_division_without_zero_and_float_division_by_zero_still_compute():
    a, b = runtime.tensor([7, -7]), runtime.tensor([2, 2])
    assert (a // b).tolist() == [3, -4] and (a % b).tolist() == [1, 1]
    assert runtime.div(a, b, rounding_mode="trunc").tolist() == [3, -3]
    assert np.isinf((runtime.tensor([1.0]) // 0).numpy()).all()


def test_matches_torch(torch):
    for op in ("floor_divide", "remainder"):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            getattr(torch, op)(torch.tensor([5, 3]), torch.tensor([0, 2]))
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            getattr(runtime, op)(runtime.tensor([5, 3]), runtime.tensor([0, 2]))


class Buckets(nn.Module):
    def forward(self, x, width):
        return (x // width) * width + x % width


def test_compiled_integer_division_checks_its_divisor_as_eager():
    """A generated kernel would give 0 for a zero divisor: integer // and % run through the interpreter."""
    compiled = nnc.compile(Buckets())
    x = runtime.arange(12).reshape(3, 4)
    width = runtime.tensor([1, 2, 3, 4])
    np.testing.assert_array_equal(compiled(x, width).numpy(), Buckets()(x, width).numpy())
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(x, runtime.tensor([1, 0, 3, 4]))
    (artifact,) = compiled._cache.values()
    assert all(type(s).__name__ != "KernelStep" or not any(getattr(n.target, "op", None) is not None and
                                                            n.target.op.divisor is not None for n in s.kernel.nodes)
               for s in artifact.forward_plan.steps)
