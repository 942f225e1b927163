"""The auxiliary subgoal target and head."""

import numpy as np
import pytest
import torch

from capsule_rollout.policies.chunk_dataset import ChunkDataset, subgoal_targets
from capsule_rollout.tabletop.flow_policy import FlowPolicy
from tests.policies.tiny import TINY_POLICY, tiny_policy


def test_targets_are_the_state_after_each_subtask_run():
    states = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
    ids = np.array([0, 0, 1, 1, 1, 0, 1])  # two episodes: steps 0..4 and 5..6
    out = subgoal_targets(states, ids, np.array([5, 7]))
    # episode 1: run [0,1] ends when step 2 shows the next subtask; run [2..4] is the last -> step 4
    assert out[:2].tolist() == [states[2].tolist()] * 2
    assert out[2:5].tolist() == [states[4].tolist()] * 3
    # episode 2 never borrows episode 1's steps: run [5] -> step 6, run [6] -> step 6
    assert out[5].tolist() == states[6].tolist() and out[6].tolist() == states[6].tolist()
    with pytest.raises(ValueError, match="same steps"):
        subgoal_targets(states, ids[:5], np.array([5, 7]))


def test_subgoal_loss_trains_the_head_and_the_batch_carries_targets():
    model = tiny_policy()
    n = 6
    data = ChunkDataset(images={"front": np.zeros((n, 16, 16, 3), np.uint8)}, states=np.zeros((n, 8), np.float32),
                        actions=np.zeros((n, 4), np.float32), tokens=np.ones((n, 24), np.int64),
                        episode_ends=np.array([n]), chunk_length=TINY_POLICY.chunk_length,
                        subgoals=np.full((n, 3), 0.5, np.float32))
    batch = data.batch(torch.arange(3))
    assert batch["subgoal"].shape == (3, 3)
    lang = model.embed_language(batch["tokens"])
    args = (batch["images"], batch["state"], lang, torch.zeros(3, dtype=torch.long), batch["actions"])
    torch.manual_seed(0)
    plain = model.loss(*args, generator=torch.Generator().manual_seed(1))
    with_goal = model.loss(*args, generator=torch.Generator().manual_seed(1), subgoal=batch["subgoal"])
    assert with_goal > plain  # the head's error is added
    with_goal.backward()
    assert model.subgoal[0].weight.grad.abs().sum() > 0
    features = model.features(batch["images"], batch["state"], lang)
    assert model.predict_subgoal(features).shape == (3, 3)
    with pytest.raises(ValueError, match="subgoal_dim=0"):
        FlowPolicy(TINY_POLICY.__class__(**{**TINY_POLICY.to_json(), "subgoal_dim": 0})).predict_subgoal(features)
