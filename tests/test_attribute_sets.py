"""A forward that keeps a tensor on its module (`self.loss = F.mse_loss(x, self.target)`, `self.kl = ...`,
`self.attn = weights`) compiles: the value is an extra output of the graph, set on the module after each call, with
its gradient history; compiled and eager agree on the attributes, the outputs and every gradient."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import nnc
import runtime as torch
import runtime.nn as nn
import runtime.nn.functional as F
from nnc.trace import Proxy

pytestmark = pytest.mark.usefixtures("fresh_kernel_cache")


def _gram(x):
    b, c, h, w = x.size()
    features = x.view(b * c, h * w)
    return features @ features.t() / (b * c * h * w)


class ContentLoss(nn.Module):
    """The neural style transfer tutorial's shape: a transparent layer that records its loss."""

    def __init__(self, target):
        super().__init__()
        self.target = target.detach()

    def forward(self, x):
        self.loss = F.mse_loss(x, self.target)
        return x


class StyleLoss(nn.Module):
    def __init__(self, target_features):
        super().__init__()
        self.target = _gram(target_features).detach()

    def forward(self, x):
        self.loss = F.mse_loss(_gram(x), self.target)
        return x


def _style_model():
    torch.manual_seed(0)
    conv1, conv2 = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1)
    content, style = torch.rand(1, 3, 10, 10), torch.rand(1, 3, 10, 10)
    with torch.no_grad():
        content_target = conv1(content).relu()
        style_target = conv2(conv1(style).relu())
    model = nn.Sequential(conv1, nn.ReLU(), ContentLoss(content_target), conv2, StyleLoss(style_target))
    return model, content


def _no_graph_breaks(compiled):
    return all(not getattr(a, "graph_breaks", ()) for a in compiled._cache.values())


def _artifacts_compiled(compiled):
    return compiled._cache and all(hasattr(a, "set_attributes") for a in compiled._cache.values())


def test_style_transfer_losses_and_the_image_gradient_match_eager():
    model, content = _style_model()
    compiled = nnc.compile(model)
    images = {}
    for name, fn in (("eager", model), ("compiled", compiled)):
        image = content.clone().requires_grad_(True)
        optimizer = torch.optim.Adam([image], lr=0.05)
        losses = []
        for _ in range(3):  # the input image is what trains, as in style transfer
            optimizer.zero_grad()
            fn(image)
            loss = 1e3 * model[4].loss + model[2].loss
            loss.backward()
            losses.append(loss.item())
            optimizer.step()
        images[name] = (image.detach().numpy(), losses)
        model.zero_grad()
    np.testing.assert_allclose(images["compiled"][1], images["eager"][1], rtol=1e-4)
    np.testing.assert_allclose(images["compiled"][0], images["eager"][0], rtol=1e-4, atol=1e-5)
    assert _artifacts_compiled(compiled) and _no_graph_breaks(compiled)
    assert [a.set_attributes for a in compiled._cache.values()][0] == [("2", "loss"), ("4", "loss")]


class Encoder(nn.Module):
    """A VAE encoder that keeps its KL term for the training loop (a common tutorial's shape)."""

    def __init__(self):
        super().__init__()
        self.hidden, self.mu, self.log_sigma = nn.Linear(8, 16), nn.Linear(16, 3), nn.Linear(16, 3)

    def forward(self, x, eps):
        h = torch.relu(self.hidden(x))
        mu, sigma = self.mu(h), torch.exp(self.log_sigma(h))
        self.kl = (sigma ** 2 + mu ** 2 - torch.log(sigma) - 0.5).sum()
        return mu + sigma * eps


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = Encoder(), nn.Linear(3, 8)

    def forward(self, x, eps):
        return torch.sigmoid(self.decoder(self.encoder(x, eps)))


def test_a_vae_training_loss_reading_the_encoders_kl_matches_eager():
    torch.manual_seed(1)
    model = VAE()
    x, eps = torch.rand(5, 8), torch.randn(5, 3)
    compiled = nnc.compile(model)
    grads = {}
    for name, fn in (("eager", model), ("compiled", compiled)):
        model.zero_grad()
        out = fn(x, eps)
        kl = model.encoder.kl
        assert kl.requires_grad and kl.grad_fn is not None
        ((out - x) ** 2).sum().add(kl).backward()
        grads[name] = [kl.item()] + [p.grad.numpy().copy() for p in model.parameters()]
    for got, want in zip(grads["compiled"], grads["eager"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert _artifacts_compiled(compiled) and _no_graph_breaks(compiled)


class KeepsAttention(nn.Module):
    """Stashes its attention weights for inspection, and reads its own stash back in the same forward."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 12)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        self.attn = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
        self.out = self.attn @ v
        return self.out


def test_attributes_follow_every_call_and_reads_in_forward_see_the_new_value():
    torch.manual_seed(2)
    model = KeepsAttention()
    compiled = nnc.compile(model)
    with torch.no_grad():
        for step in range(3):  # each call leaves its own values, as eager mode does
            x = torch.randn(2, 5, 4)
            y = compiled(x)
            attn, out = model.attn.numpy().copy(), model.out
            assert out is y or np.array_equal(out.numpy(), y.numpy())
            expected = model(x)
            np.testing.assert_allclose(y.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(attn, model.attn.numpy(), rtol=1e-5, atol=1e-6)
    assert _artifacts_compiled(compiled)


class KeepsScores(nn.Module):
    """Keeps its attention weights and returns a dict: nested outputs of a whole graph."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        self.scores = torch.softmax(self.proj(x) @ x.transpose(-2, -1), dim=-1)
        return {"mixed": self.scores @ x}


def test_the_no_grad_fast_path_serves_models_that_keep_values():
    torch.manual_seed(3)
    model = KeepsScores()
    compiled = nnc.compile(model)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 5, 4)
            got = compiled(x)
            scores = model.scores.numpy().copy()
            want = model(x)
            np.testing.assert_allclose(got["mixed"].numpy(), want["mixed"].numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(scores, model.scores.numpy(), rtol=1e-5, atol=1e-6)
    (artifact,) = compiled._cache.values()
    assert artifact.direct_runner() is not None  # one numba call, with the attribute set after it


class Accumulates(nn.Module):
    """Reads the tensor an earlier call left and sets it again: the graph cannot keep that, so it runs eagerly."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.total = torch.zeros(())

    def forward(self, x):
        y = self.lin(x)
        self.total = self.total + y.sum()
        return y


def test_a_forward_reading_what_an_earlier_call_set_stays_correct():
    torch.manual_seed(3)
    model, twin = Accumulates(), Accumulates()
    twin.load_state_dict(model.state_dict())
    compiled = nnc.compile(model)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            x = torch.randn(4, 3)
            np.testing.assert_allclose(compiled(x).numpy(), twin(x).numpy(), rtol=1e-6)
    np.testing.assert_allclose(model.total.item(), twin.total.item(), rtol=1e-5)


def test_the_traced_module_keeps_none_of_the_traced_values():
    model, content = _style_model()
    nnc.compile(model)(content)
    for module in model.modules():
        for value in vars(module).values():
            assert not isinstance(value, Proxy)
    assert isinstance(model[2].loss, torch.Tensor) and model[2].loss.ndim == 0
