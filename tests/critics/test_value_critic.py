import numpy as np
import pytest
import torch

from capsules import Arena
from critics.critic_runtime import CriticRuntime
from critics.returns import normalized_returns
from tests.policies.tiny import tiny_critic


def test_two_hot_targets_have_the_exact_expectation():
    critic = tiny_critic()
    targets = torch.tensor([-1.0, -0.73, -0.5, -0.0125, 0.0, 0.4, -3.0])
    probs = critic.two_hot(targets)
    assert torch.allclose(probs.sum(-1), torch.ones(7))
    assert torch.allclose(probs @ critic.support, targets.clamp(-1, 0), atol=1e-6)
    assert ((probs > 0).sum(-1) <= 2).all()


def test_value_is_the_expectation_within_bounds():
    critic = tiny_critic()
    logits = torch.randn(5, critic.config.bins)
    value = critic.value(logits)
    assert value.shape == (5,) and torch.all(value >= -1) and torch.all(value <= 0)
    peaked = torch.full((1, critic.config.bins), -1e9)
    peaked[0, 5] = 0.0
    assert torch.isclose(critic.value(peaked), critic.support[5:6]).all()


def test_normalized_returns_on_hand_made_episodes():
    # success after 4 steps (rewards -1, -1, -1, 0), max 10 steps
    assert np.allclose(normalized_returns([-1, -1, -1, 0], True, 10), [-0.3, -0.2, -0.1, 0.0])
    # failure: a -max_steps penalty clips every step to -1
    assert np.allclose(normalized_returns([-1, -1, -1], False, 10), [-1, -1, -1])
    # a small explicit penalty keeps the shape
    assert np.allclose(normalized_returns([-1, -1], False, 10, failure_penalty=-1.0), [-0.3, -0.2])
    with pytest.raises(ValueError):
        normalized_returns([-1], True, 0)


def test_critic_learns_a_constant_target():
    critic = tiny_critic()
    opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
    images = {"front": torch.randint(0, 256, (16, 16, 16, 3), dtype=torch.uint8)}
    state, tokens = torch.randn(16, 8), torch.zeros(16, critic.config.max_tokens, dtype=torch.long)
    target = torch.full((16,), -0.4)
    for _ in range(150):
        loss = critic.loss(images, state, critic.embed_language(tokens), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        value = critic.value(critic.logits(images, state, critic.embed_language(tokens)))
    assert torch.allclose(value, target, atol=0.03)


def test_runtime_refuses_bad_inputs():
    rt = CriticRuntime(tiny_critic())
    Arena([rt]).allocate()
    rt.set_subtask("pick up the red block")
    with pytest.raises(ValueError, match="uint8"):
        rt.evaluate({"front": torch.zeros(16, 16, 3)}, torch.zeros(8))
    with pytest.raises(ValueError, match="non-finite"):
        rt.evaluate({"front": torch.zeros(16, 16, 3, dtype=torch.uint8)}, torch.full((8,), float("inf")))
    value = rt.evaluate({"front": torch.zeros(16, 16, 3, dtype=torch.uint8)}, torch.zeros(8))
    assert value.shape == (1,) and -1 <= float(value) <= 0
