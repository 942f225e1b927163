"""Branch values for RECAP on the coin env, whose state values are known exactly: chunk sampling, the
sidecar (resumable), the labels made from it and the targets a critic is distilled on."""

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, Role
from capsule_rollout.critics.advantage import INDICATOR_NEGATIVE, INDICATOR_POSITIVE, AdvantageLabels, indicators_by_task
from capsule_rollout.critics.returns import normalized_returns
from capsule_rollout.critics.rollout_critic import CriticSpec
from capsule_rollout.learning.advantage_labels import LabelledStore, load_sidecar, write_sidecar
from capsule_rollout.learning.branch_values import (
    BranchPlan,
    BranchTable,
    branch_labels,
    branch_targets,
    branches_path,
    collect_branches,
    combined_labels,
    eligible_chunks,
    label_store_from_branches,
    sample_chunks,
    unsure_chunks,
)
from capsule_rollout.rollout.branching import ReplayDivergedError, branch_seed
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from tests.rollout.protocol_fakes import DOF, GreedyPolicy
from tests.rollout.test_branching import CoinEnv, _flip_wins

M = 6  # the coin env's episode limit: the normalisation of returns


class ZeroCritic(BufferComponent):
    """Values every chunk 0: the host records a value at each chunk start (how branching finds them)."""

    name = "critic"

    def __init__(self) -> None:
        super().__init__()
        self.spec = CriticSpec(observation_keys=())

    def buffer_specs(self):
        return [BufferSpec("value", (1,), torch.float32, role=Role.IO)]

    def load_observation(self, obs, step: int) -> None:
        pass

    def evaluate(self) -> torch.Tensor:
        return self.buffers["value"].zero_()


def _host(noise_seed: int = 0) -> RolloutHost:
    return RolloutHost(env=CoinEnv(), policy=GreedyPolicy(chunk_length=2, gain=0.0, noise=1.0), critic=ZeroCritic(),
                       config=HostConfig(n_exec=2, noise_seed=noise_seed))


@pytest.fixture
def recorded(tmp_path):
    """A store of 4 coin episodes (chunk starts at steps 0, 2, 4) and the host that recorded them."""
    store = tmp_path / "episodes.zarr"
    host = _host()
    with ZarrRecorder(store) as recorder:
        for seed in range(4):
            recorder.write(host.run_episode(seed, episode_id=f"coin-{seed}").episode)
    yield store, host
    host.close()


def test_every_chunk_the_policy_began_is_eligible_and_sampling_is_repeatable():
    nan = np.nan
    values = np.array([0.1, nan, 0.2, nan, 0.3, nan, nan])
    assert eligible_chunks(values) == [(0, 2), (2, 4), (4, None)]
    # a takeover at steps 3-5 (no chunk starts there): the chunk after it, from step 6, is eligible too
    assert eligible_chunks(np.array([0.1, nan, 0.2, nan, nan, nan, 0.3, nan])) == [(0, 2), (2, 6), (6, None)]
    chunks = [(s, s + 2) for s in range(0, 40, 2)]
    plan = BranchPlan(rate=0.5, branches=2, seed=3)
    picked = sample_chunks("ep-a", chunks, plan)
    assert picked == sample_chunks("ep-a", chunks, plan) and 0 < len(picked) < len(chunks)
    assert picked != sample_chunks("ep-b", chunks, plan)
    assert sample_chunks("ep-a", chunks, BranchPlan(rate=1.0)) == chunks
    with pytest.raises(ValueError, match="branch rate"):
        BranchPlan(rate=0.0)


