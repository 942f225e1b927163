"""sim_rollout on local Ray (2 actors), a killed actor, and bit-exact replay."""

import functools
import json
import os

import numpy as np
import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.stores.checksums import checksum
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from tests.policies.tiny import save_tiny_checkpoints
from tests.rollout import faults

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))


def test_rollout_records_every_episode_once_even_when_an_actor_dies(checkpoints, tmp_path):
    policy, critic = checkpoints
    out, summary = tmp_path / "run", tmp_path / "s.json"
    marker = tmp_path / "crashed"
    victim = "pick_place-s1000002"
    args = ["sim_rollout", "--actors", "2", "--episodes", "5", "--out", str(out), "--policy", policy,
            "--critic", critic, "--n_exec", "2", "--no-progress", "--json", str(summary),
            *faults.cli_option(victim, 3, marker)]
    assert main(args) == 0
    data = json.loads(summary.read_text())
    assert marker.exists()  # the actor really died mid-episode
    assert data["actor_failures"] == 1 and data["resubmitted"] == 1
    assert data["episodes"] == 5 and set(data["stop_reasons"]) <= {"timeout", "success"}
    assert {"successes", "success_rate", "reset_ms_median", "steps_per_s", "store"} <= set(data)
    startup = data["startup"]  # Ray started beside the preflight; where the start-up went
    assert set(startup) == {"before_command_s", "preflight_s", "ray_s", "to_ray_up_s", "to_actors_ready_s",
                            "to_first_episode_s"}
    assert 0 < startup["preflight_s"] < startup["to_actors_ready_s"] < startup["to_first_episode_s"]
    assert startup["ray_s"] > 0 and data["steps_per_s_started"] > data["steps_per_s"] > 0
    parts = data["time_by_part"]  # where the actors' time went, each part apart, and what their clocks left over
    assert {"env_step", "models", "host_loop", "record_step", "cold_reset", "capsule", "capsule_save",
            "driver_record", "actors_other"} <= set(parts["seconds"]) and parts["steps"] > 0
    assert all(v > 0 for k, v in parts["seconds"].items() if k != "actors_other")
    reader = ZarrEpisodeReader(data["store"])
    ids = reader.episode_ids
    assert sorted(ids) == [f"pick_place-s{1000000 + i:07d}" for i in range(5)]  # each exactly once
    assert (out / "rollout.png").stat().st_size > 0 and (out / "episode.gif").stat().st_size > 0
    # replay is bit-exact, also for the episode whose first attempt was killed
    for episode in (ids[0], victim):
        assert main(["replay", "--store", data["store"], "--episode", episode, "--json", str(tmp_path / "r.json")]) == 0
        assert json.loads((tmp_path / "r.json").read_text())["exact"]
    # running again skips what is recorded
    assert main(args[:-2] + ["--json", str(summary)]) == 0
    assert json.loads(summary.read_text())["episodes"] == 0 and len(ZarrEpisodeReader(data["store"])) == 5


