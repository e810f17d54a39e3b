"""The layers added for issue 15 that are pure tensor programs compile with nnc: forward and parameter gradients
equal eager's."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
import runtime.nn as nn

RNG = np.random.default_rng(0)

MODELS = {
    "Conv1d-reflect": (lambda: nn.Sequential(nn.Conv1d(2, 3, 3, padding=1, padding_mode="reflect"), nn.ELU()),
                       (2, 2, 8)),
    "ConvTranspose2d": (lambda: nn.Sequential(nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1), nn.Mish()),
                        (2, 2, 4, 4)),
    "GroupNorm-Upsample": (lambda: nn.Sequential(nn.GroupNorm(2, 4), nn.Upsample(scale_factor=2, mode="bilinear"),
                                                 nn.Hardswish()), (2, 4, 3, 3)),
    "InstanceNorm-PixelShuffle": (lambda: nn.Sequential(nn.InstanceNorm2d(4, affine=True), nn.PixelShuffle(2),
                                                        nn.ReplicationPad2d(1)), (2, 4, 3, 3)),
    "RMSNorm-PReLU-GLU": (lambda: nn.Sequential(nn.Linear(4, 6), nn.RMSNorm(6), nn.PReLU(), nn.GLU()), (3, 4)),
    "AdaptiveMaxPool-LRN": (lambda: nn.Sequential(nn.Conv2d(3, 3, 1), nn.LocalResponseNorm(2), nn.AdaptiveMaxPool2d(2)),
                            (2, 3, 5, 5)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_compiled_equals_eager(name):
    import nnc

    make, shape = MODELS[name]
    runtime.manual_seed(0)
    model = make().double()
    x = runtime.tensor(RNG.standard_normal(shape))
    eager = model(x)
    eager.sum().backward()
    grads = {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
    model.zero_grad()
    out = nnc.compile(model)(x)
    np.testing.assert_allclose(out.detach().numpy(), eager.detach().numpy(), rtol=1e-10, atol=1e-12)
    out.sum().backward()
    for k, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[k], rtol=1e-9, atol=1e-12, err_msg=k)
