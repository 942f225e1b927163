"""Per-chunk latency of a policy in process vs served over openpi's websocket protocol.

The same policy in this process and served by `serve_policy` in another process, asked over openpi's websocket
protocol on loopback (`RemotePolicy`), in interleaved rounds on the same observation; median and p99.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks import harness
from benchmarks.report import Block, Table, publish
from benchmarks.timing import machine, stats_us
from capsule_rollout.capsules import Arena
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.envs.suites import make_env
from capsule_rollout.learning.options import FAMILIES
from capsule_rollout.policies import openpi_wire as W
from capsule_rollout.policies.remote_policy import connect_remote_policy
from capsule_rollout.rollout.host_factory import RunSpec, build_policy
from capsule_rollout.rollout.record import absolute_source

ROWS = (("in_process", "in process (`load_observation` + `act`)"),
        ("websocket", "over the websocket (`RemotePolicy`: encode, send, the server's checks and act, answer)"),
        ("server_infer", "of which the server's own time (openpi's `server_timing.infer_ms`)"))


@dataclass(frozen=True)
class BenchRemotePolicyConfig:
    policy: str = "checkpoints/policy"
    """Policy checkpoint or factory import path served and measured."""
    env: str = ""
    """The env it acts in (sizes it; gives the observation); empty: the tabletop --family."""
    family: FAMILIES = "pick_place"
    """Tabletop family (without --env)."""
    rounds: int = 500
    """Interleaved rounds; each times one chunk in process and one over the websocket."""
    threads: int = 1
    """torch threads of the policy, in process and in the server."""
    docs: str = ""
    """Markdown file whose bench_remote_policy section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.rounds < 3 or self.threads < 1:
            raise ValueError("--rounds must be >= 3 and --threads >= 1")


def start_server(args: list[str], *, env: dict | None = None, timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """`serve_policy ARGS` in a process of its own on a free loopback port, once its /healthz answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "capsule_rollout", "serve_policy", "--port", str(port), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve_policy exited with {proc.returncode}: {proc.stdout.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as reply:
                if reply.status == 200:
                    return proc, f"ws://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"serve_policy did not answer /healthz within {timeout_s} s")


def _observation(spec: RunSpec, arrays: dict) -> dict:
    cameras = tuple(k.removeprefix("image_") for k in arrays if k.startswith("image_"))
    sizes = [a.shape[0] for k, a in arrays.items() if k.startswith("image_")]
    env = make_env(spec.env, cameras=cameras or None, image_size=sizes[0] if sizes else 64)
    obs, _ = env.reset(seed=1)
    env.close()
    return {k: obs[k] for k in arrays}


def measure(spec: RunSpec, rounds: int, log: Callable[[str], object] = print) -> dict:
    built = build_policy(spec)
    local = built.policy
    obs = _observation(spec, built.arrays)
    proc, url = start_server(["--policy", spec.policy, "--env", spec.env, "--threads", str(spec.threads)])
    try:
        arrays = {k: (tuple(a.shape), a.dtype.name) for k, a in built.arrays.items()}
        remote = connect_remote_policy(url, action_dim=local.spec.action_dim, arrays=arrays)
        Arena([remote]).allocate()
        prompt = "pick up the red block"
        for policy in (local, remote):
            policy.reset(0)
            if callable(getattr(policy, "set_language", None)):
                policy.set_language(prompt)
        client = remote.source.client
        request = {w: obs[k] for w, k in remote.source.wire.items()} | {W.PROMPT: prompt}
        log(f"measuring {spec.policy} in process and at {url} ({rounds} rounds)")

        def chunk(policy) -> float:
            t0 = time.perf_counter()
            policy.load_observation(obs)
            policy.act()
            return time.perf_counter() - t0

        for _ in range(20):  # warm-up: traces, first allocations, the connection
            chunk(local), chunk(remote)
        samples: dict[str, list[float]] = {"in_process": [], "websocket": [], "server_infer": []}
        order = [local, remote]
        for _ in range(rounds):
            random.shuffle(order)
            for policy in order:
                seconds = chunk(policy)
                samples["websocket" if policy is remote else "in_process"].append(seconds)
                if policy is remote:
                    samples["server_infer"].append(client.server_ms / 1e3)
        remote.close()
    finally:
        proc.kill()
        proc.wait()
    stats = {k: stats_us(v) for k, v in samples.items()}
    T, A = remote.spec.chunk_length, remote.spec.action_dim
    answer = {W.ACTIONS: np.zeros((T, A), np.float32), W.SERVER_TIMING: {"infer_ms": 0.0}}
    return {"machine": machine(), "cores": os.cpu_count(), "load_average": os.getloadavg()[0],
            "policy": spec.policy, "env": spec.env, "rounds": rounds, "threads": spec.threads, "chunk": [T, A],
            "request_bytes": len(W.encode(request)), "answer_bytes": len(W.encode(answer)), "stats": stats,
            "overhead_us": {q: stats["websocket"][q] - stats["in_process"][q] for q in ("median", "p99")}}


def report(s: dict) -> list[Block]:
    m = s["machine"]
    return [f"Machine: {m['cpu']}, {s['cores']} cores shared with other work (load average {s['load_average']:.1f} "
            f"at the end), torch {m['torch']}, {s['threads']} torch thread(s) per side; policy `{s['policy']}` on "
            f"`{s['env']}`, chunk {s['chunk'][0]} x {s['chunk'][1]}; a request of {s['request_bytes']:,} bytes, an "
            f"answer of {s['answer_bytes']:,}; {s['rounds']} interleaved rounds.",
            Table(("per chunk", "median (us)", "p99 (us)"),
                  [(label, f"{s['stats'][key]['median']:.0f}", f"{s['stats'][key]['p99']:.0f}") for key, label in ROWS],
                  title="policy per chunk: in process vs over openpi's websocket (loopback)"),
            f"The websocket adds {s['overhead_us']['median']:.0f} us at the median and {s['overhead_us']['p99']:.0f} us "
            "at p99 per chunk."]


def run(config: BenchRemotePolicyConfig) -> ExperimentResult:
    spec = RunSpec(env=config.env or f"tabletop:{config.family}",
                    policy=absolute_source(resolve_input(config.policy)), threads=config.threads)
    summary = {**measure(spec, config.rounds), "policy": config.policy}
    publish("bench_remote_policy", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchRemotePolicyConfig(), run, "benchmarks.remote_policy", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