def test_branch_values_are_the_known_ones_and_a_resumed_call_plays_nothing_again(recorded):
    store, host = recorded
    plan = BranchPlan(rate=1.0, branches=32)
    ids = [f"coin-{s}" for s in range(4)]
    table = collect_branches(RunSpec(), store, ids, plan, max_steps=M, actors=0, host=host, log=lambda m: None)
    assert branches_path(store).exists() and sorted(table.done) == ids
    values = table.lookup()
    reader = open_episode_reader(store)
    for i, episode_id in enumerate(reader.episode_ids):
        success = reader.episode(i, ["reward"]).meta.success
        seed = int(episode_id.split("-")[1])
        wins = sum(_flip_wins(branch_seed(seed, b)) for b in range(32))
        # before the flip: P(win) of ending at 0 after 3 steps of -1 (-3/6 -> -0.5 ... the last step 0)
        win_value, loss_value = -3 / M, -1.0
        assert values[episode_id, 2] == pytest.approx((wins * win_value + (32 - wins) * loss_value) / 32, abs=1e-6)
        assert values[episode_id, 4] == pytest.approx(-1 / M if success else -1.0, abs=1e-6)  # decided
        # played: the episode, the check's replay from step 0, 32 branches from each of 0, 2, 4
        assert table.done[episode_id] == 6 + 6 + 32 * (6 + 4 + 2)
    played = []
    again = collect_branches(RunSpec(), store, ids, plan, max_steps=M, actors=0, host=host, log=played.append)
    assert played == [] and again.lookup() == values  # everything was in the sidecar
    with pytest.raises(ValueError, match="this run asks for"):
        collect_branches(RunSpec(), store, ids, BranchPlan(rate=1.0, branches=8), max_steps=M, actors=0, host=host)


def test_chunks_after_a_takeover_get_their_known_branch_values(tmp_path):
    """The operator takes over for step 1 (the policy's first chunk is dropped); the chunks from steps 2 and 4
    come after the takeover, and their branches meet the operator as the episode left it (played again: no
    second takeover), so the values are the known ones."""
    from capsule_rollout.robot_side.operator_input import Kind, OperatorEvent, ScriptedOperator

    store, host = tmp_path / "episodes.zarr", _host()
    host.teleop = lambda: np.full(DOF, -1.0, np.float32)
    host.operator = ScriptedOperator({1: OperatorEvent(Kind.TAKEOVER_ON), 2: OperatorEvent(Kind.TAKEOVER_OFF)})
    ids = [f"coin-{s}" for s in range(3)]
    with ZarrRecorder(store) as recorder:
        for seed in range(3):
            episode = host.run_episode(seed, episode_id=f"coin-{seed}").episode
            assert episode.steps["intervention"].tolist() == [False, True] + [False] * 4
            recorder.write(episode)
    table = collect_branches(RunSpec(), store, ids, BranchPlan(rate=1.0, branches=16), max_steps=M, actors=0,
                             host=host, log=lambda m: None)
    values = table.lookup()
    for seed, episode_id in enumerate(ids):
        assert sorted(s for e, s in values if e == episode_id) == [0, 2, 4]
        wins = sum(_flip_wins(branch_seed(seed, b)) for b in range(16))
        assert values[episode_id, 2] == pytest.approx((wins * -3 / M + (16 - wins) * -1.0) / 16, abs=1e-6)
    host.close()


