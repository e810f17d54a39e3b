"""F.embedding_bag / nn.EmbeddingBag: values and weight gradients equal torch's for every mode, offsets layout,
padding index and per-sample weights; and sum/mean bags compile, reading each call's offsets (the torchtext text
classification tutorial's model trains compiled as eagerly)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import nnc
import runtime
import runtime.nn as nn

from helpers import needs_torch

RNG = np.random.default_rng(0)
WEIGHT = RNG.standard_normal((12, 3))
LAYOUTS = [  # (indices, offsets): empty bags, a bag of one, a last offset short of the input's end
    (np.array([1, 2, 4, 5, 4, 3, 2, 9, 0, 11]), np.array([0, 2, 2, 5, 10])),
    (np.array([1, 2, 4, 5, 4, 3]), np.array([0, 3, 5])),
]


def _bags(lib, indices, offsets, **kwargs):
    """(output, weight gradient) of embedding_bag over WEIGHT with a position-dependent upstream gradient."""
    weight = lib.tensor(WEIGHT.copy(), requires_grad=True)
    out = lib.nn.functional.embedding_bag(lib.tensor(indices), weight, None if offsets is None else
                                          lib.tensor(offsets), **kwargs)
    (out * lib.tensor(np.arange(out.numel(), dtype=np.float64).reshape(out.shape))).sum().backward()
    return out.detach().numpy(), weight.grad.numpy()


@needs_torch
@pytest.mark.parametrize("mode,include_last_offset,padding_idx",
                         list(itertools.product(["sum", "mean", "max"], [False, True], [None, 2, -1])))
@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_1d_bags_match_torch(torch, mode, include_last_offset, padding_idx, layout):
    indices, offsets = LAYOUTS[layout]
    kwargs = dict(mode=mode, include_last_offset=include_last_offset, padding_idx=padding_idx)
    for got, want in zip(_bags(runtime, indices, offsets, **kwargs), _bags(torch, indices, offsets, **kwargs)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_torch
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_per_sample_weights_match_torch(torch, include_last_offset):
    indices, offsets = LAYOUTS[1]
    weights = RNG.standard_normal(len(indices))
    results = [_bags(lib, indices, offsets, mode="sum", include_last_offset=include_last_offset,
                     per_sample_weights=lib.tensor(weights)) for lib in (runtime, torch)]
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@needs_torch
@pytest.mark.parametrize("mode,padding_idx", list(itertools.product(["sum", "mean", "max"], [None, 4])))
def test_2d_bags_match_torch(torch, mode, padding_idx):
    indices = RNG.integers(0, 12, (3, 4))
    for got, want in zip(_bags(runtime, indices, None, mode=mode, padding_idx=padding_idx),
                         _bags(torch, indices, None, mode=mode, padding_idx=padding_idx)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_offsets_must_start_at_zero():
    with pytest.raises(RuntimeError, match=r"offsets\[0\] has to be 0.*got 1"):
        runtime.nn.functional.embedding_bag(runtime.tensor([1, 2, 3]), runtime.randn(5, 2), runtime.tensor([1, 2]))


class TextClassifier(nn.Module):
    """The torchtext tutorial's model: the mean of a text's word embeddings, then a linear layer."""

    def __init__(self, vocab=50, dim=8, classes=4):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab, dim)
        self.fc = nn.Linear(dim, classes)
        self.embedding.weight.data.uniform_(-0.5, 0.5)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))


def test_a_text_classifier_trains_compiled_as_eagerly_with_each_batchs_offsets():
    """Batches of the same sizes whose texts split differently: the compiled model reads each call's offsets."""
    runtime.manual_seed(0)
    eager, twin = TextClassifier(), TextClassifier()
    twin.load_state_dict(eager.state_dict())
    compiled = nnc.compile(twin)
    rng = np.random.default_rng(1)
    batches = [(runtime.tensor(rng.integers(0, 50, 20)), runtime.tensor(offsets), runtime.tensor(rng.integers(0, 4, 4)))
               for offsets in ([0, 5, 9, 15], [0, 1, 2, 19], [0, 10, 10, 12])]
    losses = {}
    for name, model, params in (("eager", eager, eager), ("compiled", compiled, twin)):
        optimizer = runtime.optim.SGD(params.parameters(), lr=0.5)
        losses[name] = []
        for text, offsets, label in batches:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(text, offsets), label)
            loss.backward()
            optimizer.step()
            losses[name].append(loss.item())
    np.testing.assert_allclose(losses["compiled"], losses["eager"], rtol=1e-5)
    for a, b in zip(eager.parameters(), twin.parameters()):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-5, atol=1e-6)
    (artifact,) = compiled._cache.values()
    assert not artifact.opaque and artifact.split is None
