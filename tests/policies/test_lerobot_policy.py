"""The LeRobot adapter's state without LeRobot: a stand-in for `LeRobotModel` (a row-wise "network" over each row's
history and generator) drives `LeRobotPolicy` as LeRobot's `select_action` would, in a host and in slots; a LeRobot
directory is recognised by its files, described without LeRobot, and refused in one line where LeRobot is missing.
LeRobot's own ACT and Diffusion Policy run in tests/policies/test_lerobot_venv.py (in LeRobot's venv)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import Arena, restore, snapshot
from capsule_rollout.policies.lerobot_policy import LeRobotPolicy, LeRobotPolicyRows, call_seed, row_generator
from capsule_rollout.rollout.branching import BoundaryCapsules
from capsule_rollout.rollout.host_factory import RunSpec, check_spec, resolve_acting
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from capsule_rollout.rollout.slots.host import ROWS_REPORT, SlotHost, episode_job, instances_by_actor
from capsule_rollout.rollout.sources import LEROBOT_KIND, checkpoint_kind, describe_source, load_source
from capsule_rollout.tabletop.tabletop_env import TabletopEnv

KEYS = {"observation.state": "state", "observation.images.front": "image_front"}


class FakeLeRobot:
    """What `LeRobotPolicy` needs of a `LeRobotModel`: a chunk per row from its history (the oldest frame counts:
    a history shifted wrongly changes the actions) and, when it samples, its generator."""

    loaded = 0

    def __init__(self, n_obs: int = 2, n_action: int = 3, samples: bool = True) -> None:
        self.path, self.keys, self.device = "fake", dict(KEYS), torch.device("cpu")
        self.n_obs_steps, self.n_action_steps, self.action_dim, self.samples = n_obs, n_action, 4, samples
        self.fingerprint = {"kind": "lerobot", "type": "fake", "history": str(n_obs)}
        self.rows_seen: list[int] = []
        FakeLeRobot.loaded += 1

    def env_shapes(self):
        return {"state": ((8,), np.dtype(np.float32)), "image_front": ((64, 64, 3), np.dtype(np.uint8))}

    def chunk_rows(self, history, generators):
        state, image = history["state"], history["image_front"].to(torch.float32)
        n = state.shape[0]
        self.rows_seen.append(n)
        weights = torch.arange(1, self.n_obs_steps + 1, dtype=torch.float32)
        feature = (state[..., :4] * weights[None, :, None]).sum(1) / weights.sum()  # (N, 4)
        feature = feature + image.mean(dim=(1, 2, 3, 4))[:, None] / 255
        steps = torch.linspace(0.5, 1.0, self.n_action_steps)[None, :, None]
        chunk = -0.3 * feature[:, None, :] * steps
        if self.samples:
            chunk = chunk + 0.05 * torch.stack([torch.randn(self.n_action_steps, 4, generator=g) for g in generators])
        return chunk.to(torch.float32)


def _obs(rng: np.random.Generator) -> dict:
    return {"state": rng.standard_normal(8).astype(np.float32),
            "image_front": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)}


def _policy(**kwargs) -> LeRobotPolicy:
    """A one-slot policy over a `FakeLeRobot`, its arena kept as `_arena` (to snapshot and restore)."""
    policy = LeRobotPolicy(FakeLeRobot(**kwargs), seed=5)
    policy._arena = Arena([policy]).allocate()
    return policy


def _act(policy, observations) -> np.ndarray:
    out = []
    for obs in observations:
        policy.load_observation(obs)
        out.append(policy.act().numpy().copy())
    return np.concatenate(out)


def test_one_action_a_call_from_a_queue_refilled_from_the_history_as_select_action_does():
    policy = _policy(n_obs=2, n_action=3)
    policy.reset(11)
    observations = [_obs(np.random.default_rng(i)) for i in range(7)]
    got = _act(policy, observations)
    assert policy.spec.chunk_length == 1 and got.shape == (7, 4) and policy.calls == 3  # steps 0, 3, 6
    model = policy.model
    history = [observations[0], observations[0]]  # the first observation fills the history
    want = []
    for t, obs in enumerate(observations):
        history = [history[-1], obs] if t else history
        if t % 3 == 0:
            stacked = {k: torch.from_numpy(np.stack([h[k] for h in history]))[None] for k in ("state", "image_front")}
            chunk = model.chunk_rows(stacked, [row_generator(11, t // 3)])[0]
        want.append(chunk[t % 3].numpy())
    np.testing.assert_array_equal(got, np.stack(want))
    assert policy.buffers["rng"].tolist() == [11, 3] and int(policy.buffers["queue_left"]) == 2


def test_a_capsule_mid_queue_restores_the_history_the_queue_and_the_noise():
    policy = _policy(n_obs=3, n_action=4)
    policy.reset(2)
    rng = np.random.default_rng(0)
    observations = [_obs(rng) for _ in range(12)]
    _act(policy, observations[:6])  # 2 actions of the second chunk are still queued
    assert int(policy.buffers["queue_left"]) == 2
    capsule = snapshot(policy._arena)
    after = _act(policy, observations[6:])
    restore(policy._arena, capsule)
    np.testing.assert_array_equal(_act(policy, observations[6:]), after)
    fresh = _policy(n_obs=3, n_action=4)  # another instance (the same fingerprint)
    restore(fresh._arena, capsule)
    np.testing.assert_array_equal(_act(fresh, observations[6:]), after)
    restore(fresh._arena, capsule)
    fresh.reseed(99)  # a branch's new noise: the queued actions stay, the next chunk differs
    other = _act(fresh, observations[6:])
    np.testing.assert_array_equal(other[:2], after[:2])
    assert not np.array_equal(other[2:], after[2:])


def test_rows_serve_every_slot_in_one_call_and_each_slot_is_a_one_slot_capsule():
    template = _policy(n_obs=2, n_action=3)
    rows = template.batched(3)
    assert isinstance(rows, LeRobotPolicyRows) and rows.instances == 1 and rows.model is template.model
    slot = rows.slot(1)
    assert {s.name: s.shape for s in slot.buffer_specs()} == {
        s.name: s.shape for s in template.buffer_specs() if s.name != "chunk"}
    assert slot.fingerprint() == template.fingerprint()
    slot_arenas = [Arena([rows.slot(i)]).allocate() for i in range(3)]
    for i in range(3):
        rows.slot(i).reset(40 + i)
    rng = np.random.default_rng(3)
    template.model.rows_seen.clear()
    for _ in range(5):
        for i in range(3):
            rows.slot(i).load_observation(_obs(rng))
        rows.act_rows([0, 1, 2])
    assert rows.batch == 4 and template.model.rows_seen == [4, 4]  # every call over all rows (and one empty)
    capsule = snapshot(slot_arenas[1])  # slot 1, one action of its second chunk handed out
    # the same slot's capsule restores into a one-slot policy and plays on as slot 1 does (one action a call)
    one = _policy(n_obs=2, n_action=3)
    restore(one._arena, capsule)
    later = [_obs(np.random.default_rng(100 + t)) for t in range(4)]
    for obs in later:
        for i in range(3):
            rows.slot(i).load_observation(obs if i == 1 else _obs(rng))
        np.testing.assert_array_equal(rows.act_rows([0, 1, 2])[1].numpy(), _act(one, [obs]))
    # a restore into slot 2 writes row 2 and nothing of rows 0 and 1
    before = {k: v[[0, 1]].clone() for k, v in rows.buffers.items() if k not in ("active", "chunk")}
    restore(slot_arenas[2], capsule)
    assert all(torch.equal(rows.buffers[k][[0, 1]], v) for k, v in before.items())
    assert torch.equal(rows.buffers["queue"][2], rows.slots[2].buffers["queue"])


class Tail(FakeLeRobot):
    """A network whose last row of a batch rounds another way (as some GEMM and convolution tails do)."""

    def chunk_rows(self, history, generators):
        chunk = super().chunk_rows(history, generators)
        if chunk.shape[0] > 1:
            chunk[-1] += 1e-6
        return chunk


def test_a_network_that_computes_some_positions_another_way_is_called_row_by_row():
    rows = LeRobotPolicy(Tail(n_obs=1, n_action=2), seed=1).batched(3)
    assert rows.batch == 0 and rows.mode == "row by row"
    one = _policy(n_obs=1, n_action=2)
    one.model.__class__ = Tail
    for i in range(3):
        rows.slot(i).reset(9)
    one.reset(9)
    obs = _obs(np.random.default_rng(0))
    for i in range(3):
        rows.slot(i).load_observation(obs)
    rows.model.rows_seen.clear()
    got = rows.act_rows([0, 2]).numpy()
    assert rows.model.rows_seen == [1, 1]  # only the rows that need actions, one at a time
    np.testing.assert_array_equal(got[0], got[2])
    np.testing.assert_array_equal(got[2], _act(one, [obs]))  # as a host of one slot computes it


def _host(policy, **config) -> RolloutHost:
    env = TabletopEnv("pick_place", cameras=("front",), image_size=64, max_steps=20)
    return RolloutHost(env=env, policy=policy, config=HostConfig(n_exec=1, max_steps=20, **config))


def test_in_a_host_every_step_is_a_boundary_and_a_branch_mid_queue_replays_the_episode():
    policy = _policy(n_obs=2, n_action=4)
    host = _host(policy)
    keeper = BoundaryCapsules((6,))  # step 6: two actions of the second chunk still queued
    host.observers.append(keeper)
    episode = host.run_episode(3).episode
    assert episode.meta.length == 20 and policy.calls == 5
    again = host.branch(keeper.capsules[6], seed=3)
    np.testing.assert_array_equal(again.episode.steps["action"], episode.steps["action"][6:])
    other = host.branch(keeper.capsules[6], seed=3, noise_seed=7)
    np.testing.assert_array_equal(other.episode.steps["action"][:2], episode.steps["action"][6:8])
    assert not np.array_equal(other.episode.steps["action"][2:], episode.steps["action"][8:])
    host.close()


def test_a_slot_host_reports_one_policy_instance_and_a_fork_mid_queue_plays_on():
    template = _policy(n_obs=2, n_action=4)
    rows = template.batched(3)
    hosts = [_host(rows.slot(i)) for i in range(3)]
    slots = SlotHost(hosts, rows)
    keeper = BoundaryCapsules((5,))
    hosts[0].observers.append(keeper)
    results = slots.run_items([episode_job(s) for s in range(3)])  # seed s in slot s
    records = [r.value.extra[ROWS_REPORT] for r in results]
    assert {(r["slots"], r["policy_instances"], r["critic_instances"]) for r in records} == {(3, 1, 0)}
    report = type("Report", (), {"extra": results[0].value.extra, "actor_index": 0})
    assert instances_by_actor([report]) == {"0": {"policy": 1, "critic": 0, "slots": 3}}
    assert results[0].slot == 0
    episode = results[0].value.episode
    capsule = keeper.capsules[5]
    again = slots.hosts[2].branch(capsule, seed=0)  # slot 0's episode forked into slot 2, mid-queue
    np.testing.assert_array_equal(again.episode.steps["action"], episode.steps["action"][5:])
    slots.close()


def test_call_seeds_differ_by_seed_and_counter():
    seeds = {call_seed(s, c) for s in range(50) for c in range(50)}
    assert len(seeds) == 2500 and all(0 <= s < 2**64 for s in seeds)


def _lerobot_dir(tmp_path, **config) -> str:
    path = tmp_path / "pretrained_model"
    path.mkdir()
    base = {"type": "act", "n_obs_steps": 1, "n_action_steps": 5, "temporal_ensemble_coeff": None,
            "input_features": {"observation.state": {"type": "STATE", "shape": [8]},
                               "observation.images.front": {"type": "VISUAL", "shape": [3, 64, 64]}},
            "output_features": {"action": {"type": "ACTION", "shape": [4]}}}
    (path / "config.json").write_text(json.dumps({**base, **config}))
    (path / "model.safetensors").write_bytes(b"")
    return str(path)


def test_a_lerobot_directory_is_a_checkpoint_described_without_lerobot(tmp_path):
    path = _lerobot_dir(tmp_path)
    assert checkpoint_kind(path) == LEROBOT_KIND
    described = describe_source(path)
    assert (described.chunk_length, described.image_size, described.n_exec) == (1, 64, 1)
    assert not described.takes_conditioning and not described.takes_noise_scale
    assert resolve_acting(path) == (1, 1.0)  # one action per chunk, as select_action hands them out
    with pytest.raises(ValueError, match="exceeds the policy's chunk length"):
        check_spec(RunSpec(env="tabletop:pick_place", policy=path, host=HostConfig(n_exec=8)))
    with pytest.raises(ValueError, match="takes none"):
        check_spec(RunSpec(env="tabletop:pick_place", policy=path, advantage="positive"))
    with pytest.raises(FileNotFoundError, match="nor LeRobot's config.json"):
        checkpoint_kind(str(tmp_path))


@pytest.mark.parametrize(("config", "message"), [
    ({"type": "vqbet"}, "runs act, diffusion"),
    ({"temporal_ensemble_coeff": 0.01}, "temporal ensembling"),
    ({"input_features": {"observation.environment_state": {"type": "ENV", "shape": [3]}}}, "no env observation"),
    ({"input_features": {"observation.images.a": {"type": "VISUAL", "shape": [3, 64, 48]}}}, "square images"),
])
def test_lerobot_policies_this_adapter_cannot_run_are_refused_saying_why(tmp_path, config, message):
    with pytest.raises(ValueError, match=message):
        describe_source(_lerobot_dir(tmp_path, **config))


@pytest.mark.skipif(importlib.util.find_spec("lerobot") is not None, reason="LeRobot is installed here")
def test_without_lerobot_loading_one_says_in_one_line_how_to_install_it(tmp_path):
    from capsule_rollout.policies.conditioning import Conditioning

    with pytest.raises(ImportError) as info:
        load_source(_lerobot_dir(tmp_path), "policy", device="cpu", conditioning=Conditioning(), noise_scale=1.0)
    message = str(info.value)
    assert "\n" not in message and "LeRobot is not installed" in message and "make lerobot-venv" in message
