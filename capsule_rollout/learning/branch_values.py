"""Branch values for RECAP: Monte-Carlo values of recorded states from capsule forks, their sidecar,
and the advantage labels and critic targets made from them.

For each episode of an iteration's rollouts, chunks are sampled (`BranchPlan.rate` of the eligible
ones, the same ones on every run: the choice is seeded by the episode id; or, `select="unsure"`, that share
of all the episodes' eligible chunks where the recorded critic's label is least sure); each sampled chunk gets a
branch value at its start and at the next chunk's start, `BranchPlan.branches` continuations each,
played on the Ray actor pool (`rollout.branching.BranchActor`, the episode replayed from its seed
by a host built from the spec that recorded it). Every chunk the policy began is eligible, those after a
takeover too: the simulated operator's state (`ValueTakeover`'s counters) is part of the host's capsule, so
a branch meets the operator as the episode did. (Sidecars of version 1 were made when only the chunks before
the episode's first takeover were; they are refused.)

Values are in the critic's units (`critics.returns.normalized_returns`): each branch's return from
the boundary, with the failure penalty, over the episode limit, clipped to [-1, 0]; their mean is
the state's value. They live in `<store>.branches.npz`, one row per branched boundary, with the
episodes already branched (so a resumed run plays only the rest); the store is never written.

`select="open"` spends the continuations where an estimate can be made: a screening pass plays
`BranchPlan.screen` continuations at both boundaries of the randomly sampled chunks (`<store>.branches_screen.npz`,
the sidecar of the same `random` plan with `screen` continuations), and a chunk is open when a boundary's
continuations disagree (some succeed, some fail). Both boundaries of every open chunk then get
`BranchPlan.branches` more continuations (new noise seeds), and their value is the mean over all of
them; `<store>.branches.npz` holds only those boundaries, so distillation uses them alone and a chunk is
labelled where both its boundaries were deepened (every open chunk, and a settled one whose neighbours were
open); the others carry no branch label (with `combined`, they keep the critic's).

Advantage of a sampled chunk from s to s' (the next chunk start):
    A = sum(r_s..r_{s'-1}) / M + V_branch(s') - V_branch(s)
and, for a chunk the episode ended in, A = G_s - V_branch(s) (its own return from s). Every step of the
chunk carries it; steps of chunks nobody branched carry no label (indicator 0: trained unconditioned).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from capsule_rollout.critics.advantage import AdvantageLabels, indicators_by_task
from capsule_rollout.critics.returns import normalized_returns
from capsule_rollout.learning.advantage_labels import SIDECAR_VERSION, LabelledStore, load_npz, save_npz, write_sidecar
from capsule_rollout.learning.policy_data import training_order
from capsule_rollout.learning.training import Log
from capsule_rollout.rollout.branching import (
    BranchActor,
    BranchItem,
    BranchValue,
    ReplayDivergedError,
    require_capturable_source,
)
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.ray_rollout import run_rollouts
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import parse_store_root

BRANCHES_VERSION = 2
SELECTIONS = ("random", "unsure", "open")


@dataclass(frozen=True)
class BranchPlan:
    rate: float = 0.25
    """Share of the eligible chunks of each episode that are branched (before and after)."""
    branches: int = 4
    """Continuations per branched boundary."""
    seed: int = 0
    """Seed of the chunk sampling (with the episode id)."""
    select: str = "random"
    """Which eligible chunks: `random`, each episode's drawn at `rate`; `unsure`, the `rate` share of all the
    episodes' eligible chunks whose advantage by the recorded critic values (`chunk_advantage`) is nearest
    its task's threshold for `positive_fraction` positives: where the critic's label is least sure."""
    positive_fraction: float = 0.3
    """The share of positives whose threshold `unsure` measures closeness to."""
    screen: int = 2
    """With `open`: continuations per boundary of the screening pass (at least 2: they must be able to
    disagree); `branches` more are played at the boundaries of the open chunks."""

    def __post_init__(self) -> None:
        if not 0.0 < self.rate <= 1.0:
            raise ValueError(f"branch rate must be within (0, 1], got {self.rate}")
        if self.branches < 1:
            raise ValueError(f"branches must be >= 1, got {self.branches}")
        if self.select not in SELECTIONS:
            raise ValueError(f"branch selection must be one of {SELECTIONS}, got {self.select!r}")
        if not 0.0 < self.positive_fraction < 1.0:
            raise ValueError(f"positive_fraction must be within (0, 1), got {self.positive_fraction}")
        if self.select == "open" and self.screen < 2:
            raise ValueError(f"the screening pass needs at least 2 continuations to disagree, got {self.screen}")

    def meta(self, max_steps: int) -> dict:
        """What a sidecar records of the plan (a resumed run must ask for the same)."""
        meta = {"rate": self.rate, "branches": self.branches, "seed": self.seed, "max_steps": max_steps}
        if self.select == "unsure":  # sidecars written before the choice existed branched at random
            meta.update(select=self.select, positive_fraction=self.positive_fraction)
        elif self.select == "open":
            meta.update(select=self.select, screen=self.screen)
        return meta

    def screening(self) -> BranchPlan:
        """The `open` plan's first pass: its chunks drawn at random, `screen` continuations each."""
        return BranchPlan(rate=self.rate, branches=self.screen, seed=self.seed)


