"""Branch values on a hand-made env whose value is known exactly: a coin flipped by the policy's noise."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from capsule_rollout.capsules import Arena, BufferComponent, BufferSpec
from capsule_rollout.envs.rollout_env import ObservationSpec
from capsule_rollout.rollout.branching import (
    BoundaryCapsules,
    BranchActor,
    BranchItem,
    BranchValue,
    ReplayDivergedError,
    branch_episode,
    branch_seed,
    branch_value,
)
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.ray_rollout import run_rollouts
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from tests.rollout.protocol_fakes import DOF, GreedyPolicy

FLIP_STEP = 3  # the step whose action decides the episode


class CoinEnv(BufferComponent):
    """Six steps. The action executed at step FLIP_STEP decides the episode: success iff its first number is
    positive; nothing else matters. With a policy of pure noise, a state before the flip has the value
    P(noise > 0) and one after it is decided (value 1 or 0)."""

    restorable = True
    task = "coin"
    instruction = "flip"
    subtask_texts = ()
    subtask_index = 0

    def __init__(self) -> None:
        super().__init__()
        self.name = "env"
        self.max_steps = 6
        self.action_space = gym.spaces.Box(-1.0, 1.0, (DOF,), np.float32)
        self.observation_spec = ObservationSpec.of(state_dim=2 * DOF)
        self._steps, self.win = 0, 0

    @property
    def steps(self) -> int:
        return self._steps

    def reset(self, *, seed=None):
        self._steps, self.win = 0, 0
        return self.observe(), {"success": False}

    def step(self, action):
        if self._steps == FLIP_STEP:
            self.win = 1 if float(action[0]) > 0 else -1
        self._steps += 1
        done = self._steps == self.max_steps
        success = done and self.win == 1
        return self.observe(), 0.0 if success else -1.0, success, False, {"success": success}

    def observe(self) -> dict:
        return {"state": np.zeros(2 * DOF, np.float32)}

    def success(self, info) -> bool:
        return bool(info["success"])

    def close(self) -> None:
        pass

    def buffer_specs(self):
        return [BufferSpec("steps", (), torch.int64), BufferSpec("win", (), torch.int64)]

    def before_snapshot(self) -> None:
        self.buffers["steps"].fill_(self._steps)
        self.buffers["win"].fill_(self.win)

    def after_restore(self) -> None:
        self._steps, self.win = int(self.buffers["steps"]), int(self.buffers["win"])


def _flip_wins(noise_seed: int) -> bool:
    """Whether the chunk drawn right after a reseed with `noise_seed` flips the coin to success: the chunk
    starts at step 2, so its second action is executed at FLIP_STEP."""
    policy = GreedyPolicy(chunk_length=2, gain=0.0, noise=1.0)
    Arena([policy]).allocate()
    policy.reset(noise_seed)
    return bool(policy.act()[FLIP_STEP - 2, 0] > 0)


@pytest.fixture
def host():
    keeper = BoundaryCapsules()  # every chunk start
    host = RolloutHost(env=CoinEnv(), policy=GreedyPolicy(chunk_length=2, gain=0.0, noise=1.0), critic=None,
                       config=HostConfig(n_exec=2), observers=[keeper])
    yield host, keeper
    host.close()


def test_the_branch_value_is_the_known_one_before_and_after_the_decision(host):
    host, keeper = host
    episode = host.run_episode(7).episode
    expect = (bool(episode.meta.success), episode.meta.length)
    assert sorted(keeper.capsules) == [0, 2, 4] and episode.meta.length == 6
    keeper.enabled = False
    before = branch_value(host, keeper.capsules[2], seed=7, step=2, branches=64, expect=expect)
    known = sum(_flip_wins(branch_seed(7, b)) for b in range(64))
    assert before.successes == known and 0 < known < 64  # exactly the branches whose noise flips it positive
    # the branches hold steps 2-5: -1 per step, the last 0 on success
    assert before.mean_return == pytest.approx(-3 - (64 - known) / 64)
    after = branch_value(host, keeper.capsules[4], seed=7, step=4, branches=16, expect=expect)
    assert after.success_fraction == float(episode.meta.success)  # decided: every branch ends as the episode


def test_a_replay_that_does_not_end_as_the_episode_did_is_refused(host):
    host, keeper = host
    episode = host.run_episode(3).episode
    keeper.enabled = False
    wrong = (not episode.meta.success, episode.meta.length)
    with pytest.raises(ReplayDivergedError, match="did not end as the episode did"):
        branch_value(host, keeper.capsules[4], seed=3, step=4, branches=2, expect=wrong)
    with pytest.raises(ValueError, match="branches must be >= 1"):
        branch_value(host, keeper.capsules[4], seed=3, step=4, branches=0)


def test_an_episode_played_again_from_its_seed_branches_from_the_boundaries_asked(host):
    host, keeper = host
    keeper.enabled = False
    recorded = host.run_episode(7).episode
    result, values = branch_episode(host, 7, steps=(2, 3, 4, 40), branches=64)  # 3: no boundary, 40: past the end
    assert np.array_equal(result.episode.steps["action"], recorded.steps["action"])  # the same episode again
    assert [v.step for v in values] == [2, 4]
    assert values[0].successes == sum(_flip_wins(branch_seed(7, b)) for b in range(64))
    assert values[1].success_fraction == float(recorded.meta.success)
    assert host.observers == [keeper]  # its own observer is gone



def test_the_branch_actor_plays_branch_items_as_branch_episode_does(host):
    host, keeper = host
    keeper.enabled = False
    items = [BranchItem(f"coin-{seed}", seed, steps=(2, 4), branches=8) for seed in (5, 6)]
    reports, stats = run_rollouts(RunSpec(), items, actors=0, host=host, actor_cls=BranchActor)
    assert stats.episodes == 2 and [r.item for r in reports] == items
    for report in reports:
        _, values = branch_episode(host, report.item.seed, steps=(2, 4), branches=8)
        assert [BranchValue.from_json(v) for v in report.extra["branch_values"]] == values
        assert report.episode.steps == {} and report.episode.meta.length == 6  # no step arrays travel back
        # the episode, the check's replay from step 2, 8 branches from each boundary
        assert report.extra["branch_steps"] == 6 + 4 + 8 * 4 + 8 * 2
    with pytest.raises(TypeError, match="BranchItems"):
        run_rollouts(RunSpec(), [WorkItem("coin-9", 9)], actors=0, host=host, actor_cls=BranchActor)
