"""`RolloutActor`: one rollout host in a process (a Ray actor's, or the driver's with `actors=0`), and what
it is handed and returns: `WorkItem` (seed, episode id, attempt, repeat, family) and `ActorReport`.

The actor plays one item per call (or K, `run_batch`), builds the host for the item's family when a
mixed-family run first needs it, records its episode to its own shard when the store is sharded, and turns
a fatal CUDA error into the end of its process (the context is unusable; the driver re-runs the episode on a
fresh one). The driver that places actors and hands them items is `rollout.ray_rollout`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import ray
import torch

from capsule_rollout.capsules import CapsuleError, load_capsule
from capsule_rollout.rollout.host_factory import (
    MIXED,
    HostSpec,
    build_host,
    capsule_path,
    save_initial_capsule,
)
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.rollout_host import RolloutHost
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.episode import Episode
from capsule_rollout.stores.shard_manifest import ManifestEntry
from capsule_rollout.stores.sharded_store import ShardWriter

CUDA_FATAL: tuple[type[BaseException], ...] = (torch.AcceleratorError,)
"""What torch (>= 2.8, the project's floor) raises when the CUDA context is dead (an illegal access, a
device-side assert, a failed launch): the process cannot go on."""


@dataclass(frozen=True)
class WorkItem:
    episode_id: str
    seed: int
    attempt: int = 0
    """0: the seed's first rollout; k: the k-th retry after a failure (noise of its own)."""
    repeat: int = 0
    """Which rollout from the seed's initial state (noise of its own)."""
    base: str = ""
    """The episode id of the seed's first rollout (follow-ups are named after it); empty: `episode_id`."""
    family: str = ""
    """The tabletop family this episode plays: needed in a mixed-family run (`HostSpec.family` "all"), where each
    actor keeps a host per family; empty: the spec's family."""

    @property
    def base_id(self) -> str:
        return self.base or self.episode_id


def follow_up_id(base: str, attempt: int, repeat: int) -> str:
    """Episode id of a seed's repeat / retry: `base`, `base-r1`, `base-a1`, `base-r1-a2`..."""
    return base + (f"-r{repeat}" if repeat else "") + (f"-a{attempt}" if attempt else "")


@dataclass
class ActorReport:
    """What an actor returns per episode (the episode itself plus host figures)."""

    episode: object  # stores.episode.Episode (None when it failed before its first step); without images when
    # `shard` is set
    reset_kind: str
    reset_ms: float
    steps_per_s: float
    error: str
    actor_pid: int
    item: WorkItem | None = None
    extra: dict = field(default_factory=dict)  # the observers' per-episode results
    actor_index: int = -1
    shard: ManifestEntry | None = None  # where the actor wrote the episode (sharded recording), for the driver to commit
    node: str = ""  # the Ray node the actor runs on (its node id; empty in-process)



def _is_cuda_fatal(exc: BaseException | None) -> bool:
    """Whether `exc`, or what caused it, is a dead CUDA context (by type)."""
    while exc is not None:
        if isinstance(exc, CUDA_FATAL):
            return True
        exc = exc.__cause__
    return False