@pytest.mark.parametrize("per_call", [1, 2])
def test_sharded_rollout_keeps_each_episode_once_when_an_actor_dies_between_its_shard_and_the_manifest(
        checkpoints, tmp_path, per_call, monkeypatch):
    """per_call 2: the victim (the third seed) shares the second actor's call with the fourth; the actor dies once
    both are in its shard, before the driver hears of either, so both are orphans and both are re-run."""
    policy, critic = checkpoints
    out, summary, marker = tmp_path / "run", tmp_path / "s.json", tmp_path / "crashed"
    victim = "pick_place-s1000002"
    args = ["sim_rollout", "--actors", "2", "--episodes", "5", "--out", f"file://{out}", "--policy", policy,
            "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false", "--shards", "true",
            "--episodes_per_call", str(per_call), "--json", str(summary)]
    from capsule_rollout.cli import sim_rollout
    from capsule_rollout.rollout.ray_rollout import run_rollouts

    victim_actor = type("VictimActor", (faults.ExitAfterRecord,), {"victim": victim, "marker": str(marker)})
    monkeypatch.setattr(sim_rollout, "run_rollouts", functools.partial(run_rollouts, actor_cls=victim_actor))
    assert main(args) == 0
    data = json.loads(summary.read_text())
    assert marker.read_text() == "exit_after_record\n"  # the actor died with the episode in its shard
    assert (data["actor_failures"], data["resubmitted"], data["orphans"], data["episodes"]) == (1, per_call, per_call, 5)
    store = out / "episodes.zarr"
    ids = [f"pick_place-s{1000000 + i:07d}" for i in range(5)]
    assert sorted(open_episode_reader(store).episode_ids) == ids  # each exactly once
    copies = [i for shard in (store / "shards").iterdir() for i in ZarrEpisodeReader(shard).episode_ids]
    orphaned = ids[2:2 + per_call]  # they stay in the dead actor's shard, unread
    assert sorted(copies) == sorted([*ids, *orphaned])
    assert main(["replay", "--store", str(store), "--episode", victim]) == 0
    assert main(args) == 0  # the driver again: the manifest holds every episode
    assert json.loads(summary.read_text())["episodes"] == 0 and len(open_episode_reader(store)) == 5
    single = tmp_path / "single.zarr"
    assert main(["consolidate", "--store", f"file://{store}", "--out", str(single), "--no-progress"]) == 0
    sharded, consolidated = open_episode_reader(store), ZarrEpisodeReader(single)
    assert consolidated.episode_ids == sharded.episode_ids and np.array_equal(consolidated.ends, sharded.ends)
    for i in range(5):
        a, b = sharded.episode(i), consolidated.episode(i)
        assert a.meta == b.meta and all(np.array_equal(a.steps[k], b.steps[k], equal_nan=True) for k in a.steps)


def test_checkpoints_that_do_not_fit_are_refused_before_ray_starts(checkpoints, tmp_path, capsys):
    policy, critic = checkpoints
    assert main(["sim_rollout", "--out", str(tmp_path), "--policy", policy, "--critic", critic]) == 2
    assert "n_exec 8 exceeds the policy's chunk length (4)" in capsys.readouterr().err
    assert main(["sim_rollout", "--out", str(tmp_path), "--policy", policy, "--critic", str(tmp_path / "none")]) == 2
    assert "critic checkpoint" in capsys.readouterr().err


def test_replay_detects_a_changed_recording_and_bad_arguments(checkpoints, tmp_path, capsys):
    policy, critic = checkpoints
    out = tmp_path / "run"
    assert main(["sim_rollout", "--actors", "1", "--episodes", "1", "--out", str(out), "--policy", policy,
                 "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false"]) == 0
    store = out / "episodes.zarr"
    import zarr

    group = zarr.open_group(str(store), mode="r+", zarr_format=2)
    actions = group["data/action"]
    tampered = np.asarray(actions[:]).copy()
    tampered[0, 0] += 0.5
    actions[:] = tampered
    sums = group["meta/checksums"]  # a consistent edit (its checksum too): the replay, not the store, tells
    sums[0, sums.attrs["columns"].index("action")] = checksum(tampered)
    assert main(["replay", "--store", str(store), "--episode", "pick_place-s1000000"]) == 1
    capsys.readouterr()
    assert main(["replay", "--store", str(store), "--episode", "nope"]) == 2  # one line naming what the store has
    assert "episode 'nope' is not in" in capsys.readouterr().err


class _PlannerActor:
    """A planner in its own Ray worker process, writing into a shared subtask channel."""

    def __init__(self, channel):
        self.channel = channel  # unpickled: attached to the same shared-memory block

    def plan(self, texts):
        versions = [self.channel.publish(t, i) for i, t in enumerate(texts)]
        return versions[-1], os.getpid()


def test_a_planner_in_its_own_ray_actor_hands_off_through_shared_memory(ray_session):
    from capsule_rollout.rollout.handoff import SubtaskChannel

    with SubtaskChannel.create_shared() as channel:
        planner = ray_session.remote(_PlannerActor).options(num_cpus=0).remote(channel)
        version, pid = ray_session.get(planner.plan.remote(["pick up the red block", "place it on the blue pad"]))
        assert pid != os.getpid()  # really another process
        sub = channel.read()  # nothing was sent back but the version: the text is in the shared block
        assert (sub.version, sub.index, sub.text) == (version, 1, "place it on the blue pad")
        ray_session.kill(planner)