def branches_path(store: str | os.PathLike, kind: str = "branches") -> Path:
    """`<store>.branches.npz` beside the store (a zarr store or a sharded store root); `kind="branches_screen"`,
    the `open` selection's screening pass."""
    store = parse_store_root(store)
    return store.with_name(store.name.removesuffix(".zarr") + f".{kind}.npz")


def eligible_chunks(values: np.ndarray) -> list[tuple[int, int | None]]:
    """(start, next chunk's start) of each chunk the policy began; None: the episode ended within the chunk.
    Chunk starts are the steps whose value was recorded (a takeover's steps record none)."""
    starts = [int(s) for s in np.flatnonzero(np.isfinite(np.asarray(values, np.float64)))]
    return [(s, starts[i + 1] if i + 1 < len(starts) else None) for i, s in enumerate(starts)]


def sample_chunks(episode_id: str, chunks: list[tuple[int, int | None]], plan: BranchPlan) -> list[tuple[int, int | None]]:
    """The chunks of `episode_id` that `plan` branches (the same on every call)."""
    rng = np.random.default_rng([plan.seed, zlib.crc32(episode_id.encode())])
    keep = rng.random(len(chunks)) < plan.rate
    return [c for c, k in zip(chunks, keep) if k]


def chunk_advantage(start: int, nxt: int | None, rewards: np.ndarray, returns: np.ndarray, value_at,
                    max_steps: int) -> float:
    """Advantage of the chunk from `start` to `nxt` (None: the episode ended in it): `value_at(step)` gives the
    state value at a chunk start, `returns` are the episode's `normalized_returns` (module docstring)."""
    if nxt is None:
        return float(returns[start] - value_at(start))
    return float(rewards[start:nxt].sum() / max_steps + value_at(nxt) - value_at(start))


def unsure_chunks(chunks: dict[str, list[tuple[int, int | None]]], advantages: dict[str, np.ndarray],
                  tasks: dict[str, str], plan: BranchPlan) -> dict[str, list[tuple[int, int | None]]]:
    """`plan.rate` of all the eligible `chunks` (per episode id), those whose advantage by the recorded
    critic values is nearest their task's threshold (the (1 - positive_fraction) quantile of the task's
    chunk advantages); ties in episode id then step order."""
    rows = [(e, i) for e in sorted(chunks) for i in range(len(chunks[e]))]
    if not rows:
        return {e: [] for e in chunks}
    adv = np.array([advantages[e][i] for e, i in rows], np.float64)
    task = np.array([tasks[e] for e, _ in rows], dtype=object)
    margin = np.empty(len(rows))
    for t in set(task):
        m = task == t
        margin[m] = np.abs(adv[m] - np.quantile(adv[m], 1.0 - plan.positive_fraction))
    keep = set(np.argsort(margin, kind="stable")[: int(np.ceil(plan.rate * len(rows)))].tolist())
    chosen: dict[str, list[tuple[int, int | None]]] = {e: [] for e in chunks}
    for j, (e, i) in enumerate(rows):
        if j in keep:
            chosen[e].append(chunks[e][i])
    return chosen


def branch_state_value(value: BranchValue, max_steps: int) -> float:
    """The mean over the branches of their normalised return from the boundary (the critic's units)."""
    return float(np.mean([normalized_returns(np.array([ret]), success, max_steps)[0]
                          for success, ret, _ in value.outcomes]))


