"""One policy across task families: training on a mixed store (paraphrases swapped in, evaluated per
family), eval_policy per family with held-out phrasings and coaching, sim_rollout on a mix of families
with replay, coached demonstrations (the expert follows the coaching, then lets the block be), and the coaching
judge on an actor that obeys and one that does not."""

import json
import types

import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from capsule_rollout.tabletop.coaching import COACHABLE, COACHED_MAX_STEPS, PadCoach, coached_expert, evaluate_coaching
from capsule_rollout.tabletop.phrasing import COACHING, coaching_text
from capsule_rollout.tabletop.scene import PADS
from capsule_rollout.tabletop.scripted_expert import ScriptedExpert
from capsule_rollout.tabletop.tabletop_env import TabletopEnv
from capsule_rollout.tabletop.tasks import FAMILY_NAMES, Goal, Subtask
from tests.policies.tiny import save_tiny_checkpoints


@pytest.fixture(scope="module")
def mixed_demos(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixed") / "d.zarr"
    for family in FAMILY_NAMES:
        assert main(["collect_demos", "--family", family, "--episodes", "2", "--out", str(path), "--no-progress"]) == 0
    return path


def test_training_on_every_family_with_paraphrases_and_evaluating_each(mixed_demos, tmp_path):
    out, summary = tmp_path / "policy", tmp_path / "p.json"
    assert main(["train_policy", "--data", str(mixed_demos), "--out", str(out), "--loop.batch_size", "4",
                 "--noise_samples", "1", "--loop.steps", "2", "--loop.eval_every", "2", "--eval.count", "1",
                 "--eval_family", "all", "--paraphrase", "0.5", "--no-progress", "--json", str(summary)]) == 0
    evals = json.loads(summary.read_text())["evals"]
    assert {f"success_rate_{f}" for f in FAMILY_NAMES} <= set(evals[-1])
    assert json.loads(summary.read_text())["episodes"] == 2 * len(FAMILY_NAMES)
    evaluation = tmp_path / "e.json"
    assert main(["eval_policy", "--model.policy", str(out), "--family", "all", "--seeds.count", "1",
                 "--phrasing", "heldout", "--coach", "--json", str(evaluation)]) == 0
    data = json.loads(evaluation.read_text())
    assert data["phrasing"] == "heldout" and set(data["families"]) == set(FAMILY_NAMES)
    for family, result in data["families"].items():
        assert result["policy"]["episodes"] == 1 and result["expert"]["success_rate"] == 1.0
        assert ("coaching" in result) == (family in COACHABLE)
    coached = data["families"]["pick_place"]["coaching"]
    # an untrained policy may never pick the block up: then the place subtask, and the coaching, never come
    assert coached["episodes"] == 1 and coached["coached"] <= 1
    assert coached["followed"] + coached["kept_plan"] + coached["neither"] == coached["coached"]
    assert main(["train_policy", "--data", str(mixed_demos), "--out", str(tmp_path / "x"),
                 "--paraphrase", "1.5"]) == 2  # a usage error, nothing trained


def test_coaching_is_refused_for_a_family_without_a_pad_goal(tmp_path):
    policy, _ = save_tiny_checkpoints(tmp_path)
    with pytest.raises(ValueError, match="no place-on-a-pad subtask"):
        evaluate_coaching(policy, family="stack", seeds=[1_000_000])
    assert set(COACHABLE) == {"pick_place", "sort"}


def test_coached_demonstrations_follow_the_coaching_and_keep_their_own_ids(tmp_path, capsys):
    path, summary = tmp_path / "coached.zarr", tmp_path / "c.json"
    train_texts = {coaching_text(p, "train", i) for p in PADS for i in range(len(COACHING["train"]))}
    for family in COACHABLE:
        assert main(["collect_demos", "--family", family, "--coach", "--episodes", "2", "--cameras", "--out", str(path),
                     "--no-progress", "--json", str(summary)]) == 0
        done = json.loads(summary.read_text())
        assert done["coached"] and done["plan_completed"] == 2 and done["successes"] == 0  # the env's goal is not met
    assert "followed the coaching 100.0%" in capsys.readouterr().out
    # the plain episodes of the same seeds are other episodes
    assert main(["collect_demos", "--episodes", "2", "--cameras", "--out", str(path), "--no-progress"]) == 0
    reader = ZarrEpisodeReader(path)
    metas = {m.episode_id: m for m in (reader.meta(i) for i in range(len(reader)))}
    assert set(metas) == {f"{f}-s{s:07d}" for f in ("pick_place", "pick_place-coached", "sort-coached") for s in (0, 1)}
    for episode_id, meta in metas.items():
        coached = [t for t in meta.subtask_texts if t.endswith("instead")]
        if "coached" in episode_id:  # the plan: what was done before the coaching, then the coaching said in training
            assert len(coached) == 1 and coached[0] == meta.subtask_texts[-1] and coached[0] in train_texts
            assert coached[0] != coaching_text(coached[0].split()[-3])  # never the evaluation's words
            assert meta.length == COACHED_MAX_STEPS and not meta.success
        else:
            assert not coached and meta.success
    for bad, why in ((["--family", "stack"], "no place-on-a-pad subtask"),
                     (["--env", "gymnasium:Pusher-v5"], "--coach applies to the tabletop's expert only")):
        assert main(["collect_demos", "--coach", *bad, "--episodes", "1", "--out", str(tmp_path / "x")]) == 2
        assert why in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("family", COACHABLE)
def test_the_coached_expert_places_on_the_coached_pad_and_lets_it_be(family):
    env = TabletopEnv(family, cameras=(), max_steps=COACHED_MAX_STEPS)
    try:
        for seed in (5000, 5001, 5002):
            expert, coach = ScriptedExpert(env, seed=seed), PadCoach("train")
            coach.bind(env, seed)
            act = coached_expert(env, expert, coach)
            env.reset(seed=seed)
            done_at = None
            for step in range(env.max_steps):
                env.step(act())
                world = env.world()
                if done_at is None and env.subtask_index >= len(env.subtasks):
                    done_at = step
                if done_at is not None:  # after placing: never picked up again, and the block stays on the pad
                    block, _, pad, _ = coach.coached
                    assert world.holding is None and Goal("pad", pad).satisfied(block, world), (seed, step)
            assert done_at is not None and done_at < env.max_steps - 10
            assert env.subtask_texts[-1] in {coaching_text(coach.coached[2], "train", i) for i in range(2)}
            assert not env.success(env.info())  # the env's own goal is the original pad
    finally:
        env.close()


@pytest.mark.parametrize("obeys", [True, False])
def test_the_judge_sees_whether_the_block_went_to_the_coached_pad(obeys):
    env = TabletopEnv("pick_place", cameras=())
    try:
        env.reset(seed=1_000_000)
        coach, expert = PadCoach(), ScriptedExpert(env, seed=0)
        coach.episode_start(types.SimpleNamespace(env=env), 1_000_000)
        events = []
        for step in range(env.max_steps):
            said = coach.poll(step)
            events += said
            if said and obeys:  # the actor takes the coaching as its subtask
                block, _, pad, _ = coach.coached
                env.subtasks[env.subtask_index] = Subtask(said[0].text, block, Goal("pad", pad))
            _, _, terminated, truncated, _ = env.step(expert.act())
            if terminated or truncated:
                break
        assert len(events) == 1 and events[0].text.endswith("pad instead")
        block, original, pad, step = coach.coached
        assert pad != original and step > 0  # coached once the place subtask began
        result = types.SimpleNamespace(extra={})
        coach.episode_end(types.SimpleNamespace(env=env), result)
        judged = result.extra["coaching"]
        assert (judged["followed"], judged["kept_plan"]) == ((True, False) if obeys else (False, True))
        assert judged["nearest_pad"] == (pad if obeys else original) and not judged["held_at_end"]
    finally:
        env.close()


@pytest.mark.ray
@pytest.mark.parametrize("actors, slots", [(0, 1), (2, 1), (2, 3)])
def test_sim_rollout_plays_a_mix_of_families_and_replays_each(actors, slots, tmp_path, request):
    """With slots, one slot host per actor plays every family (any slot any family, one policy and critic)."""
    if actors:
        request.getfixturevalue("ray_session")
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    out, summary = tmp_path / "run", tmp_path / "s.json"
    assert main(["sim_rollout", "--actors", str(actors), "--slots", str(slots), "--family", "all", "--seeds.count",
                 "1", "--repeats", "2",
                 "--model.policy", policy, "--model.critic", critic, "--act.n_exec", "2", "--out", str(out), "--no-progress",
                 "--no-video", "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert data["episodes"] == 2 * len(FAMILY_NAMES)
    assert {f: v["episodes"] for f, v in data["by_task"].items()} == {f: 2 for f in FAMILY_NAMES}
    assert data["reset_kinds"] == {"cold": len(FAMILY_NAMES), "restore": len(FAMILY_NAMES)}
    if slots > 1:
        assert all(n == {"policy": 1, "critic": 1, "slots": slots} for n in data["instances_by_actor"].values())
        assert data["rows"]["hosts"] <= actors and data["rows"]["calls"] > 0
    reader = ZarrEpisodeReader(out / "episodes.zarr")
    assert sorted(reader.meta(i).task for i in range(len(reader))) == sorted(FAMILY_NAMES * 2)
    for family in ("stack", "sort"):
        assert main(["replay", "--store", str(out / "episodes.zarr"), "--episode", f"{family}-s1000000-r1"]) == 0
