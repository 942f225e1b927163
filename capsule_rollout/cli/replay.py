"""replay: re-run a recorded episode from its initial capsule and check it bit for bit.

The host is rebuilt from the host spec signed in the episode's initial capsule (`rollout.json` must name the same
code); the capsule is loaded from disk (signed with this user's key; one from elsewhere with `--trust`, restored as
data, or `--trust-code`, as code) and restored (a capsule whose fingerprint does not match the
rebuilt host, e.g. other weights, is refused with the differing keys); the episode is played again and its
actions, proposed actions, values, states and images are compared with the recording
(`rollout.record.replay_episode`). An episode of a policy server (which no capsule can hold) replays its
recorded actions into the env, and says so.
"""

from __future__ import annotations

from capsule_rollout.cli.console import make_console
from capsule_rollout.commands.configs import ReplayConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.input_bounds import check_actors
from capsule_rollout.rollout.record import play_replay, prepare_replay
from capsule_rollout.stores.sharded_store import parse_store_root


def run(config: ReplayConfig) -> ExperimentResult:
    console = make_console()
    with checking_inputs():  # a missing store, episode, spec or capsule: one line, exit 2
        if not config.episode:
            raise ValueError("--episode is required: an episode id in the store (e.g. pick_place-s1000000)")
        if config.trust and config.trust_code:
            raise ValueError("--trust (as data) and --trust-code (as code) are two levels: give one")
        if config.slots is not None:
            check_actors(1, config.slots, 1.0, local=False)
        inputs = prepare_replay(parse_store_root(config.store), config.episode, config.capsules or None,
                                trust="code" if config.trust_code else config.trust, slots=config.slots,
                                named={"env": config.env, "policy": config.policy, "critic": config.critic})
    report = play_replay(inputs)
    if report.mode == "recorded_actions":
        console.print("the policy acted through a policy server, which no capsule holds: its recorded actions are "
                      "played into the env from the initial capsule (the critic and the host run again)")
    console.print(f"replay {report.episode_id} (seed {report.seed}, {report.length} steps, {report.stop_reason}): "
                  + ("[green]bit-identical[/green]" if report.exact else
                     "[red]DIFFERS[/red] in " + ", ".join(k for k, ok in report.checks.items() if not ok)))
    return ExperimentResult({"episode": report.episode_id, "exact": report.exact, "checks": report.checks,
                             "reset_kind": report.reset_kind, "mode": report.mode}, exit_code=0 if report.exact else 1)
