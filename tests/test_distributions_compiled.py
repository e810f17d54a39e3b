"""Distributions built inside a compiled forward (a PPO actor-critic's Categorical and Normal policies): their
log_prob and entropy compile with the rest of the model, and equal eager mode's values and gradients. Argument
validation reads values, so it runs in eager mode only, as the losses' target checks do."""
from __future__ import annotations

import numpy as np
import pytest

import nnc
import runtime as torch
import runtime.nn as nn
import runtime.nn.functional as F
from runtime.distributions import Categorical, Normal

pytestmark = pytest.mark.usefixtures("fresh_kernel_cache")


class ActorCritic(nn.Module):
    """PPO's clipped objective over a discrete (Categorical) or continuous (Normal) policy, with a value head."""

    def __init__(self, continuous: bool):
        super().__init__()
        self.continuous = continuous
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh())
        self.policy = nn.Linear(16, 2 if continuous else 3)
        self.value = nn.Linear(16, 1)
        self.log_std = nn.Parameter(torch.zeros(2))

    def forward(self, obs, actions, old_log_prob, advantage, returns):
        h = self.body(obs)
        if self.continuous:
            dist = Normal(self.policy(h), self.log_std.exp())
            log_prob, entropy = dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)
        else:
            dist = Categorical(logits=self.policy(h))
            log_prob, entropy = dist.log_prob(actions), dist.entropy()
        ratio = torch.exp(log_prob - old_log_prob)
        clipped = torch.clamp(ratio, 0.8, 1.2)
        policy_loss = -torch.min(ratio * advantage, clipped * advantage).mean()
        return policy_loss + 0.5 * F.mse_loss(self.value(h).squeeze(-1), returns) - 0.01 * entropy.mean()


def _batch(continuous: bool, rng):
    actions = rng.standard_normal((8, 2)) if continuous else rng.integers(0, 3, 8)
    return (torch.tensor(rng.standard_normal((8, 4)), dtype=torch.float32),
            torch.tensor(actions, dtype=torch.float32 if continuous else torch.int64),
            torch.tensor(rng.standard_normal(8) - 1.0, dtype=torch.float32),
            torch.tensor(rng.standard_normal(8), dtype=torch.float32),
            torch.tensor(rng.standard_normal(8), dtype=torch.float32))


@pytest.mark.parametrize("continuous", [False, True])
def test_a_ppo_loss_with_a_distribution_in_forward_compiles_whole(continuous):
    torch.manual_seed(0)
    model = ActorCritic(continuous)
    compiled = nnc.compile(model)
    batch = _batch(continuous, np.random.default_rng(1))
    results = []
    for fn in (model, compiled):
        model.zero_grad()
        loss = fn(*batch)
        loss.backward()
        results.append([loss.item()] + [p.grad.numpy().copy() for p in model.parameters() if p.grad is not None])
    assert len(results[0]) == len(results[1])
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (artifact,) = compiled._cache.values()
    assert type(artifact).__name__ == "Compilation" and not artifact.opaque and artifact.split is None


def test_validation_still_raises_in_eager_mode():
    with pytest.raises(ValueError, match="probs"):
        Categorical(probs=torch.tensor([0.5, -0.1, 0.6]))
    with pytest.raises(ValueError, match="support"):
        Categorical(logits=torch.zeros(3)).log_prob(torch.tensor(5))
