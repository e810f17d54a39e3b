"""torch's top-level forms of nn.functional's ops (torch.conv2d, torch.dropout(input, p, train), torch.batch_norm
with weight and bias first, torch.embedding(weight, indices), torch.rsub, ...): each called with aten's signature
gives torch's values and gradients."""
import numpy as np
import pytest

import runtime
from helpers import needs_torch

pytestmark = needs_torch

RNG = np.random.default_rng(11)


def R(*shape):
    return RNG.standard_normal(shape)


X4, W4, B4 = R(2, 3, 6, 6), R(4, 3, 3, 3), R(4)
X3, W3 = R(2, 3, 9), R(4, 3, 3)
X5, W5 = R(1, 2, 4, 4, 4), R(3, 2, 2, 2, 2)
MEAN, VAR = RNG.random(3), RNG.random(3) + 0.5
TABLE, IDS = R(7, 4), np.array([[0, 3, 6], [2, 2, 5]])

# name -> (call(lib, *tensors), the float64 arrays given as tensors requiring grad, other arrays as plain tensors)
CASES = {
    "conv1d": (lambda L, x, w: L.conv1d(x, w, None, 2, 1), [X3, W3], []),
    "conv2d": (lambda L, x, w, b: L.conv2d(x, w, b, 1, 1, 1, 1), [X4, W4, B4], []),
    "conv3d": (lambda L, x, w: L.conv3d(x, w), [X5, W5], []),
    "conv_transpose1d": (lambda L, x, w: L.conv_transpose1d(x, w.transpose(0, 1), None, 2, 1, 1), [X3, W3], []),
    "conv_transpose2d": (lambda L, x, w: L.conv_transpose2d(x, w.transpose(0, 1), None, 2), [X4, W4], []),
    "dropout (eval)": (lambda L, x: L.dropout(x, 0.3, False), [X3], []),
    "alpha_dropout (eval)": (lambda L, x: L.alpha_dropout(x, 0.3, False), [X3], []),
    "layer_norm": (lambda L, x, w, b: L.layer_norm(x, (6,), w, b, 1e-5, True), [X4, R(6), R(6)], []),
    "group_norm": (lambda L, x, w, b: L.group_norm(x, 3, w, b, 1e-5, True), [X4, R(3), R(3)], []),
    "rms_norm": (lambda L, x, w: L.rms_norm(x, [6], w, 1e-6), [X4, R(6)], []),
    "batch_norm (eval)": (lambda L, x, w, b, m, v: L.batch_norm(x, w, b, m, v, False, 0.1, 1e-5, True),
                          [X4, R(3), R(3)], [MEAN, VAR]),
    "batch_norm (train)": (lambda L, x, w, b: L.batch_norm(x, w, b, None, None, True, 0.1, 1e-5, True),
                           [X4, R(3), R(3)], []),
    "instance_norm": (lambda L, x, w, b: L.instance_norm(x, w, b, None, None, True, 0.1, 1e-5, True),
                      [X4, R(3), R(3)], []),
    "embedding": (lambda L, w, i: L.embedding(w, i), [TABLE], [IDS]),
    "embedding padding_idx": (lambda L, w, i: L.embedding(w, i, 2), [TABLE], [IDS]),
    "max_pool1d": (lambda L, x: L.max_pool1d(x, 2), [X3], []),
    "max_pool2d": (lambda L, x: L.max_pool2d(x, 3, 2, 1), [X4], []),
    "max_pool3d": (lambda L, x: L.max_pool3d(x, 2, [], 0, 1, True), [X5], []),
    "avg_pool1d": (lambda L, x: L.avg_pool1d(x, 3, 2, 1), [X3], []),
    "adaptive_avg_pool1d": (lambda L, x: L.adaptive_avg_pool1d(x, 4), [X3], []),
    "adaptive_max_pool1d": (lambda L, x: L.adaptive_max_pool1d(x, 4)[0], [X3], []),
    "pixel_shuffle": (lambda L, x: L.pixel_shuffle(x, 2), [R(1, 8, 3, 3)], []),
    "pixel_unshuffle": (lambda L, x: L.pixel_unshuffle(x, 3), [X4], []),
    "channel_shuffle": (lambda L, x: L.channel_shuffle(x, 3), [R(1, 6, 2, 2)], []),
    "prelu": (lambda L, x, w: L.prelu(x, w), [X4, RNG.random(3)], []),
    "selu": (lambda L, x: L.selu(x), [X3], []),
    "celu": (lambda L, x: L.celu(x, 0.75), [X3], []),  # NOTE: torch rounds alpha to float32 in its backward
    "rrelu (eval)": (lambda L, x: L.rrelu(x, 0.1, 0.3, False), [X3], []),
    "threshold": (lambda L, x: L.threshold(x, 0.2, -1.0), [X3], []),
    "hardshrink": (lambda L, x: L.hardshrink(x, 0.4), [X3], []),
    "cosine_similarity": (lambda L, a, b: L.cosine_similarity(a, b, 1, 1e-8), [R(4, 5), R(4, 5)], []),
    "pairwise_distance": (lambda L, a, b: L.pairwise_distance(a, b, 3.0, 1e-6, True), [R(4, 5), R(4, 5)], []),
    "pdist": (lambda L, x: L.pdist(x, 2), [R(5, 3)], []),
    "bilinear": (lambda L, a, b, w, c: L.bilinear(a, b, w, c), [R(4, 3), R(4, 2), R(5, 3, 2), R(5)], []),
    "rsub tensor": (lambda L, a, b: L.rsub(a, b, alpha=2), [R(3), R(3)], []),
    "rsub scalar": (lambda L, a: L.rsub(a, 1.5), [R(3)], []),
    "row_stack": (lambda L, a, b: L.row_stack([a, b]), [R(3), R(3)], []),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_torch(torch, name):
    call, grads, plain = CASES[name]
    results = []
    for lib in (torch, runtime):
        leaves = [lib.tensor(a, requires_grad=True) for a in grads]
        others = [lib.tensor(a) for a in plain]
        out = call(lib, *leaves, *others)
        out.backward(lib.tensor(np.random.default_rng(3).standard_normal(tuple(out.shape))))
        results.append([out.detach().numpy()] + [t.grad.numpy() for t in leaves])
    for k, (got, want) in enumerate(zip(results[1], results[0])):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=f"{name}: {'output' if k == 0 else k}")


def test_dropout_in_training_keeps_its_rate_and_scale():
    x = runtime.ones(20000)
    y = runtime.dropout(x, 0.25, True)
    kept = y.numpy() != 0
    assert abs(kept.mean() - 0.75) < 0.02 and np.allclose(y.numpy()[kept], 1 / 0.75)


def test_rrelu_with_a_generator_is_a_clear_error():
    with pytest.raises(NotImplementedError, match="rrelu\\(generator=...\\) is not supported"):
        runtime.rrelu(runtime.ones(2), generator=runtime.Generator())
