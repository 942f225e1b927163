"""What a run of `run_rollouts` still has to do (`WorkPlan`), its tallies (`DriverStats`), and how returned
episodes are recorded once (`record_reports`).

An item that cannot be played (it hung or its actor died too often, or the run gave up) is lost: it gets a
report of its own with no episode and the reason (`lost_report`), so a run's reports always account for every
item.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from capsule_rollout.rollout.phase_clock import add_totals
from capsule_rollout.rollout.rollout_actor import ActorReport, WorkItem, follow_up_id
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.episode import Episode
from capsule_rollout.stores.shard_manifest import ManifestEntry
from capsule_rollout.stores.sharded_store import ShardedStore

LOST = "lost"
"""The `reset_kind` of a lost item's report."""


@dataclass
class DriverStats:
    episodes: int = 0
    successes: int = 0
    resubmitted: int = 0
    actor_failures: int = 0
    timeouts: int = 0  # calls ended for a hang: a phase past its deadline (`hangs`), or no answer in the call's
    hangs: int = 0  # phases found past their deadline by the actors
    lost: int = 0  # items given up (their reports say why)
    duplicates_skipped: int = 0
    failed_before_first_step: int = 0
    actors_placed: int = 0
    follow_ups: int = 0
    episode_deadline_s: float | None = None  # the driver's deadline per episode of the last call handed out
    phase_deadlines: dict = field(default_factory=dict)  # what `PhaseDeadlines.table` says at the end of the run
    gave_up: str = ""  # why the run stopped before its work was done (its items then lost); empty: it did not
    gave_up_traceback: str = ""  # the user's own frames behind `gave_up` (an actor whose host could not be built)
    ready_at: float | None = None  # time.monotonic() when the first actor was placed and built (in-process: made)
    part_s: dict = field(default_factory=dict)  # the actors' seconds in each phase and part (`ActorReport.part_s`)
    record_s: float = 0.0  # the driver's seconds writing (or committing) the returned episodes


class WorkPlan:
    """The work: items to hand out, follow-ups (repeats, retries) as results come in, resumes."""

    def __init__(self, items: Iterable[WorkItem], repeats: int, attempts: int, done: Mapping[str, bool]) -> None:
        self.repeats, self.attempts, self.done = repeats, attempts, dict(done)
        self.todo: deque[WorkItem] = deque()
        self.preferred: dict[int, deque[WorkItem]] = {}
        self.skipped = 0
        for item in items:
            self._add(item, None)

    def _add(self, item: WorkItem, actor: int | None) -> None:
        """Queue `item`, or, when already recorded, walk on to what it would lead to."""
        if item.episode_id in self.done:
            self.skipped += 1
            for nxt in self.after(item, self.done[item.episode_id]):
                self._add(nxt, actor)
            return
        (self.preferred.setdefault(actor, deque()) if actor is not None else self.todo).append(item)

    def after(self, item: WorkItem, success: bool) -> list[WorkItem]:
        """What a finished rollout leads to: a retry after a failure, the seed's next repeat."""
        base, out = item.base_id, []
        if not success and item.attempt + 1 < self.attempts:
            out.append(WorkItem(follow_up_id(base, item.attempt + 1, item.repeat), item.seed, item.attempt + 1,
                                item.repeat, base, item.task))
        if item.attempt == 0 and item.repeat + 1 < self.repeats:
            out.append(WorkItem(follow_up_id(base, 0, item.repeat + 1), item.seed, 0, item.repeat + 1, base,
                                item.task))
        return out

    def follow(self, item: WorkItem, success: bool, actor: int | None) -> int:
        nxt = self.after(item, success)
        for it in nxt:
            self._add(it, actor)
        return len(nxt)

    def retry(self, item: WorkItem) -> None:
        self.todo.appendleft(item)

    def take(self, actor: int) -> WorkItem | None:
        """The next item for `actor`: its own follow-ups, then new work, then another's follow-ups
        (better a restore from `capsule_dir`, or a cold reset, than an idle actor)."""
        own = self.preferred.get(actor)
        if own:
            return own.popleft()
        if self.todo:
            return self.todo.popleft()
        for queue in self.preferred.values():
            if queue:
                return queue.popleft()
        return None

    def drain(self) -> Iterator[WorkItem]:
        """Every item left, and the repeats each would lead to (a run that gives up loses them all)."""
        queues = [self.todo, *self.preferred.values()]
        while any(queues):
            item = next(q for q in queues if q).popleft()
            yield item
            yield from self.unplayed_repeats(item)

    def unplayed_repeats(self, item: WorkItem) -> Iterator[WorkItem]:
        """The seed's later repeats that `item` (a first attempt) would lead to."""
        if item.attempt:
            return
        for repeat in range(item.repeat + 1, self.repeats):
            nxt = WorkItem(follow_up_id(item.base_id, 0, repeat), item.seed, 0, repeat, item.base_id, item.task)
            if nxt.episode_id not in self.done:
                yield nxt

    def __bool__(self) -> bool:
        return bool(self.todo) or any(self.preferred.values())

    def __len__(self) -> int:
        return len(self.todo) + sum(len(q) for q in self.preferred.values())


def lost_report(item: WorkItem, why: str) -> ActorReport:
    """The report of an item given up: no episode, `why` as its error."""
    return ActorReport(None, LOST, 0.0, 0.0, why, os.getpid(), item)


def record_reports(reports: list[ActorReport], recorder, stats: DriverStats) -> None:
    """Write (single store) or commit (sharded store: the actors wrote them; one group commit) returned
    episodes, each once; the reports' phase seconds and the writing's added to `stats`."""
    t0 = time.perf_counter()
    entries: list[ManifestEntry] = []
    ids: set[str] = set()
    for report in reports:
        add_totals(stats.part_s, report.part_s)
        if report.episode is None:
            stats.failed_before_first_step += 1
            continue
        episode_id = report.episode.meta.episode_id
        if recorder is not None and (episode_id in recorder or episode_id in ids):
            stats.duplicates_skipped += 1  # sharded: this copy stays an orphan in its shard, the manifest names the first
            continue
        ids.add(episode_id)
        if isinstance(recorder, ShardedStore):
            if report.shard is None:
                raise RuntimeError(f"episode {episode_id} came back without a shard entry")
            entries.append(report.shard)
        elif recorder is not None:
            recorder.write(report.episode)
        stats.episodes += 1
        stats.successes += int(report.episode.meta.success)
    if entries:
        recorder.commit_many(entries)
    stats.record_s += time.perf_counter() - t0


def without_images(report: ActorReport) -> None:
    """Drop the images of a recorded report's episode (the store has them): what the driver keeps of each
    episode until the run ends is then its steps' small arrays and metadata."""
    episode = report.episode
    if episode is not None and any(k.startswith(S.IMAGE_PREFIX) for k in episode.steps):
        report.episode = Episode({k: v for k, v in episode.steps.items() if not k.startswith(S.IMAGE_PREFIX)},
                                 episode.meta, episode.extra)


def succeeded(report: ActorReport) -> bool:
    return report.episode is not None and bool(report.episode.meta.success)