@dataclass
class BranchTable:
    """The sidecar's content: one row per branched boundary, and every episode already branched."""

    episode_ids: list[str]
    steps: list[int]
    values: list[float]  # normalised, the critic's units
    success_fractions: list[float]
    branches: list[int]
    done: dict[str, int]  # episode id -> control steps played to branch it (replay included)
    meta: dict
    screen: BranchTable | None = field(default=None, repr=False)  # `open`: the screening pass's table (not saved)

    @classmethod
    def empty(cls, meta: dict) -> BranchTable:
        return cls([], [], [], [], [], {}, meta)

    def add(self, episode_id: str, values: list[BranchValue], steps_played: int, max_steps: int) -> None:
        for v in values:
            self.episode_ids.append(episode_id)
            self.steps.append(v.step)
            self.values.append(branch_state_value(v, max_steps))
            self.success_fractions.append(v.success_fraction)
            self.branches.append(v.branches)
        self.done[episode_id] = steps_played

    def add_merged(self, episode_id: str, values: list[BranchValue], prior: dict[int, tuple[float, float, int]],
                   steps_played: int, max_steps: int) -> None:
        """`add`, each value merged with the earlier continuations at its boundary (`prior`: step -> value,
        success fraction, continuations, as a table holds them): the mean over all of them."""
        for v in values:
            value, fraction, n = prior[v.step]
            value = float(np.float32(value))  # as the earlier table reads back from its sidecar: a resumed run agrees
            total = n + v.branches
            self.episode_ids.append(episode_id)
            self.steps.append(v.step)
            self.values.append((value * n + branch_state_value(v, max_steps) * v.branches) / total)
            self.success_fractions.append((round(float(fraction) * n) + v.successes) / total)
            self.branches.append(total)
        self.done[episode_id] = steps_played

    def lookup(self) -> dict[tuple[str, int], float]:
        return {(e, s): v for e, s, v in zip(self.episode_ids, self.steps, self.values)}

    def save(self, path: Path) -> None:
        save_npz(path, {"episode_id": np.array(self.episode_ids, dtype=str), "step": np.array(self.steps, np.int64),
                        "value": np.array(self.values, np.float32),
                        "success_fraction": np.array(self.success_fractions, np.float32),
                        "branches": np.array(self.branches, np.int64), "done_ids": np.array(list(self.done), dtype=str),
                        "done_steps": np.array(list(self.done.values()), np.int64)},
                 {**self.meta, "version": BRANCHES_VERSION})

    @classmethod
    def load(cls, path: str | os.PathLike) -> BranchTable:
        f, meta = load_npz(path, version=BRANCHES_VERSION, what="branch sidecar",
                           make="`recap --advantage_source branches` makes it")
        return cls([str(e) for e in f["episode_id"]], [int(s) for s in f["step"]], [float(v) for v in f["value"]],
                   [float(v) for v in f["success_fraction"]], [int(b) for b in f["branches"]],
                   dict(zip((str(e) for e in f["done_ids"]), (int(n) for n in f["done_steps"]))), meta)


def collect_branches(spec: RunSpec, store: str | os.PathLike, episode_ids: list[str], plan: BranchPlan, *,
                     max_steps: int, actors: int = 2, host=None, log: Log = print) -> BranchTable:
    """Branch values for the sampled chunks of `episode_ids` (recorded in `store` by a host built from
    `spec`), played on `actors` Ray actors (0: this process, or `host`); written to the sidecar after each
    episode, so a resumed call plays only the episodes not yet there. Returns the whole table (with `open`,
    the deepened boundaries; the screening pass's table is its `screen`). A policy server is refused
    (`NotCapturableError`): its episodes cannot be branched."""
    require_capturable_source(spec.policy)
    if plan.select == "open":
        return _collect_open(spec, store, episode_ids, plan, max_steps=max_steps, actors=actors, host=host, log=log)
    return _collect_sampled(spec, store, episode_ids, plan, branches_path(store), max_steps=max_steps, actors=actors,
                            host=host, log=log)


def _open_table(path: Path, meta: dict) -> BranchTable:
    table = BranchTable.load(path) if path.exists() else BranchTable.empty(meta)
    known = {k: v for k, v in table.meta.items() if k != "version"}
    if known != meta:
        raise ValueError(f"{path} was made with {known}, this run asks for {meta}: start a new store, or keep "
                         "the branch options that run had")
    return table