class RolloutActor:
    """One rollout host in its own process (or in this one); `run(item)` plays one episode."""

    def __init__(self, spec: HostSpec, index: int = 0, *, host: RolloutHost | None = None,
                 observers: list[EpisodeObserver] | None = None, shard_root: str = "") -> None:
        """`host`: a host built by the caller (in-process use); else one is built from `spec`. `shard_root`: a
        sharded store's root; each episode is then written to this process's own shard there."""
        self.spec, self.index = spec, index
        self.shard_root = shard_root
        self.node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        self._shard: ShardWriter | None = None
        if spec.pin_cores and hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[index % len(cores)]})
        if spec.device.startswith("cuda") and ray.is_initialized():
            gpu_ids = ray.get_gpu_ids()  # MuJoCo's EGL ignores CUDA_VISIBLE_DEVICES: render on our GPU
            if gpu_ids:
                os.environ.setdefault("MUJOCO_EGL_DEVICE_ID", str(int(float(gpu_ids[0]))))
        self._observers = observers
        self.hosts: dict[str, RolloutHost] = {}  # family -> its host (several in a mixed-family run)
        if host is not None:
            self._adopt(host.task if spec.family == MIXED else spec.family, host)
        elif spec.family != MIXED:
            self._adopt(spec.family, build_host(spec, observers=observers))
        else:
            self.host = None  # each family's host is built when its first item comes

    def _adopt(self, family: str, host: RolloutHost) -> RolloutHost:
        if self.spec.capsule_dir and host.capsule_source is None:
            host.capsule_source = self._saved_capsule
        self.hosts[family] = self.host = host
        return host

    def _host_for(self, item: WorkItem) -> RolloutHost:
        """The host that plays `item`: its family's (built on first use in a mixed-family run)."""
        if self.spec.env:
            return self.host  # one env: every item plays on it
        family = item.family or self.spec.family
        if family == MIXED:
            raise ValueError(f"{item.episode_id}: a mixed-family run needs each work item's family")
        if family not in self.hosts:
            self._adopt(family, build_host(dataclasses.replace(self.spec, family=family), observers=self._observers))
        return self.hosts[family]

    def ready(self) -> int:
        """Answers once the actor is placed and its host built (the driver waits for it); a mixed-family
        actor builds each family's host with that family's first item."""
        return os.getpid()

    pid = ready

    def _saved_capsule(self, key: str, seed: int):
        """A seed's initial capsule saved under `capsule_dir` (by this or another actor), or None."""
        path = capsule_path(self.spec.capsule_dir, self.host.task, seed)
        if not path.exists():
            return None
        try:
            return load_capsule(path)
        except CapsuleError:
            return None  # unreadable: the reset is cold (and writes no new file over it)

    def run(self, item: WorkItem) -> ActorReport:
        """Play one episode (and, sharded, write it to this actor's shard)."""
        return self.run_batch([item])[0]

    def run_batch(self, items: list[WorkItem]) -> list[ActorReport]:
        """Play `items` one after another; sharded, write their episodes to this actor's shard in one commit
        (one Ray call for several episodes: `run_rollouts(episodes_per_call=...)`)."""
        reports = []
        for item in items:
            try:
                self.host = self._host_for(item)
            except Exception as exc:  # a host that cannot be built: this episode failed, the actor goes on
                reports.append(ActorReport(None, "failed", 0.0, 0.0, f"{type(exc).__name__}: {exc}", os.getpid(),
                                           item, {}, self.index, node=self.node))
                continue
            reports.append(self._play(item))
        recorded = [r for r in reports if r.episode is not None]
        if self.shard_root and recorded:
            if self._shard is None:
                self._shard = ShardWriter(self.shard_root, prefix=f"a{self.index:03d}")
            entries = self._shard.write_many([r.episode for r in recorded])
            for report, entry in zip(recorded, entries, strict=True):
                episode = report.episode
                report.shard = entry
                report.episode = Episode({k: v for k, v in episode.steps.items()
                                          if not k.startswith(S.IMAGE_PREFIX)}, episode.meta, episode.extra)
        return reports

    def _play(self, item: WorkItem) -> ActorReport:
        try:
            result = self.host.run_episode(item.seed, episode_id=item.episode_id, attempt=item.attempt,
                                           repeat=item.repeat)
        except Exception as exc:  # a reset that raised: this episode failed, the actor goes on
            if _is_cuda_fatal(exc):
                os._exit(3)  # the CUDA context is dead: Ray restarts the process, the driver re-runs the item
            return ActorReport(None, "failed", 0.0, 0.0, f"{type(exc).__name__}: {exc}", os.getpid(), item, {},
                               self.index, node=self.node)
        if _is_cuda_fatal(result.exception):
            os._exit(3)
        save_initial_capsule(self.host, self.spec, item.seed)
        return ActorReport(episode=result.episode, reset_kind=result.reset_kind, reset_ms=result.reset_ms,
                           steps_per_s=result.steps_per_s, error=result.error, actor_pid=os.getpid(), item=item,
                           extra=result.extra, actor_index=self.index, node=self.node)

    def close_shard(self) -> None:
        """Close this process's shard writer (every episode it returned is committed to the shard already)."""
        if self._shard is not None:
            self._shard.close()
            self._shard = None

    def close(self) -> None:
        self.close_shard()
        for host in self.hosts.values():
            host.close()

