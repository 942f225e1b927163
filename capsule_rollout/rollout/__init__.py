"""Rolling out, recording, replaying and branching: the rollout host, its builders and the Ray layer.

The only package that imports ray; episodes are recorded through `stores/`. What a user needs, by task
(docs/how-to/own-env.md and own-policy.md, and `examples/`):

- record and replay: `record_rollouts` (`sim_rollout` as a call, its options in five groups: `Acting`,
  `Episodes`, `Recording`, `Placement`, `Faults`; `RecordResult`, `RunError`), `replay_episode`
  (`ReplayReport`); `preflight` (`Preflight`, `PreflightError`) is what both run before any actor starts
- build a host: `RunSpec` (what a run plays: env, policy, critic as sources; `HostConfig`, how each episode is
  played; `resolve_spec`, its sources found once), `build_host` (a `RolloutHost`: one env), `build_slots` (a
  `SlotHost`: N env slots, the policy and critic batched); `as_rollout_policy` / `as_rollout_critic` adapt objects
  made in process; `with_kwargs` names a factory with keyword arguments
- snapshot, branch, fork into slots: `RolloutHost.snapshot`, `RolloutHost.branch`, `BoundaryCapsules` (an
  `EpisodeObserver` keeping capsules at chunk starts), `SlotHost.fork_into`, `episode_job` / `branch_job` (what
  `SlotHost.run_items` plays side by side), `branch_value` / `branch_episode` (Monte-Carlo values of a state)
- on Ray: `run_rollouts` (`WorkItem`, `ActorReport`), `init_ray`, `shutdown_ray`
- errors in the user's code: `UserCodeError` (one line naming the object, the user's own frames)

Names load on first use (`__getattr__`, PEP 562): importing the package imports nothing more.
"""

from __future__ import annotations

from capsule_rollout.lazy_exports import lazy_exports

_EXPORTS = {
    "record_rollouts": "capsule_rollout.rollout.record",
    "RecordResult": "capsule_rollout.rollout.record",
    "RunError": "capsule_rollout.rollout.record",
    "replay_episode": "capsule_rollout.rollout.record",
    "ReplayReport": "capsule_rollout.rollout.record",
    "FIRST_SEED": "capsule_rollout.rollout.record",
    "Acting": "capsule_rollout.rollout.run_options",
    "Episodes": "capsule_rollout.rollout.run_options",
    "Recording": "capsule_rollout.rollout.run_options",
    "Placement": "capsule_rollout.rollout.run_options",
    "Faults": "capsule_rollout.rollout.run_options",
    "preflight": "capsule_rollout.rollout.preflight_checks",
    "Preflight": "capsule_rollout.rollout.preflight_checks",
    "PreflightError": "capsule_rollout.rollout.preflight_checks",
    "RunSpec": "capsule_rollout.rollout.host_factory",
    "resolve_spec": "capsule_rollout.rollout.host_factory",
    "build_host": "capsule_rollout.rollout.host_factory",
    "build_slots": "capsule_rollout.rollout.host_factory",
    "build_policy": "capsule_rollout.rollout.host_factory",
    "HostConfig": "capsule_rollout.rollout.host_config",
    "EpisodeResult": "capsule_rollout.rollout.host_config",
    "RolloutHost": "capsule_rollout.rollout.rollout_host",
    "SlotHost": "capsule_rollout.rollout.slots.host",
    "episode_job": "capsule_rollout.rollout.slots.work",
    "branch_job": "capsule_rollout.rollout.slots.work",
    "EpisodeObserver": "capsule_rollout.rollout.observer",
    "BoundaryCapsules": "capsule_rollout.rollout.branching",
    "BranchValue": "capsule_rollout.rollout.branching",
    "branch_episode": "capsule_rollout.rollout.branching",
    "branch_value": "capsule_rollout.rollout.branching",
    "as_rollout_policy": "capsule_rollout.rollout.sources",
    "as_rollout_critic": "capsule_rollout.rollout.sources",
    "run_rollouts": "capsule_rollout.rollout.ray_rollout",
    "init_ray": "capsule_rollout.rollout.ray_rollout",
    "shutdown_ray": "capsule_rollout.rollout.ray_rollout",
    "WorkItem": "capsule_rollout.rollout.rollout_actor",
    "ActorReport": "capsule_rollout.rollout.rollout_actor",
    "with_kwargs": "capsule_rollout.import_path",
    "UserCodeError": "capsule_rollout.user_code",
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
