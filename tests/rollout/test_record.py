"""`record_rollouts` as a library call: the caller's process is left as it was found."""

from __future__ import annotations

import json
import os

import torch

from capsule_rollout.rollout.record import record_rollouts

ENV = "examples.own_env_and_policy:make_env"
POLICY = "examples.own_env_and_policy:make_policy"


def test_an_in_process_run_leaves_torch_threads_and_the_environment_as_found(tmp_path, monkeypatch):
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)
    threads = max(2, torch.get_num_threads())
    torch.set_num_threads(threads)
    try:
        run = record_rollouts(tmp_path / "run", env=ENV, policy=POLICY, seeds=[1], actors=0)  # renders its camera
        assert run.summary["episodes"] == 1 and run.store.exists()
        assert torch.get_num_threads() == threads  # the host asked for one thread, in its own build only
        assert "LP_NUM_THREADS" not in os.environ  # written for the renderer, taken back
    finally:
        torch.set_num_threads(threads)


LAB = "tests.rollout.lab_parts"


def test_record_rollouts_takes_every_option_the_command_line_has():
    """Parity: each of sim_rollout's options is a keyword of `record_rollouts` or a field of one of its option
    groups (by its leaf name), the groups' fields are each the command line's too, and seeds start where the
    command line's do."""
    import dataclasses
    import inspect

    from capsule_rollout.commands.configs import SimRolloutConfig
    from capsule_rollout.commands.option_parsing import flat_fields
    from capsule_rollout.learning.options import Seeds
    from capsule_rollout.rollout import FIRST_SEED
    from capsule_rollout.rollout.run_options import GROUPS

    console_only = {"video", "progress", "family", "first", "count", "out"}  # family: `env="tabletop:<family>"`
    options = {name.split(".")[-1] for name, _, _ in flat_fields(SimRolloutConfig())} - console_only
    params = set(inspect.signature(record_rollouts).parameters)
    grouped = {f.name for group in GROUPS for f in dataclasses.fields(group)}
    assert options <= params | grouped, sorted(options - params - grouped)
    assert grouped <= options, sorted(grouped - options)  # no option of the call the command line lacks
    assert len(params) <= 14  # a few groups, not one keyword per option
    assert FIRST_SEED == Seeds().first


def test_the_option_groups_take_a_dict_and_name_a_field_they_lack(tmp_path):
    run = record_rollouts(tmp_path / "run", env=ENV, policy=POLICY, seeds=[1], actors=0,
                          acting={"n_exec": 2}, episodes={"max_steps": 6})
    [report] = run.reports
    assert report.episode.meta.length == 6
    assert json.loads((run.out / "rollout.json").read_text())["host"]["n_exec"] == 2
    import pytest

    with pytest.raises(TypeError, match="placement: Placement has no field 'slot'; its fields: .*slots"):
        record_rollouts(tmp_path / "bad", env=ENV, policy=POLICY, seeds=[1], actors=0, placement={"slot": 2})
    assert not (tmp_path / "bad").exists()  # refused before anything was made


def test_factories_take_keyword_arguments_from_python_and_the_command_line(tmp_path):
    from capsule_rollout.cli.run import main
    from capsule_rollout.rollout import with_kwargs
    from capsule_rollout.stores import open_episode_reader

    env = with_kwargs(f"{LAB}:sized_env", goal_range=0.1, steps=12)
    run = record_rollouts(tmp_path / "py", env=env, policy=with_kwargs(f"{LAB}:GainPolicy", gain=2.0), seeds=2,
                          actors=0, recording={"cameras": ()})
    assert run.summary["episodes"] == 2
    assert max(open_episode_reader(run.store).meta(i).length for i in range(2)) <= 12  # steps=12 reached the env
    assert json.loads((run.out / "rollout.json").read_text())["env"] == env == (
        f'{LAB}:sized_env={{"goal_range":0.1,"steps":12}}')
    assert main(["sim_rollout", "--env", f'{LAB}:sized_env={{"steps": 5}}', "--policy",
                 f'{LAB}:GainPolicy={{"gain": 1.5}}', "--actors", "0", "--seeds.count", "1", "--cameras",
                 "--out", str(tmp_path / "cli"), "--no-progress", "--no-video"]) == 0
    assert open_episode_reader(tmp_path / "cli/episodes.zarr").meta(0).length == 5
    code = main(["sim_rollout", "--env", f"{LAB}:sized_env={{steps: 5}}", "--policy", f"{LAB}:GainPolicy",
                 "--out", str(tmp_path / "bad")])
    assert code == 2  # not JSON: one line saying what to write


def test_a_gymnasium_id_the_users_package_registers_is_named_directly(tmp_path):
    run = record_rollouts(tmp_path / "run", env=f"gymnasium:{LAB}:LabSizedPuck-v0", policy=f"{LAB}:GainPolicy",
                          seeds=[1], actors=0, recording={"cameras": ("top",), "image_size": 16})
    assert run.summary["episodes"] == 1 and run.episode_ids == [f"gymnasium_{LAB}_LabSizedPuck-v0-s0000001"]


def test_episode_ids_and_capsule_files_are_file_system_safe_and_old_runs_still_resume_and_replay(tmp_path,
                                                                                                monkeypatch):
    from capsule_rollout.rollout import host_config, replay_episode
    from capsule_rollout.stores import open_episode_reader

    old = tmp_path / "old"
    with monkeypatch.context() as m:  # a run recorded before: the task as it is in ids and capsule directories
        m.setattr(host_config, "file_safe", lambda text: text)
        m.setattr("capsule_rollout.rollout.run_capsules.file_safe", lambda text: text)
        record_rollouts(old, env=ENV, policy=POLICY, seeds=[1], actors=0)
    assert open_episode_reader(old / "episodes.zarr").episode_ids == [f"{ENV}-s0000001"]
    assert (old / "capsules" / ENV / "s0000001.capsule").exists()
    assert replay_episode(old, f"{ENV}-s0000001").exact  # an old run's episode replays from its old capsule file
    resumed = record_rollouts(old, env=ENV, policy=POLICY, seeds=[1, 2], actors=0)  # walks past seed 1
    assert resumed.episode_ids == [f"{ENV}-s0000002"]  # named as the run names its episodes
    new = record_rollouts(tmp_path / "new", env=ENV, policy=POLICY, seeds=[1], actors=0)
    assert new.episode_ids == ["examples.own_env_and_policy_make_env-s0000001"]
    files = [p.relative_to(new.out) for p in new.out.rglob("*")]
    assert files and not [p for p in files if ":" in str(p)]
    assert replay_episode(new.out, new.episode_ids[0]).exact


def test_the_public_names_resolve_and_the_examples_import_nothing_else():
    """A user imports from the packages' public faces (`__all__`), never a deep module path."""
    import ast
    import importlib
    from pathlib import Path

    for package in ("rollout", "envs", "policies", "critics", "stores", "capsules"):
        module = importlib.import_module(f"capsule_rollout.{package}")
        assert module.__all__ and all(getattr(module, name) is not None for name in module.__all__), package
    for example in (Path(__file__).resolve().parents[2] / "examples").glob("*.py"):
        for node in ast.walk(ast.parse(example.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("capsule_rollout"):
                assert node.module.count(".") <= 1, f"{example.name} imports {node.module}: use the public face"
            # nor reaches into what an object holds: a host's slots, its observers, a private name
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("hosts", "observers", "policy_rows", "critic_rows") and not (
                    node.attr.startswith("_") and not node.attr.startswith("__")), (
                    f"{example.name}:{node.lineno} reaches into .{node.attr}: use the public methods")