def test_attempts_retry_a_failed_episode_by_restoring_its_initial_capsule(checkpoints, tmp_path):
    from capsule_rollout.rollout.host_factory import RunSpec, build_host
    from capsule_rollout.rollout.rollout_host import HostConfig

    policy, critic = checkpoints  # random weights: every episode times out, so every attempt runs
    out, summary = tmp_path / "run", tmp_path / "s.json"
    assert main(["sim_rollout", "--actors", "1", "--episodes", "2", "--attempts", "3", "--out", str(out),
                 "--policy", policy, "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false",
                 "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert data["episodes"] == 6 and data["reset_kinds"] == {"cold": 2, "restore": 4}
    reader = ZarrEpisodeReader(data["store"])
    metas = {reader.meta(i).episode_id: reader.meta(i) for i in range(len(reader))}
    assert sorted(metas) == sorted(f"pick_place-s{1000000 + s:07d}{a}" for s in (0, 1) for a in ("", "-a1", "-a2"))
    first, retry = metas["pick_place-s1000001"], metas["pick_place-s1000001-a2"]
    assert (retry.attempt, retry.seed) == (2, first.seed) and retry.initial_capsule_id == first.initial_capsule_id
    episodes = {reader.meta(i).episode_id: reader.episode(i) for i in range(len(reader))}
    assert not np.array_equal(episodes["pick_place-s1000001"].steps["action"][:4],
                              episodes["pick_place-s1000001-a2"].steps["action"][:4])  # noise of its own
    # the restored attempt is bit-exact against a cold reset of the same seed and attempt on a fresh host
    host = build_host(RunSpec(env="tabletop:pick_place", policy=policy, critic=critic, host=HostConfig(n_exec=2)))
    cold = host.run_episode(1000001, attempt=2)
    host.close()
    assert cold.reset_kind == "cold"
    for key in ("action", "value", "state", "image_front"):
        assert np.array_equal(cold.episode.steps[key], episodes["pick_place-s1000001-a2"].steps[key], equal_nan=True)
    # without policy noise a retry is the failed episode again: refused, with what to pass
    assert main(["sim_rollout", "--actors", "0", "--episodes", "1", "--attempts", "2", "--out", str(tmp_path / "z"),
                 "--policy", policy, "--critic", critic, "--n_exec", "2", "--act.noise_scale", "0"]) == 2


def test_repeats_reset_by_restore_and_a_hung_actor_is_killed_and_its_episode_rerun(checkpoints, tmp_path):
    policy, critic = checkpoints
    out, summary = tmp_path / "run", tmp_path / "s.json"
    marker = tmp_path / "hung"
    victim = "pick_place-s1000001-r1"
    assert main(["sim_rollout", "--actors", "2", "--episodes", "3", "--repeats", "2", "--out", str(out),
                 "--policy", policy, "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false",
                 "--episode_timeout_s", "20", *faults.cli_option(victim, 3, marker, "hang"),
                 "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert marker.read_text() == "hang\n"  # the actor really hung mid-episode
    assert data["timeouts"] == 1 and data["resubmitted"] == 1 and data["actor_failures"] == 1
    reader = ZarrEpisodeReader(data["store"])
    assert sorted(reader.episode_ids) == sorted(f"pick_place-s{1000000 + s:07d}{r}" for s in range(3)
                                                for r in ("", "-r1"))  # every episode exactly once
    kinds = data["reset_kinds"]
    assert kinds.get("cold", 0) + kinds.get("restore", 0) == 6 and kinds.get("restore", 0) >= 3
    assert {reader.meta(i).repeat for i in range(len(reader))} == {0, 1}
    assert main(["replay", "--store", data["store"], "--episode", victim]) == 0


def test_a_capsule_budget_drops_capsules_and_they_come_back_from_disk(checkpoints, tmp_path):
    from capsule_rollout.rollout.host_factory import RunSpec
    from capsule_rollout.rollout.rollout_actor import RolloutActor, WorkItem
    from capsule_rollout.rollout.rollout_host import HostConfig, capsule_key

    policy, critic = checkpoints
    spec = RunSpec(env="tabletop:pick_place", policy=policy, critic=critic,
                    host=HostConfig(n_exec=2, max_steps=3, pin_seeds=(5,)), capsule_dir=str(tmp_path / "capsules"),
                    capsule_budget_mb=0.003)  # one 2.4 KB capsule
    actor = RolloutActor(spec)
    try:
        kinds = [actor.run(WorkItem(f"e{s}-{r}", s, repeat=r)).reset_kind for r in (0, 1) for s in (5, 6, 7)]
        store = actor.host.store
        assert kinds == ["cold"] * 3 + ["restore"] * 3
        assert store.is_pinned(capsule_key("pick_place", 5)) and capsule_key("pick_place", 6) not in store
        assert (tmp_path / "capsules" / "pick_place" / "s0000006.capsule").exists()
    finally:
        actor.close()


def test_an_actor_restores_only_the_seed_capsules_signed_with_the_runs_key(checkpoints, tmp_path):
    """A capsule in `capsule_dir` signed with another key (or none) is not restored: the reset is cold."""
    from capsule_rollout.capsules import load_capsule, save_capsule
    from capsule_rollout.rollout.host_factory import RunSpec
    from capsule_rollout.rollout.rollout_actor import RolloutActor, WorkItem
    from capsule_rollout.rollout.rollout_host import HostConfig

    policy, critic = checkpoints
    spec = RunSpec(env="tabletop:pick_place", policy=policy, critic=critic,
                    host=HostConfig(n_exec=2, max_steps=3), capsule_dir=str(tmp_path / "capsules"))
    run_key = b"the-driver-s-key-0123456789abcdef"
    first = RolloutActor(spec, capsule_key=run_key)
    try:
        assert first.run(WorkItem("a", 5)).reset_kind == "cold"
    finally:
        first.close()
    path = tmp_path / "capsules" / "pick_place" / "s0000005.capsule"
    capsule = load_capsule(path, key=run_key)  # written signed with the key the actor was given
    kinds = []
    for signed_with in (run_key, None, b"another-key-0123456789abcdef"):
        save_capsule(capsule, path, key=signed_with)
        actor = RolloutActor(spec, capsule_key=run_key)  # a fresh actor: its own store is empty
        try:
            kinds.append(actor.run(WorkItem("b", 5)).reset_kind)
        finally:
            actor.close()
    assert kinds == ["restore", "cold", "cold"]


def test_observers_on_the_command_line_are_checked_before_anything_runs(checkpoints, tmp_path, capsys):
    policy, critic = checkpoints
    base = ["sim_rollout", "--out", str(tmp_path / "run"), "--policy", policy, "--critic", critic, "--actors", "0"]
    assert main([*base, "--observers", "tests.rollout.faults:step_fault={not json"]) == 2
    assert "the kwargs after '=' must be a JSON object" in capsys.readouterr().err
    assert main([*base, "--observers", "tests.rollout.faults:no_such_factory"]) == 2
    assert "has no attribute 'no_such_factory'" in capsys.readouterr().err


def test_a_run_spec_written_by_an_earlier_version_still_reads(tmp_path):
    from capsule_rollout.rollout.host_factory import RunSpec, read_spec, write_spec

    write_spec(tmp_path, RunSpec(observers=(("tests.rollout.faults:step_fault", "{}"),)))
    data = json.loads((tmp_path / "rollout.json").read_text())
    (tmp_path / "rollout.json").write_text(json.dumps({**data, "crash": []}))  # the old test hook's field
    assert read_spec(tmp_path).observers == (("tests.rollout.faults:step_fault", "{}"),)
    # before the tabletop was an example package, a spec named a tabletop family ("all": every one), not an env
    for family, env in (("stack", "tabletop:stack"), ("all", "tabletop:*")):
        (tmp_path / "rollout.json").write_text(json.dumps({**data, "env": "", "family": family}))
        assert read_spec(tmp_path).env == env


def test_replay_with_bad_inputs_is_one_line(tmp_path, capsys):
    assert main(["replay", "--store", str(tmp_path / "none.zarr"), "--episode", "x"]) == 2
    err = capsys.readouterr().err
    assert "is not an episode store" in err and "Traceback" not in err
    assert main(["replay", "--store", str(tmp_path / "none.zarr")]) == 2
    assert "--episode is required" in capsys.readouterr().err


def test_replay_reads_only_capsules_signed_with_the_users_key_unless_trusted(checkpoints, tmp_path, capsys,
                                                                              monkeypatch):
    from capsule_rollout.capsules import load_capsule, save_capsule

    policy, critic = checkpoints
    out = tmp_path / "run"
    assert main(["sim_rollout", "--actors", "1", "--episodes", "1", "--out", str(out), "--policy", policy,
                 "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false"]) == 0
    store, path = out / "episodes.zarr", out / "capsules" / "pick_place" / "s1000000.capsule"
    capsule = load_capsule(path, key=os.environ["CAPSULE_ROLLOUT_KEY"])  # the actors signed it with the user's key
    replay = ["replay", "--store", str(store), "--episode", "pick_place-s1000000"]
    for signed_with in (None, "someone-else-s-key-0123456789"):  # a capsule from elsewhere
        save_capsule(capsule, path, key=signed_with)
        capsys.readouterr()
        assert main(replay) == 2
        err = capsys.readouterr().err
        assert "replay it with --trust" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert main([*replay, "--trust"]) == 0  # the user vouches for it: played, bit-identical
    monkeypatch.setenv("CAPSULE_ROLLOUT_KEY", "short")
    assert main(replay) == 2
    assert "needs 16 or more" in capsys.readouterr().err


def test_replay_builds_from_the_signed_spec_and_takes_a_capsule_only_for_its_seed(checkpoints, tmp_path, capsys):
    """A run directory edited beside validly signed capsules: `rollout.json` naming another factory is refused
    (it made replay call any importable function); two signed capsules swapped on disk are refused naming both
    seeds (the actor restored seed 2's state for seed 1); a run from elsewhere trusted as data calls no factory its
    files name unless the user names it, and as code (--trust-code) it does."""
    from capsule_rollout.capsules import load_capsule, save_capsule

    policy, critic = checkpoints
    out = tmp_path / "run"
    assert main(["sim_rollout", "--actors", "1", "--episodes", "2", "--out", str(out), "--policy", policy,
                 "--critic", critic, "--n_exec", "2", "--no-progress", "--video", "false"]) == 0
    store, caps = out / "episodes.zarr", out / "capsules" / "pick_place"
    replay = ["replay", "--store", str(store), "--episode", "pick_place-s1000000"]
    spec_file = out / "rollout.json"
    honest = spec_file.read_text()
    edited = json.loads(honest)
    edited["observers"] = [["os:system", "{}"]]
    spec_file.write_text(json.dumps(edited))
    capsys.readouterr()
    assert main(replay) == 2
    err = capsys.readouterr().err
    assert "rollout.json names other code than the spec signed" in err and "observers" in err, err
    spec_file.write_text(honest)
    first, second = caps / "s1000000.capsule", caps / "s1000001.capsule"
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    assert main(replay) == 2
    err = capsys.readouterr().err
    assert "holds the initial capsule of 'pick_place/s1000001', not of 'pick_place/s1000000'" in err, err
    first.write_bytes(a)
    second.write_bytes(b)
    assert main(replay) == 0
    # a run from elsewhere whose env is a factory's import path: as data, replay imports nothing it names
    key = os.environ["CAPSULE_ROLLOUT_KEY"]
    capsule = load_capsule(first, key=key)
    signed = json.loads(capsule.annotations["host_spec"])
    signed["env"] = "tests.envs.broken_envs:make_counter"
    save_capsule(capsule, first, key="someone-else-s-key-0123456789",
                 annotations={"host_spec": json.dumps(signed)})
    edited = json.loads(honest)
    edited["env"] = signed["env"]
    spec_file.write_text(json.dumps(edited))
    assert main([*replay, "--trust"]) == 2
    err = capsys.readouterr().err
    assert "names code to call (env 'tests.envs.broken_envs:make_counter')" in err and len(err.splitlines()) == 1
    assert main([*replay, "--trust", "--trust-code"]) == 2
    assert "two levels" in capsys.readouterr().err
