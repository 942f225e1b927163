"""serve_policy: a policy this project loads, served with openpi's websocket protocol (`rollout.policy_server`).

openpi-client drives it unchanged (`WebsocketClientPolicy(host, port)`, `ActionChunkBroker`), and so does this
project's remote policy (`sim_rollout --policy ws://host:port`). The metadata it sends first names the
observation keys with their shapes and dtypes, the prompt and the chunk.
"""

from __future__ import annotations

import json
import time

from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.configs import ServePolicyConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.policies.openpi_wire import token_from
from capsule_rollout.rollout.host_factory import RunSpec, resolve_acting
from capsule_rollout.rollout.policy_server import PolicyServer, serve_spec
from capsule_rollout.rollout.record import absolute_source
from capsule_rollout.rollout.rollout_host import HostConfig


def spec_from_config(config: ServePolicyConfig) -> RunSpec:
    policy = absolute_source(resolve_input(config.policy))
    n_exec, noise_scale = resolve_acting(policy, config.act.n_exec, config.act.noise_scale)
    return RunSpec(env=config.env or f"tabletop:{config.family}", policy=policy, advantage=config.act.advantage,
                    beta=config.act.beta, noise_scale=noise_scale, host=HostConfig(n_exec=n_exec),
                    device=config.device, threads=config.threads)


def run(config: ServePolicyConfig) -> ExperimentResult:
    console = make_console()
    with checking_inputs():
        served = serve_spec(spec_from_config(config), keys=config.keys)
        server = PolicyServer(served, host=config.host, port=config.port, token=token_from(config.token),
                              max_connections=config.max_connections)
    with server:
        meta = served.metadata()
        console.print(f"serving {config.policy} at {server.url} (openpi's websocket protocol); clients send "
                      f"{json.dumps(meta['observation'])} and {meta['prompt']['key']!r}, get "
                      f"{meta['actions']['key']!r} {meta['actions']['shape']}", highlight=False)
        console.print(f"try: python -m capsule_rollout sim_rollout --policy {server.url} --actors 0", highlight=False)
        deadline = time.monotonic() + config.seconds if config.seconds > 0 else None
        try:
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
    console.print(f"served: {server.counts}", highlight=False)
    return ExperimentResult({"url": server.url, "metadata": meta, "counts": server.counts})