def test_open_selection_deepens_only_the_chunks_whose_screening_continuations_disagree(tmp_path):
    store, host = tmp_path / "episodes.zarr", _host()
    ids = [f"coin-{s}" for s in range(6)]  # seeds 4 and 5: their first two continuations agree at step 2
    with ZarrRecorder(store) as recorder:
        for seed in range(6):
            recorder.write(host.run_episode(seed, episode_id=f"coin-{seed}").episode)
    plan = BranchPlan(rate=1.0, branches=6, select="open", screen=2)
    table = collect_branches(RunSpec(), store, ids, plan, max_steps=M, actors=0, host=host, log=lambda m: None)
    screen = BranchTable.load(branches_path(store, "branches_screen"))  # the `random` plan's, 2 continuations
    assert {k: v for k, v in screen.meta.items() if k != "version"} == BranchPlan(rate=1.0, branches=2).meta(M)
    fraction = {(e, s): f for e, s, f in zip(screen.episode_ids, screen.steps, screen.success_fractions)}
    reader = open_episode_reader(store)
    open_chunks = {}
    for i, episode_id in enumerate(reader.episode_ids):
        episode = reader.episode(i, ["value"])
        open_chunks[episode_id] = [c for c in eligible_chunks(episode.steps["value"])
                                   if any(0 < fraction[episode_id, s] < 1 for s in c if s is not None)]
    deep = {(e, s) for e, chunks in open_chunks.items() for c in chunks for s in c if s is not None}
    assert deep and len(deep) < len(fraction)  # some boundaries are open, not all
    assert set(zip(table.episode_ids, table.steps)) == deep and set(table.branches) == {8}
    for episode_id, step, value, frac in zip(table.episode_ids, table.steps, table.values, table.success_fractions):
        seed = int(episode_id.split("-")[1])
        if step == 2:  # the screen's continuations 0-1 and six new ones, 2-7: each a fresh draw at the flip
            wins = sum(_flip_wins(branch_seed(seed, b)) for b in range(8))
            assert frac == wins / 8
            assert value == pytest.approx((wins * -3 / M + (8 - wins) * -1.0) / 8, abs=1e-6)
        elif step == 4:  # decided before it: every continuation ends as the episode did
            assert frac in (0.0, 1.0)
    for episode_id in ids:  # the cost counts both passes; an episode without an open chunk played only the screen
        extra = table.done[episode_id] - screen.done[episode_id]
        assert (extra > 0) == bool(open_chunks[episode_id])
    played = []
    again = collect_branches(RunSpec(), store, ids, plan, max_steps=M, actors=0, host=host, log=played.append)
    assert played == [] and again.lookup() == pytest.approx(table.lookup())  # both sidecars hold it all
    # labels where both boundaries were deepened: every open chunk, and the end chunk after an open one
    labels = branch_labels(store, again, positive_fraction=0.5)
    expect = np.zeros(36, bool)
    for k, episode_id in enumerate(labels.episode_ids):
        for start, nxt in [(0, 2), (2, 4), (4, None)]:
            if all((episode_id, s) in deep for s in (start, nxt) if s is not None):
                expect[6 * k + start: 6 * k + (6 if nxt is None else nxt)] = True
    assert expect.any() and not expect.all()
    assert np.array_equal(np.isfinite(labels.advantage), expect)
    host.close()
    with pytest.raises(ValueError, match="at least 2"):
        BranchPlan(select="open", screen=1)


def test_unsure_chunks_are_the_share_nearest_their_tasks_threshold():
    chunks = {"a": [(0, 2), (2, 4), (4, None)], "b": [(0, 2), (2, None)], "c": [(0, 2)]}
    advantages = {"a": np.array([0.0, 0.5, 1.0]), "b": np.array([0.45, 0.9]), "c": np.array([5.0])}
    tasks = {"a": "t", "b": "t", "c": "u"}
    # task t's median is 0.5: margins a 0.5 0 0.5, b 0.05 0.4; task u's only chunk is its own median (margin 0)
    plan = BranchPlan(rate=0.5, select="unsure", positive_fraction=0.5)
    assert unsure_chunks(chunks, advantages, tasks, plan) == {"a": [(2, 4)], "b": [(0, 2)], "c": [(0, 2)]}
    assert unsure_chunks(chunks, advantages, tasks, BranchPlan(rate=1.0, select="unsure")) == chunks
    with pytest.raises(ValueError, match="branch selection"):
        BranchPlan(select="confident")


def test_unsure_selection_branches_the_chunks_the_recorded_critic_labels_least_surely(recorded):
    store, host = recorded
    ids = [f"coin-{s}" for s in range(4)]
    plan = BranchPlan(rate=0.5, branches=2, select="unsure", positive_fraction=0.3)
    table = collect_branches(RunSpec(), store, ids, plan, max_steps=M, actors=0, host=host, log=lambda m: None)
    # the zero critic recorded V = 0 at the chunk starts 0, 2, 4: a chunk's advantage is its rewards over M, and
    # the last one's is its own return (-1/6 after a win, -1 after a loss)
    reader = open_episode_reader(store)
    rows = []
    for i, episode_id in enumerate(reader.episode_ids):
        episode = reader.episode(i, ["reward"])
        r = np.asarray(episode.steps["reward"], np.float64)
        last = -1 / M if episode.meta.success else -1.0
        rows += [(episode_id, 0, r[0:2].sum() / M), (episode_id, 2, r[2:4].sum() / M), (episode_id, 4, last)]
    adv = np.array([a for *_, a in rows])
    margin = np.abs(adv - np.quantile(adv, 0.7))
    chosen = [rows[j] for j in np.argsort(margin, kind="stable")[:6]]
    expected = {(e, t) for e, s, _ in chosen for t in (s, s + 2) if t < 6}
    assert set(zip(table.episode_ids, table.steps)) == expected
    played = []
    assert collect_branches(RunSpec(), store, ids, plan, max_steps=M, actors=0, host=host,
                            log=played.append).lookup() == table.lookup() and played == []
    with pytest.raises(ValueError, match="this run asks for"):  # the sidecar was made by another choice
        collect_branches(RunSpec(), store, ids, BranchPlan(rate=0.5, branches=2), max_steps=M, actors=0, host=host)


