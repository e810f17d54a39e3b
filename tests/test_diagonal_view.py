"""diagonal is a view, as torch's: writes into it (K.diagonal().add_(eps), .fill_, .copy_) reach the input for any
offset and either order of two dims contiguous together, gradients flow through such writes, and a compiled model
writing a diagonal computes what eager does."""
import numpy as np
import pytest

import runtime
from helpers import needs_torch

CASES = [((3, 3), 0, 0, 1), ((3, 4), 1, 0, 1), ((4, 3), -2, 0, 1), ((2, 3, 3), 0, -2, -1), ((3, 3), 5, 0, 1),
         ((3, 3), 0, 1, 0), ((3, 4), 1, 1, 0), ((2, 3, 4), -1, 2, 1), ((0, 3), 0, 0, 1), ((1, 1), 0, 0, 1)]


@needs_torch
@pytest.mark.parametrize("shape,offset,dim1,dim2", CASES)
def test_writes_into_the_diagonal_reach_the_input_as_in_torch(torch, shape, offset, dim1, dim2):
    values = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    theirs, ours = torch.tensor(values), runtime.tensor(values)
    d_theirs, d_ours = theirs.diagonal(offset, dim1, dim2), ours.diagonal(offset, dim1, dim2)
    assert tuple(d_ours.shape) == tuple(d_theirs.shape)
    np.testing.assert_array_equal(d_ours.numpy(), d_theirs.numpy())
    version = ours._version
    d_theirs.add_(100)
    d_ours.add_(100)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert ours._version > version or d_ours.numel() == 0


@needs_torch
def test_gradients_flow_through_a_write_into_the_diagonal(torch):
    values = np.random.default_rng(0).standard_normal((3, 3))
    grads = []
    for lib in (torch, runtime):
        x = lib.tensor(values, requires_grad=True)
        y = x * 2
        y.diagonal().mul_(y.diagonal().exp())  # reads and writes the view
        (y * lib.tensor(values)).sum().backward()
        grads.append(x.grad.numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12)


def test_a_compiled_model_writing_a_diagonal_matches_eager():
    import nnc

    class Jitter(runtime.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = runtime.nn.Linear(4, 4)

        def forward(self, x):
            k = self.proj(x) @ x.mT
            k.diagonal(dim1=-2, dim2=-1).add_(0.5)
            return k.tanh()

    runtime.manual_seed(0)
    model = Jitter()
    x = runtime.randn(2, 4, 4, requires_grad=True)
    compiled = nnc.compile(model)
    want = model(x)
    want.sum().backward()
    grad, x.grad = x.grad.clone(), None
    got = compiled(x)
    got.sum().backward()
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), grad.numpy(), rtol=1e-5, atol=1e-6)