def _recorded(store, episode_ids: list[str]):
    """The store's reader and each episode id's index in it (every id must be there)."""
    reader = open_episode_reader(store)
    index = {e: i for i, e in enumerate(reader.episode_ids)}
    missing = [e for e in episode_ids if e not in index]
    if missing:
        raise ValueError(f"{len(missing)} episodes to branch are not in {store}, e.g. {missing[0]}")
    return reader, index


def _chunk_starts(episode, episode_id: str) -> np.ndarray:
    values = np.asarray(episode.steps[S.VALUE], np.float64)
    if not np.isfinite(values).any():
        raise ValueError(f"episode {episode_id} records no values: branching needs the chunk starts a host "
                         "with a critic records")
    return values


def _collect_sampled(spec: RunSpec, store, episode_ids: list[str], plan: BranchPlan, path: Path, *, max_steps: int,
                     actors: int, host, log: Log) -> BranchTable:
    """`collect_branches` for the `random` and `unsure` selections, into the sidecar at `path`."""
    table = _open_table(path, plan.meta(max_steps))
    reader, index = _recorded(store, episode_ids)
    # `unsure` chooses among all the episodes (done ones too, so every call chooses the same) by their chunk
    # advantages; `random` draws each episode's own, so it reads only the episodes still to branch
    unsure = plan.select == "unsure"
    chunks, advantages, tasks, metas = {}, {}, {}, {}
    for episode_id in episode_ids:
        if episode_id in table.done and not unsure:
            continue
        episode = reader.episode(index[episode_id], [S.VALUE, *([S.REWARD] if unsure else [])])
        values = _chunk_starts(episode, episode_id)
        m = metas[episode_id] = episode.meta
        chunks[episode_id] = eligible_chunks(values)
        if unsure:
            rewards = np.asarray(episode.steps[S.REWARD], np.float64)
            returns = normalized_returns(rewards, bool(m.success), max_steps)
            advantages[episode_id] = np.array([chunk_advantage(c, n, rewards, returns, values.__getitem__,
                                                               max_steps) for c, n in chunks[episode_id]])
            tasks[episode_id] = str(m.task)
    chosen = (unsure_chunks(chunks, advantages, tasks, plan) if unsure
              else {e: sample_chunks(e, c, plan) for e, c in chunks.items()})
    todo = {e: chosen[e] for e in episode_ids if e not in table.done}
    _play(spec, table, path, todo, metas, branches=plan.branches, first=0, actors=actors, host=host, log=log,
          add=lambda e, values, played: table.add(e, values, played, max_steps))
    return table


def _collect_open(spec: RunSpec, store, episode_ids: list[str], plan: BranchPlan, *, max_steps: int, actors: int,
                  host, log: Log) -> BranchTable:
    """`collect_branches` for `open` (module docstring): the screening pass, then `plan.branches` more
    continuations at both boundaries of each open chunk, merged with the screening ones."""
    screening = plan.screening()
    screen = _collect_sampled(spec, store, episode_ids, screening, branches_path(store, "branches_screen"),
                              max_steps=max_steps, actors=actors, host=host, log=log)
    path = branches_path(store)
    table = _open_table(path, plan.meta(max_steps))
    table.screen = screen
    prior: dict[str, dict[int, tuple[float, float, int]]] = {}
    for e, s, v, f, n in zip(screen.episode_ids, screen.steps, screen.values, screen.success_fractions,
                             screen.branches):
        prior.setdefault(e, {})[s] = (v, f, n)
    reader, index = _recorded(store, episode_ids)
    chosen, metas = {}, {}
    for episode_id in episode_ids:
        if episode_id in table.done:
            continue
        episode = reader.episode(index[episode_id], [S.VALUE])
        metas[episode_id] = episode.meta
        sampled = sample_chunks(episode_id, eligible_chunks(_chunk_starts(episode, episode_id)), screening)
        fractions = prior.get(episode_id, {})
        chosen[episode_id] = [c for c in sampled if any(0.0 < fractions[s][1] < 1.0 for s in c if s is not None)]
    if chosen:
        log(f"screening ({screening.branches} continuations at each boundary of a sampled chunk): "
            f"{sum(map(len, chosen.values()))} open chunks in {sum(bool(c) for c in chosen.values())} episodes")
    _play(spec, table, path, chosen, metas, branches=plan.branches, first=plan.screen, actors=actors, host=host,
          log=log, add=lambda e, values, played: table.add_merged(e, values, prior.get(e, {}),
                                                                  played + screen.done.get(e, 0), max_steps))
    return table


