import numpy as np
import pytest

from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.episode import Episode, EpisodeBuilder, EpisodeError, validate_episode
from tests.rollout.fakes import fake_episode


def test_builder_produces_schema_dtypes_and_done_at_the_end():
    ep = fake_episode(3, length=5, cameras=("front", "top"))
    assert ep.length == 5 and ep.image_keys == ["image_front", "image_top"]
    for key, rule in S.STEP_FIELDS.items():
        if rule.optional:  # recorded only where the source gives it (the privileged state: a sim's)
            assert key not in ep.steps
            continue
        assert ep.steps[key].dtype == rule.dtype and ep.steps[key].shape[0] == 5
    assert ep.steps[S.DONE].tolist() == [False] * 4 + [True]
    assert np.isnan(ep.steps[S.POLICY_ACTION][0]).all() and not np.isnan(ep.steps[S.POLICY_ACTION][1]).any()


def _add(builder, **overrides):
    args = dict(images={"front": np.zeros((4, 4, 3), np.uint8)}, state=np.zeros(3), action=np.zeros(2), reward=-1.0)
    args.update(overrides)
    builder.add(**args)


def test_a_privileged_state_is_recorded_on_every_step_or_none():
    b = EpisodeBuilder()
    _add(b, privileged=np.arange(5, dtype=np.float32))
    with pytest.raises(EpisodeError, match="privileged at step 1"):
        _add(b)  # an episode records it on every step or on none
    with pytest.raises(EpisodeError, match="privileged at step 1"):
        _add(b, privileged=np.zeros(4))
    with pytest.raises(EpisodeError, match="privileged at step 1 is not finite"):
        _add(b, privileged=np.full(5, np.nan))
    _add(b, privileged=np.ones(5))
    ep = b.finish(episode_id="e", seed=0, task="t", instruction="i", success=False, stop_reason="timeout")
    assert ep.steps[S.PRIVILEGED].dtype == np.float32 and ep.steps[S.PRIVILEGED].tolist()[1] == [1.0] * 5
    b = EpisodeBuilder()
    _add(b)
    with pytest.raises(EpisodeError, match="privileged at step 1: \\(5,\\), earlier steps had None"):
        _add(b, privileged=np.ones(5))


def test_bad_steps_are_refused_at_once_and_earlier_steps_kept():
    b = EpisodeBuilder()
    _add(b)
    with pytest.raises(EpisodeError, match="state at step 1 is not finite"):
        _add(b, state=np.array([0.0, np.nan, 0.0]))
    with pytest.raises(EpisodeError, match="uint8 expected"):
        _add(b, images={"front": np.zeros((4, 4, 3), np.float32)})
    with pytest.raises(EpisodeError, match="action at step 1: shape"):
        _add(b, action=np.zeros(3))
    with pytest.raises(EpisodeError, match="fields"):
        _add(b, images={})
    _add(b, value=float("nan"), policy_action=np.full(2, np.nan))  # NaN allowed there
    assert len(b) == 2


@pytest.mark.parametrize(
    "meta_change, fragment",
    [
        (dict(stop_reason="bored"), "stop_reason 'bored'"),
        (dict(success=True, stop_reason="timeout"), "success=True needs"),
        (dict(instruction="x" * 300), "at most 256"),
        (dict(episode_id=""), "episode_id is empty"),
    ],
)
def test_bad_metadata_is_refused(meta_change, fragment):
    b = EpisodeBuilder()
    _add(b)
    args = dict(episode_id="e", seed=0, task="t", instruction="i", success=False, stop_reason="timeout")
    args.update(meta_change)
    with pytest.raises(EpisodeError, match=fragment):
        b.finish(**args)


def test_validate_lists_every_problem():
    ep = fake_episode(0, length=4)
    steps = dict(ep.steps)
    steps[S.STATE] = steps[S.STATE][:3]
    steps[S.REWARD] = np.array([0, np.inf, 0, 0], np.float32)
    del steps[S.TIMESTAMP]
    steps["velocity"] = np.zeros((4, 2))
    with pytest.raises(EpisodeError) as err:
        validate_episode(Episode(steps, ep.meta))
    text = str(err.value)
    fragments = ("missing step fields ['timestamp']", "reward: non-finite", "unknown step field 'velocity'",
                 "differ in length")
    for fragment in fragments:
        assert fragment in text


def test_store_shapes_must_match():
    ep = fake_episode(0)
    shapes = {k: v.shape[1:] for k, v in ep.steps.items()}
    validate_episode(ep, expect_keys=shapes)
    shapes["image_front"] = (32, 32, 3)
    with pytest.raises(EpisodeError, match="differ from the store"):
        validate_episode(ep, expect_keys=shapes)


def test_subtask_ids_must_index_the_subtask_texts():
    ep = fake_episode(0, length=4)
    assert ep.meta.subtask_texts == ["pick up block 0", "place block 0 on the pad"]
    steps = dict(ep.steps)
    steps[S.SUBTASK_ID] = np.array([0, 1, 2, 2], np.int32)
    with pytest.raises(EpisodeError, match="must index the 2 subtasks"):
        validate_episode(Episode(steps, ep.meta))
    b = EpisodeBuilder()
    _add(b)
    with pytest.raises(EpisodeError, match="newline"):
        b.finish(episode_id="e", seed=0, task="t", instruction="i", success=False, stop_reason="timeout",
                 subtasks=["a\nb"])


def test_operator_events_are_recorded_one_per_line_and_cut_to_fit():
    b = EpisodeBuilder()
    _add(b)
    ep = b.finish(episode_id="e", seed=0, task="t", instruction="i", success=False, stop_reason="operator_end",
                  operator_events=["0:coach:take the\nred block", "0:end_failure"])
    assert ep.meta.operator_events == "0:coach:take the red block\n0:end_failure"
    _add(b)
    many = [f"{i}:takeover_on" for i in range(1000)]
    ep = b.finish(episode_id="e", seed=0, task="t", instruction="i", success=False, stop_reason="operator_end",
                  operator_events=many)
    lines = ep.meta.operator_events.split("\n")
    room = S.EPISODE_FIELDS[S.OPERATOR_EVENTS].itemsize // 4
    assert len(ep.meta.operator_events) <= room and lines[0] == "0:takeover_on"
    assert lines[-1] == f"... {1000 - (len(lines) - 1)} more events not recorded"
    assert lines[:-1] == many[: len(lines) - 1]
