"""A command's sources are resolved once, at the top (`host_factory.resolve_spec`), and the spec only goes down:
in a `sim_rollout` run every source is checked and described once, in the driver, and every host built below it
(the preflight's, the slots') takes the resolution as it is. `run_rollouts` resolves a spec it is given unresolved
before any actor gets it."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

import capsule_rollout.rollout.host_factory as host_factory
from capsule_rollout.cli.run import main
from capsule_rollout.rollout.host_factory import RunSpec, resolve_spec
from capsule_rollout.shipped import SHIPPED

OWN = "examples.own_env_and_policy"


@pytest.fixture
def calls(monkeypatch):
    """Every source described and every resolution made in this process."""
    seen: list[tuple[str, str]] = []
    describe, resolve = host_factory.describe_source, host_factory._resolve_sources

    def counted_describe(source):
        seen.append(("describe", source))
        return describe(source)

    def counted_resolve(spec, **kwargs):
        seen.append(("resolve", spec.policy))
        return resolve(spec, **kwargs)

    monkeypatch.setattr(host_factory, "describe_source", counted_describe)
    monkeypatch.setattr(host_factory, "_resolve_sources", counted_resolve)
    return seen


@pytest.mark.parametrize("slots", [1, 2])
def test_a_sim_rollout_run_resolves_each_source_once(tmp_path, calls, slots):
    code = main(["sim_rollout", "--actors", "0", "--slots", str(slots), "--family", "pick_place", "--seeds.count",
                 "2", "--max_steps", "6", "--out", str(tmp_path / "run")])
    assert code == 0
    assert Counter(kind for kind, _ in calls) == {"resolve": 1, "describe": 2}, calls
    assert Counter(source for kind, source in calls if kind == "describe") == {
        str(SHIPPED / "policy"): 1, str(SHIPPED / "critic"): 1}


def test_a_resolved_spec_is_resolved_again_only_when_its_sources_change(calls):
    resolutions = lambda: sum(kind == "resolve" for kind, _ in calls)  # noqa: E731
    spec = resolve_spec(RunSpec(env=f"{OWN}:make_env", policy=f"{OWN}:make_policy"))
    assert spec.resolved is not None and resolutions() == 1
    assert resolve_spec(spec) is spec  # as it is
    assert resolve_spec(dataclasses.replace(spec, host=dataclasses.replace(spec.host, n_exec=2))).resolved is not None
    assert resolutions() == 1  # how many actions of a chunk run is checked against what was found, not found again
    changed = resolve_spec(dataclasses.replace(spec, critic=f"{OWN}:GoalDistance"))
    assert changed.resolved.of != spec.resolved.of and resolutions() == 2
    assert "resolved" not in spec.to_json()  # never into rollout.json


def test_a_resolution_says_what_is_wrong_before_anything_is_built(calls):
    with pytest.raises(FileNotFoundError, match="policy checkpoint 'nowhere/policy' not found"):
        resolve_spec(RunSpec(env=f"{OWN}:make_env", policy="nowhere/policy"))


def test_a_policy_server_is_asked_once_how_it_acts_and_what_it_is(tmp_path, calls, monkeypatch):
    """A policy server's metadata is read once where the run starts: the receding horizon it announces and its
    description come from the one connection (they were two)."""
    import capsule_rollout.rollout.sources as sources
    from capsule_rollout.rollout.record import run_spec
    from tests.rollout.fake_policy_servers import FakePolicyServer

    connections = []

    class Counted(sources.WebsocketPolicyClient):
        def __init__(self, *args, **kwargs):
            connections.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(sources, "WebsocketPolicyClient", Counted)
    monkeypatch.setattr(host_factory, "describe_remote", lambda source: pytest.fail("described apart"))
    server = FakePolicyServer(lambda request: None, metadata={"action_horizon": 8, "acting": {"n_exec": 3}})
    spec = run_spec(tmp_path, env=f"{OWN}:make_env", policy=server.url())
    assert spec.host.n_exec == 3 and spec.resolved.policy.chunk_length == 8
    assert [kind for kind, _ in calls] == ["describe", "resolve"] and len(connections) == 1