def _play(spec: RunSpec, table: BranchTable, path: Path, chosen: dict[str, list[tuple[int, int | None]]],
          metas: dict, *, branches: int, first: int, actors: int, host, log: Log, add) -> None:
    """Play `branches` continuations (numbered from `first`) at both boundaries of each chosen chunk of each
    episode in `chosen`, on the actor pool; `add(episode_id, values, steps played)` puts an episode's values in
    `table`, which is saved at `path` after each episode."""
    items, expect = [], {}
    for episode_id, picked in chosen.items():
        steps = tuple(sorted({s for c in picked for s in c if s is not None}))
        if not steps:
            add(episode_id, [], 0)  # nothing chosen: nothing to play
            continue
        m = metas[episode_id]
        items.append(BranchItem(episode_id, int(m.seed), attempt=int(m.attempt), repeat=int(m.repeat), steps=steps,
                                branches=branches, first=first))
        expect[episode_id] = (bool(m.success), int(m.length), steps)

    def done(report, stats) -> None:
        item = report.item
        if report.episode is None:
            raise RuntimeError(f"branching {item.episode_id} failed: {report.error}")
        success, length, steps = expect[item.episode_id]
        meta = report.episode.meta
        if (bool(meta.success), int(meta.length)) != (success, length):
            raise ReplayDivergedError(f"{item.episode_id} played again from seed {item.seed} ended "
                                      f"{'well' if meta.success else 'badly'} at step {meta.length}, the recorded "
                                      f"one {'well' if success else 'badly'} at step {length}: not the spec that "
                                      "recorded it")
        values = [BranchValue.from_json(v) for v in report.extra["branch_values"]]
        if [v.step for v in values] != list(steps):
            raise ReplayDivergedError(f"{item.episode_id}: chunk starts {list(steps)} asked, the replay had "
                                      f"{[v.step for v in values]}")
        add(item.episode_id, values, int(report.extra["branch_steps"]))
        table.save(path)

    if items:
        log(f"branching {len(items)} episodes ({sum(len(it.steps) for it in items)} boundaries, "
            f"{branches} continuations each) on {actors or 'no'} Ray actors")
        run_rollouts(spec, items, actors=actors, actor_cls=BranchActor, host=host, on_report=done, max_attempts=2)
    table.save(path)


@dataclass(frozen=True)
class BranchLabels:
    advantage: np.ndarray  # (N,) float32, NaN where no chunk was branched
    indicator: np.ndarray  # (N,) int64: positive, negative, or 0 (no label)
    thresholds: dict[str, float]
    labelled_fraction: float  # share of the store's steps with a label (interventions included)
    episode_ids: list[str]  # the episodes the steps belong to, in their order (`training_order`)
    branch_fraction: float  # share of the store's steps whose advantage comes from branch values


