"""Tensor.unfold with windows that do not overlap (size <= step, and the dim's last step - size elements after the
last window) is a view, as torch's: writes into the windows reach the tensor; values, gradients and compiled results
agree with torch and eager. Other windows are a copy (their values still agree)."""
import numpy as np
import pytest

import nnc
import runtime
from runtime import nn
from runtime.autograd import gradcheck

SHAPES = [((7,), 0, 2, 2), ((7,), 0, 2, 3), ((3, 8, 2), 1, 3, 3), ((3, 8, 2), 1, 2, 4), ((4, 5), 0, 1, 1),
          ((4, 5), -1, 5, 5), ((2, 6, 6), -1, 3, 5), ((0, 6), 1, 2, 2)]


def _values(shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


@pytest.mark.parametrize("shape,dim,size,step", SHAPES)
def test_writes_into_the_windows_reach_the_tensor(shape, dim, size, step):
    x = runtime.tensor(_values(shape))
    windows = x.unfold(dim, size, step)
    windows.add_(100)
    expected = _values(shape)
    moved = np.moveaxis(expected, dim, -1)
    for k in range((shape[dim] - size) // step + 1):
        moved[..., k * step:k * step + size] += 100
    np.testing.assert_array_equal(x.numpy(), expected)


def _is_view(shape, dim, size, step):
    n = shape[dim]
    return size <= step and ((n - size) // step + 1) * step <= n


def test_the_shapes_above_are_views():
    assert all(_is_view(*case) for case in SHAPES)
    x = runtime.zeros(8)
    assert x.unfold(0, 2, 2)._base is x
    assert x.unfold(0, 2, 3)._base is not x  # its last window ends at 7: one short of a whole step, a copy


@pytest.mark.parametrize("shape,dim,size,step", SHAPES + [((4, 5), 1, 2, 1), ((6,), 0, 4, 1), ((8,), 0, 2, 3)])
def test_values_and_writes_match_torch(shape, dim, size, step, torch):
    x, t = runtime.tensor(_values(shape)), torch.tensor(_values(shape))
    got, want = x.unfold(dim, size, step), t.unfold(dim, size, step)
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    if _is_view(shape, dim, size, step):
        got.mul_(-1)
        want.mul_(-1)
        np.testing.assert_array_equal(x.numpy(), t.numpy())


def test_gradients_through_a_write_into_the_windows():
    w = runtime.tensor(np.random.default_rng(0).standard_normal((3, 9)), dtype=runtime.float64, requires_grad=True)

    def fn(w):
        x = w * 1.0
        x.unfold(1, 2, 3).mul_(w[:, :1].unsqueeze(-1))
        return (x * x).sum(),

    assert gradcheck(fn, (w,))


def test_gradients_match_torch(torch):
    a = np.random.default_rng(1).standard_normal((2, 9, 4))
    x = runtime.tensor(a, requires_grad=True)
    t = torch.tensor(a, requires_grad=True)
    (x.unfold(1, 2, 3) ** 2).sum().backward()
    (t.unfold(1, 2, 3) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy())


class Patches(nn.Module):
    """ViT-style patches by unfold (non-overlapping windows), a linear embedding, and a write into the windows."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 3)

    def forward(self, img):
        img = img * 1.0
        img.unfold(2, 2, 2).unfold(3, 2, 2)[:, :, 0].mul_(0.5)  # halve the first row of patches in place
        patches = img.unfold(2, 2, 2).unfold(3, 2, 2).reshape(img.shape[0], -1, 4)
        return self.embed(patches).tanh().sum() + img.sum()


def test_compiled_unfold_views_match_eager_forward_and_backward():
    runtime.manual_seed(0)
    eager = Patches()
    compiled = nnc.compile(Patches())
    compiled.load_state_dict(eager.state_dict())
    img = np.random.default_rng(2).standard_normal((2, 1, 4, 6)).astype(np.float32)
    a, b = runtime.tensor(img, requires_grad=True), runtime.tensor(img, requires_grad=True)
    out_e, out_c = eager(a), compiled(b)
    out_e.backward()
    out_c.backward()
    np.testing.assert_allclose(out_c.item(), out_e.item(), rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), a.grad.numpy(), rtol=1e-5, atol=1e-6)
    for p, q in zip(eager.parameters(), compiled.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6)
