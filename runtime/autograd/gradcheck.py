"""gradcheck: compare autograd gradients with central finite differences in float64 (or complex128)."""
from __future__ import annotations

import numpy as np


def numerical_jacobian_vector(fn, inputs, index, seed, eps):
    """d(Re sum(conj(seed) * fn(inputs)))/d(inputs[index]) by central differences, one element at a time; for a
    complex input, the derivative by its real part plus i times the one by its imaginary part (torch's gradient)."""
    x = inputs[index]
    flat = x._data.reshape(-1)
    grad = np.zeros(flat.shape, dtype=flat.dtype)
    steps = (eps, eps * 1j) if flat.dtype.kind == "c" else (eps,)
    for k in range(flat.size):
        original = flat[k]
        for step in steps:
            flat[k] = original + step
            plus = _weighted_output(fn(*inputs), seed)
            flat[k] = original - step
            minus = _weighted_output(fn(*inputs), seed)
            flat[k] = original
            grad[k] += (plus - minus) / (2 * eps) * (step / eps)
    return grad.reshape(x._data.shape)


def _weighted_output(out, seed) -> float:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return float(sum((np.conj(s) * o._data.astype(np.result_type(o._data, np.float64))).real.sum()
                     for o, s in zip(outs, seed)))


def gradcheck(fn, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True, seed=0) -> bool:
    """Check autograd's gradients of fn at float64 `inputs` against finite differences."""
    from ..autograd import grad as autograd_grad
    from ..tensor import Tensor

    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    diff_idx = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    for i in diff_idx:
        if inputs[i]._data.dtype not in (np.float64, np.complex128):
            raise ValueError(f"gradcheck needs float64 or complex128 inputs; input {i} is {inputs[i].dtype}")
    out = fn(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    rng = np.random.default_rng(seed)
    seeds = [_seed(rng, o._data) for o in outs]
    analytic = autograd_grad(outs, [inputs[i] for i in diff_idx],
                             [Tensor._from_array(s.astype(o._data.dtype)) for s, o in zip(seeds, outs)],
                             allow_unused=True)
    for i, a in zip(diff_idx, analytic):
        numeric = numerical_jacobian_vector(fn, inputs, i, seeds, eps)
        got = np.zeros_like(numeric) if a is None else a._data
        if not np.allclose(got, numeric, atol=atol, rtol=rtol):
            if raise_exception:
                worst = np.max(np.abs(got - numeric))
                raise AssertionError(f"gradcheck failed for input {i}: max abs difference {worst:.3g}\n"
                                     f"analytical:\n{got}\nnumerical:\n{numeric}")
            return False
    return True


def _seed(rng, out: np.ndarray) -> np.ndarray:
    """Random output weights: complex ones for a complex output."""
    values = rng.standard_normal(out.shape)
    return values + 1j * rng.standard_normal(out.shape) if out.dtype.kind == "c" else values