def _branch_step_advantages(store, table: BranchTable) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(advantage, intervention flag, task) of every step of `store` (its episodes in `training_order`), the
    advantage NaN outside the chunks branched before and after, and the episode ids in that order."""
    max_steps = int(table.meta["max_steps"])
    reader = open_episode_reader(store)
    value_at = table.lookup()
    advs, forced, tasks = [], [], []
    order = training_order(reader.episode_ids)  # the order training reads them in
    for i in order:
        episode_id = reader.episode_ids[i]
        episode = reader.episode(i, [S.REWARD, S.VALUE, S.INTERVENTION])
        rewards = np.asarray(episode.steps[S.REWARD], np.float64)
        flags = np.asarray(episode.steps[S.INTERVENTION], bool)
        adv = np.full(len(rewards), np.nan, np.float64)
        if episode_id in table.done:
            returns = normalized_returns(rewards, bool(episode.meta.success), max_steps)
            for s, nxt in eligible_chunks(episode.steps[S.VALUE]):
                if (episode_id, s) not in value_at or (nxt is not None and (episode_id, nxt) not in value_at):
                    continue
                adv[s:len(rewards) if nxt is None else nxt] = chunk_advantage(
                    s, nxt, rewards, returns, lambda t, e=episode_id: value_at[e, t], max_steps)
        advs.append(adv)
        forced.append(flags)
        tasks.append(np.full(len(rewards), episode.meta.task, dtype=object))
    cat = lambda parts, empty: np.concatenate(parts) if parts else empty  # noqa: E731
    return (cat(advs, np.zeros(0)), cat(forced, np.zeros(0, bool)), cat(tasks, np.zeros(0, object)),
            [reader.episode_ids[i] for i in order])


def branch_labels(store: str | os.PathLike, table: BranchTable, *, positive_fraction: float) -> BranchLabels:
    """Advantage labels of every step of `store` (its episodes in `training_order`) from the branch values of
    `table` (module docstring): per task, the branched chunks' autonomous steps above the (1 - positive_fraction)
    quantile are positive; interventions are positive; the rest carry no label."""
    if not 0.0 < positive_fraction < 1.0:
        raise ValueError(f"positive_fraction must be within (0, 1), got {positive_fraction}")
    adv, forced, tasks, episode_ids = _branch_step_advantages(store, table)
    indicator, thresholds = indicators_by_task(adv, tasks, forced, positive_fraction)
    return BranchLabels(adv.astype(np.float32), indicator, thresholds,
                        float(np.mean(indicator != 0)) if len(indicator) else 0.0, episode_ids,
                        float(np.mean(np.isfinite(adv))) if len(adv) else 0.0)


def combined_labels(store: str | os.PathLike, table: BranchTable, critic: AdvantageLabels, episode_ids: list[str], *,
                    positive_fraction: float) -> BranchLabels:
    """The critic's labels of every step of `store` (`critic`, for `episode_ids` in training order) with the
    branched chunks' advantages in place of the critic's there, thresholded again per task."""
    if not 0.0 < positive_fraction < 1.0:
        raise ValueError(f"positive_fraction must be within (0, 1), got {positive_fraction}")
    branched, forced, tasks, ids = _branch_step_advantages(store, table)
    if ids != list(episode_ids) or len(branched) != len(critic.advantage):
        raise ValueError(f"the critic's labels cover {len(episode_ids)} episodes ({len(critic.advantage)} steps), "
                         f"the store {store} has {len(ids)} ({len(branched)}): label the same store")
    from_branches = np.isfinite(branched)
    adv = np.where(from_branches, branched, np.asarray(critic.advantage, np.float64))
    indicator, thresholds = indicators_by_task(adv, tasks, forced, positive_fraction)
    return BranchLabels(adv.astype(np.float32), indicator, thresholds, 1.0, ids,
                        float(np.mean(from_branches)) if len(adv) else 0.0)


def label_store_from_branches(store: str, table: BranchTable, *, positive_fraction: float,
                              critic: LabelledStore | None = None) -> tuple[Path, BranchLabels]:
    """`branch_labels` (or, given the `critic`'s labels of the store, `combined_labels`) written as the store's
    advantage sidecar (the one `fit_policy` reads)."""
    meta = {"source": "branches", "store": str(store), **{k: table.meta[k] for k in ("rate", "branches", "max_steps")},
            "positive_fraction": positive_fraction}
    if critic is None:
        labels = branch_labels(store, table, positive_fraction=positive_fraction)
        values = np.full(len(labels.advantage), np.nan, np.float32)
    else:
        arrays, critic_meta = load_npz(critic.sidecar, version=SIDECAR_VERSION, what="advantage sidecar",
                                       make="`label_store` makes it")
        ids = [str(e) for e in arrays["episode_ids"]]
        labels = combined_labels(store, table, critic.labels, ids, positive_fraction=positive_fraction)
        values = critic.values
        meta.update(source="combined", critic={k: critic_meta[k] for k in ("critic", "critic_weights_sha256", "n")},
)
    meta.update(thresholds=labels.thresholds, labelled_fraction=labels.labelled_fraction,
                branch_fraction=labels.branch_fraction)
    path = write_sidecar(store, advantage=labels.advantage, indicator=labels.indicator, values=values,
                         episode_ids=labels.episode_ids, meta=meta)
    return path, labels


def branch_targets(table: BranchTable, episode_ids: list[str], episode_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat step indices, values) of the branched boundaries within a store's flat step arrays (episodes in
    `episode_ids` order, cumulative `episode_ends`): targets a critic is distilled on."""
    starts = np.concatenate([[0], np.asarray(episode_ends, np.int64)[:-1]])
    offset = dict(zip(episode_ids, starts))
    rows = [(int(offset[e]) + s, v) for e, s, v in zip(table.episode_ids, table.steps, table.values) if e in offset]
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    index, values = zip(*rows)
    return np.asarray(index, np.int64), np.asarray(values, np.float32)
