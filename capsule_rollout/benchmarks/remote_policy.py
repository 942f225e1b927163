"""bench_remote_policy's measurements: the per-chunk latency of a policy in this process against the same policy
served by `serve_policy` in another process and asked over openpi's websocket protocol on loopback
(`RemotePolicy`), in interleaved rounds on the same observation."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

import numpy as np

from capsule_rollout.benchmarks.support import machine, stats_us
from capsule_rollout.capsules import Arena
from capsule_rollout.envs.suites import make_env
from capsule_rollout.policies import openpi_wire as W
from capsule_rollout.policies.remote_policy import connect_remote_policy
from capsule_rollout.rollout.host_factory import HostSpec, build_policy


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


def _observation(spec: HostSpec, arrays: dict) -> dict:
    cameras = tuple(k.removeprefix("image_") for k in arrays if k.startswith("image_"))
    sizes = [a.shape[0] for k, a in arrays.items() if k.startswith("image_")]
    env = make_env(spec.env, cameras=cameras or None, image_size=sizes[0] if sizes else 64)
    obs, _ = env.reset(seed=1)
    env.close()
    return {k: obs[k] for k in arrays}


def measure(spec: HostSpec, rounds: int, log: Callable[[str], None] = print) -> dict:
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
