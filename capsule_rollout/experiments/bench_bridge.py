"""bench_bridge: round-trip latency of the robot bridge on loopback (SimRobotServer, real protocol).

Per request kind, interleaved: `heartbeat` (an empty frame each way), `action`
(a 4-float action, the env step included) and `observe` (a 64x64 image and the
state back), each timed from the client's send to its decoded reply.

The measurements are `benchmarks/bridge.py`'s; this command prints them and writes its section into the `--docs` file.
"""

from __future__ import annotations

from capsule_rollout.benchmarks.bridge import latency
from capsule_rollout.benchmarks.support import machine, update_markdown_section
from capsule_rollout.commands.configs import BenchBridgeConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console


def run(config: BenchBridgeConfig) -> ExperimentResult:
    console = make_console()
    stats = latency(config)
    lines = [f"Device: **cpu** ({machine().get('cpu', '?')}), loopback TCP, {config.image_size}x{config.image_size} "
             f"front camera, {config.rounds} interleaved rounds.", "",
             "| request | median (µs) | p99 (µs) |", "|---|---|---|"]
    lines += [f"| {k} | {v['median']:.0f} | {v['p99']:.0f} |" for k, v in stats.items()]
    body = "\n".join(lines)
    console.print(body)
    if config.docs:
        update_markdown_section(config.docs, "bench_bridge", body)
    return ExperimentResult({"machine": machine(), "latency_us": stats})