def test_a_replay_by_another_spec_than_the_recording_one_is_refused(recorded):
    store, _ = recorded
    other = _host(noise_seed=99)  # other noise: the same seed plays another episode
    try:
        with pytest.raises(ReplayDivergedError):
            collect_branches(RunSpec(), store, [f"coin-{s}" for s in range(4)], BranchPlan(rate=1.0, branches=2),
                             max_steps=M, actors=0, host=other, log=lambda m: None)
    finally:
        other.close()


def test_labels_from_branches_are_value_after_minus_before_and_unbranched_steps_carry_none(recorded):
    store, host = recorded
    ids = [f"coin-{s}" for s in range(4)]
    table = collect_branches(RunSpec(), store, ids, BranchPlan(rate=1.0, branches=16), max_steps=M, actors=0,
                             host=host, log=lambda m: None)
    # drop coin-3 from the table: its steps get no label
    keep = [i for i, e in enumerate(table.episode_ids) if e != "coin-3"]
    table = BranchTable([table.episode_ids[i] for i in keep], [table.steps[i] for i in keep],
                        [table.values[i] for i in keep], [table.success_fractions[i] for i in keep],
                        [table.branches[i] for i in keep], {e: n for e, n in table.done.items() if e != "coin-3"},
                        table.meta)
    labels = branch_labels(store, table, positive_fraction=0.3)
    reader = open_episode_reader(store)
    value = table.lookup()
    for i, episode_id in enumerate(reader.episode_ids):
        episode = reader.episode(i, ["reward"])
        adv = labels.advantage[6 * i: 6 * i + 6]
        if episode_id == "coin-3":
            assert np.isnan(adv).all() and not labels.indicator[18:24].any()
            continue
        r = episode.steps["reward"]
        # the chunk (2, 4) holds the flip: its advantage is what the flip did to the value
        assert adv[2] == adv[3] == pytest.approx(r[2:4].sum() / M + value[episode_id, 4] - value[episode_id, 2])
        g = normalized_returns(r, bool(episode.meta.success), M)
        assert adv[4] == adv[5] == pytest.approx(g[4] - value[episode_id, 4])  # the last chunk: its own return
    assert labels.labelled_fraction == pytest.approx(18 / 24)
    labelled = labels.indicator[:18]
    assert set(labelled) <= {INDICATOR_POSITIVE, INDICATOR_NEGATIVE}
    threshold = labels.thresholds["coin"]
    assert np.array_equal(labelled == INDICATOR_POSITIVE, labels.advantage[:18] > threshold)
    path, _ = label_store_from_branches(str(store), table, positive_fraction=0.3)
    assert np.array_equal(load_sidecar(path, list(reader.episode_ids)), labels.indicator)  # what fit_policy reads


def test_combined_labels_are_the_branch_advantages_where_branched_and_the_critics_elsewhere(recorded):
    store, host = recorded
    ids = [f"coin-{s}" for s in range(4)]
    table = collect_branches(RunSpec(), store, ids, BranchPlan(rate=1.0, branches=8), max_steps=M, actors=0,
                             host=host, log=lambda m: None)
    table.done.pop("coin-3")  # coin-3 counts as unbranched: its steps keep the critic's advantages
    branched = branch_labels(store, table, positive_fraction=0.3).advantage
    critic_adv = np.linspace(-1.0, 0.0, 24, dtype=np.float32)
    critic = AdvantageLabels(critic_adv, np.full(24, INDICATOR_NEGATIVE), {}, {})
    labels = combined_labels(store, table, critic, ids, positive_fraction=0.3)
    assert np.array_equal(labels.advantage[:18], branched[:18]) and np.array_equal(labels.advantage[18:], critic_adv[18:])
    assert labels.labelled_fraction == 1.0 and labels.branch_fraction == pytest.approx(18 / 24)
    threshold = np.quantile(labels.advantage, 0.7)
    assert labels.thresholds["coin"] == pytest.approx(threshold)
    assert np.array_equal(labels.indicator == INDICATOR_POSITIVE, labels.advantage > threshold)
    with pytest.raises(ValueError, match="label the same store"):
        combined_labels(store, table, critic, ids[:3], positive_fraction=0.3)
    # as the store's sidecar: the critic's values and who made them kept, the merged indicators what training reads
    sidecar = write_sidecar(str(store), advantage=critic_adv, indicator=critic.indicator,
                            values=np.zeros(24, np.float32), episode_ids=ids,
                            meta={"critic": "c", "critic_weights_sha256": "0" * 64, "n": 2})
    path, _ = label_store_from_branches(str(store), table, positive_fraction=0.3,
                                        critic=LabelledStore(sidecar, critic, np.zeros(24, np.float32), 4))
    assert np.array_equal(load_sidecar(path, ids), labels.indicator)


