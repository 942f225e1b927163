"""How an actor of slots plays its calls: every call's items go into one feed that the actor's slot host plays
from (`SlotHost.play` over a `Feed`), so a call that arrives while another is playing (the driver keeps two in
flight: `rollout.ray_driver`) fills the slots the first call's last items leave free, and a run's rows stay full
until its last items begin.

Each call still gets back exactly its own items' reports, when the last of them is done (its episodes written to
the actor's shard then, in one commit). A watched call (`RolloutActor.watch`) that finds a phase past its deadline
returns at once with its items done, the hung ones and the rest unplayed, as one call alone would; every call in
flight finds it, so each returns before the driver kills the actor.

`SlotCalls` is a mixin of `RolloutActor` (its `_host_for`, `_report`, `_failed`, `_lost`, `_hang_reports`,
`_write_shard`, `_saved`, `_learned`, `_overrun`, `_player`).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from capsule_rollout.rollout.phase_clock import WRITE, Hang, PhaseClock
from capsule_rollout.rollout.slots.host import SlotHost
from capsule_rollout.rollout.slots.work import Feed, episode_job
from capsule_rollout.user_code import describe

WATCH_POLL_S = 0.25
"""How often a watched call looks at its phase clocks (a hang is found at most this much after its deadline)."""


@dataclass(eq=False)
class SlotCall:
    """One call's items and their reports as they come (index in the call -> report)."""

    items: list
    reports: dict = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    owner: str = ""  # who returns the call: "play" (its items all done) or "watch" (a hang ended it)


class SlotCalls:
    """The calls of an actor of slots, played from one feed (the module's docstring)."""

    def _init_slot_calls(self) -> None:
        self._feed: Feed | None = None
        self._works: dict[int, tuple[SlotCall, int]] = {}  # a feed's work index -> its call and index in it
        self._numbers = itertools.count()
        self._offer_lock = threading.Lock()
        self._shard_lock = threading.Lock()
        self._slot_host: SlotHost | None = None  # the host the feed is playing on

    def _run_slot_call(self, items: list) -> list:
        call = SlotCall(list(items))
        session = self._offer(call)
        if self._player is None:  # in this process: the call plays to its end here
            if session is not None:
                session()
            return self._returned(call)
        while not call.done.wait(WATCH_POLL_S):  # watched from when the actor has deadlines (any call's)
            found = None if self._deadlines is None else self._overrun()
            if found is not None:
                reports = self._hung_call(call, *found)
                if reports is not None:
                    return reports
        return self._returned(call)

    def _returned(self, call: SlotCall) -> list:
        return [call.reports[k] for k in range(len(call.items))]

    def _offer(self, call: SlotCall):
        """Put the call's items into the feed being played; when none is (or it has just ended), start one: the
        function that plays it (handed to the play thread here, returned in this process)."""
        with self._offer_lock:
            works = []
            for k, item in enumerate(call.items):
                number = next(self._numbers)
                self._works[number] = (call, k)
                works.append((number, episode_job(item.seed, episode_id=item.episode_id, attempt=item.attempt,
                                                  repeat=item.repeat, task=item.task)))
            if self._feed is not None and self._feed.put(works):
                self._feed.numbers.update(n for n, _ in works)
                return None
            self._feed = feed = Feed()
            feed.put(works)
            feed.numbers.update(n for n, _ in works)
        session = lambda: self._play_feed(feed)  # noqa: E731
        if self._player is not None:
            self._player.submit(session)
            return None
        return session

    def _play_feed(self, feed: Feed) -> None:
        """Play the feed on the slot host to its end, each call's reports filled as its items finish."""
        try:
            call, k = self._works[min(feed.numbers)]  # the first work's item names the host (its task)
            host = self._host_for(call.items[k])
        except Exception as exc:  # the host cannot be built: every item of the feed fails
            self._fail_feed(feed, exc)
            return
        self._slot_host = self.host = host
        try:
            for result in host.play(feed):
                call, k = self._works.pop(result.index)
                item = call.items[k]
                report = (self._failed(item, result.error) if result.error is not None
                          else self._report(item, result.value, result.host))
                report.busy_s, report.step_limit = result.busy_s, host.step_limit
                call.reports[k] = report
                if len(call.reports) == len(call.items):
                    self._finish(call)
        except Exception as exc:  # the loop itself failed: what is left of the feed is lost, the actor goes on
            self._fail_feed(feed, exc)

    def _fail_feed(self, feed: Feed, exc: BaseException) -> None:
        """Every item of `feed` not reported yet (waiting, or in a slot when the loop itself failed) is lost."""
        while not feed.finish():
            for _ in feed:  # taken: reported below
                pass
        line = describe(exc)
        with self._offer_lock:  # closed: nothing more is put
            numbers = sorted(feed.numbers)
        for number in numbers:
            if number in self._works:
                call, k = self._works.pop(number)
                call.reports[k] = self._lost(call.items[k], *line)
                if len(call.reports) == len(call.items):
                    self._finish(call)

    def _finish(self, call: SlotCall) -> None:
        """Every item of `call` done: its episodes to the shard (one commit), then it returns."""
        with call.lock:
            if call.owner:  # a hang already ended it
                return
            call.owner = "play"
        reports = self._returned(call)
        with self._shard_lock:
            self._write_shard(reports)
            self._saved()
        self._learned(reports)
        call.done.set()

    def _hung_call(self, call: SlotCall, clock: PhaseClock, hang: Hang) -> list | None:
        """The reports of a call ended by a hang (items done, the hung ones, the rest unplayed); None when the call
        finished meanwhile (its reports are the play's)."""
        with call.lock:
            owner = call.owner
            if not owner:
                call.owner = "watch"
        if owner == "play" and hang.phase != WRITE:
            call.done.wait()
            return None
        writing = hang.phase == WRITE
        done = {} if writing else dict(call.reports)  # a shard write that hung: none of them is recorded
        hung = [k for k in self._hung_in(call, clock) if k not in done]
        if not hung and (writing or clock is self.clock):  # no item to blame: every item not done is
            hung = [k for k in range(len(call.items)) if k not in done]
        reports = self._hang_reports(call.items, done, hung, hang)
        if not writing:
            with self._shard_lock:
                self._write_shard([r for r in reports if r.episode is not None])
                self._saved()  # the items done go back recorded: their capsules saved first
        self._learned(reports)
        return reports

    def _hung_in(self, call: SlotCall, clock: PhaseClock) -> list[int]:
        """The indices in `call` of the items a hung `clock` was playing."""
        host = self._slot_host
        if clock is self.clock or host is None:  # building the host, or writing the shard: the call's items
            return [k for k in range(len(call.items)) if k not in call.reports]
        playing = dict(host.playing)  # slot -> work number
        mine = lambda numbers: [self._works[n][1] for n in numbers  # noqa: E731
                                if n in self._works and self._works[n][0] is call]
        if clock is host.clock:  # a batched call: every item it serves, and the others wait for it
            return mine(playing.values())
        for slot, slot_host in enumerate(host.hosts):
            if clock is slot_host.clock:
                return mine([playing[slot]] if slot in playing else [])
        return []
