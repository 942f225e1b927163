"""The same episode at any slot count: the shipped policy and critic record identical episodes with `--slots 4` and
`--slots 1` (noise on), a 4-slot run's episode replays exactly on one slot, and `--check_slots` says so; a user's
policy that rounds by batch size is named by the check, with the step, key and element that differ."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.rollout.slots.check import check_slots
from capsule_rollout.stores.sharded_reader import open_episode_reader
from tests.rollout.test_infer_rows import BatchPush
from tests.rollout.test_slots import same_episode

ENV = "examples.own_env_and_policy:make_env"


class RoundsByBatch(BatchPush):
    """Each row as `BatchPush` computes it, plus a batch-size-dependent last bit (as a kernel chosen by the batch
    shape can round)."""

    def infer_batch(self, obs, *, noise):
        actions = super().infer_batch(obs, noise=noise)["actions"]
        return {"actions": actions + np.float32(1e-6) * (len(actions) - 1)}


def rounds_by_batch():
    return RoundsByBatch()


def _run(tmp_path, name: str, slots: int, *extra: str) -> dict:
    summary = tmp_path / f"{name}.json"
    assert main(["sim_rollout", "--actors", "0", "--slots", str(slots), "--seeds.count", "6", "--max_steps", "24",
                 "--out", str(tmp_path / name), "--no-progress", "--video", "false", "--json", str(summary),
                 *extra]) == 0
    return json.loads(summary.read_text())


def test_the_shipped_policy_and_critic_record_the_same_episodes_with_4_slots_and_1(tmp_path, capsys):
    four = _run(tmp_path, "four", 4, "--check_slots", "--act.noise_scale", "1")
    assert four["slot_check"]["same"] is True and four["noise_scale"] > 0
    assert "the episodes do not depend on --slots" in capsys.readouterr().out
    _run(tmp_path, "one", 1, "--act.noise_scale", "1")
    a, b = (open_episode_reader(tmp_path / n / "episodes.zarr") for n in ("one", "four"))
    assert sorted(a.episode_ids) == sorted(b.episode_ids) and len(a.episode_ids) == 6
    for eid in a.episode_ids:
        x, y = a.episode(a.episode_ids.index(eid)), b.episode(b.episode_ids.index(eid))
        assert np.isfinite(np.asarray(x.steps["value"], dtype=float)).any()
        same_episode(x, y, same_capsule=False)
    eid = b.episode_ids[3]
    assert main(["replay", "--store", str(tmp_path / "four" / "episodes.zarr"), "--episode", eid, "--slots", "1",
                 "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["exact"]
    assert main(["replay", "--store", str(tmp_path / "four"), "--episode", eid, "--slots", "0"]) == 2


def test_a_policy_that_rounds_by_batch_size_is_named_by_the_check(tmp_path, capsys):
    spec = RunSpec(env=ENV, policy=f"{__name__}:rounds_by_batch", host=HostConfig(n_exec=3, max_steps=9))
    found = check_slots(spec, 3, seed=5)
    assert not found.same and found.slot == 2 and found.difference.startswith("step 0 action[")
    assert "depend on --slots" in found.line() and "--slots 3" in found.line()
    assert check_slots(RunSpec(env=ENV, policy="tests.rollout.test_infer_rows:batch_push",
                                host=HostConfig(n_exec=3, max_steps=9)), 3, seed=5).same
    summary = tmp_path / "s.json"
    assert main(["sim_rollout", "--env", ENV, "--policy", f"{__name__}:rounds_by_batch", "--actors", "0", "--slots",
                 "2", "--episodes", "2", "--n_exec", "3", "--max_steps", "9", "--check_slots", "--out",
                 str(tmp_path / "run"), "--no-progress", "--video", "false", "--json", str(summary)]) == 0
    check = json.loads(summary.read_text())["slot_check"]
    assert check["same"] is False and "action[" in check["difference"]
    assert "rounds by batch size" in capsys.readouterr().out
    assert main(["sim_rollout", "--env", ENV, "--policy", f"{__name__}:rounds_by_batch", "--actors", "0",
                 "--check_slots", "--out", str(tmp_path / "x")]) == 2


def test_batch_invariance_is_part_of_what_a_run_plays_and_older_runs_played_without_it(tmp_path):
    from capsule_rollout.rollout.host_factory import build_host, check_same_run, write_spec

    spec = RunSpec(env="tabletop:pick_place", policy="capsule_rollout/checkpoints/policy",
                    host=HostConfig(n_exec=4, max_steps=8))
    data = spec.to_json()
    assert data["batch_invariant"] is True
    assert data["sums"] == "exact"
    del data["sums"]  # written before exact sums: the padded rows it played with
    assert RunSpec.from_json(data).sums == "padded"
    del data["batch_invariant"]  # a rollout.json written before the setting existed
    assert RunSpec.from_json(data).batch_invariant is False
    for invariant in (True, False):
        host = build_host(dataclasses.replace(spec, batch_invariant=invariant))
        try:
            assert getattr(host.policy.model, "_sums", None) == ("exact" if invariant else None)
        finally:
            host.close()
    write_spec(tmp_path, spec)
    with pytest.raises(ValueError, match="batch_invariant"):
        check_same_run(tmp_path, dataclasses.replace(spec, batch_invariant=False))