def test_indicators_by_task_leave_unlabelled_steps_out_and_make_interventions_positive():
    adv = np.array([0.0, 1.0, 2.0, np.nan, 5.0, np.nan, 7.0], np.float32)
    task = np.array(["a", "a", "a", "a", "a", "b", "b"], dtype=object)
    forced = np.array([0, 0, 0, 1, 1, 0, 0], bool)
    indicator, thresholds = indicators_by_task(adv, task, forced, 0.5)
    assert thresholds == {"a": 1.0, "b": 7.0}  # interventions and NaNs are not in a task's quantile
    P, N = INDICATOR_POSITIVE, INDICATOR_NEGATIVE
    assert indicator.tolist() == [N, N, P, P, P, 0, N]


def test_distillation_targets_land_on_the_branched_steps_of_the_flat_arrays(recorded):
    store, host = recorded
    ids = [f"coin-{s}" for s in range(4)]
    table = collect_branches(RunSpec(), store, ids, BranchPlan(rate=1.0, branches=4), max_steps=M, actors=0,
                             host=host, log=lambda m: None)
    ends = np.array([6, 12, 18, 24])
    index, values = branch_targets(table, ids, ends)
    assert sorted(index.tolist()) == sorted(6 * i + s for i in range(4) for s in (0, 2, 4))
    lookup = table.lookup()
    for flat, v in zip(index, values):
        assert v == pytest.approx(lookup[ids[flat // 6], flat % 6])
    index, _ = branch_targets(table, ["coin-2"], np.array([6]))  # a store holding one of them
    assert sorted(index.tolist()) == [0, 2, 4]


def test_a_missing_or_foreign_branch_sidecar_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="recap --advantage_source branches"):
        BranchTable.load(tmp_path / "none.branches.npz")
    table = BranchTable.empty({"rate": 1.0, "branches": 2, "seed": 0, "max_steps": M})
    path = tmp_path / "s.branches.npz"
    table.save(path)
    assert BranchTable.load(path).meta["max_steps"] == M
    arrays = dict(np.load(path))
    arrays["meta"] = np.array('{"version": 99}')
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="version 99, this code reads 2: move it aside"):
        BranchTable.load(path)


def test_training_reads_episodes_in_id_order_whatever_order_they_were_recorded_in(tmp_path):
    from capsule_rollout.learning.policy_data import load_training_arrays
    from capsule_rollout.tabletop.tokenizer import Tokenizer

    host = _host()
    try:
        episodes = [host.run_episode(seed, episode_id=f"coin-{seed}").episode for seed in (3, 0, 2, 1)]
    finally:
        host.close()
    stores = []
    for name, order in (("recorded", episodes), ("sorted", sorted(episodes, key=lambda e: e.meta.episode_id))):
        with ZarrRecorder(tmp_path / f"{name}.zarr") as recorder:
            for episode in order:
                recorder.write(episode)
        stores.append(load_training_arrays(str(tmp_path / f"{name}.zarr"), (), Tokenizer()))
    a, b = stores
    assert [m.episode_id for m in a["metas"]] == [f"coin-{s}" for s in range(4)] == [m.episode_id for m in b["metas"]]
    for key in ("states", "actions", "rewards", "tokens", "episode_steps", "episode_ends", "actors"):
        assert np.array_equal(a[key], b[key]), key
    first = next(e for e in episodes if e.meta.episode_id == "coin-0")
    assert np.array_equal(a["actions"][:6], first.steps["action"])  # coin-0 first, its steps in their order
