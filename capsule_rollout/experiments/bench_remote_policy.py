"""bench_remote_policy: per-chunk latency of a policy in process vs served by `serve_policy` in another process and
asked over openpi's websocket protocol on loopback (interleaved rounds; median and p99). The measurements are
`benchmarks/remote_policy.py`'s; this command prints them and writes its section into the `--docs` file."""

from __future__ import annotations

from rich.table import Table

from capsule_rollout.benchmarks.remote_policy import measure
from capsule_rollout.benchmarks.support import update_markdown_section
from capsule_rollout.commands.configs import BenchRemotePolicyConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console
from capsule_rollout.experiments.paths import resolve_input
from capsule_rollout.rollout.host_factory import HostSpec
from capsule_rollout.rollout.record import absolute_source

ROWS = (("in_process", "in process (`load_observation` + `act`)"),
        ("websocket", "over the websocket (`RemotePolicy`: encode, send, the server's checks and act, answer)"),
        ("server_infer", "of which the server's own time (openpi's `server_timing.infer_ms`)"))


def markdown(s: dict) -> str:
    m = s["machine"]
    lines = [f"Machine: {m['cpu']}, {s['cores']} cores shared with other work (load average {s['load_average']:.1f} "
             f"at the end), torch {m['torch']}, {s['threads']} torch thread(s) per side; policy `{s['policy']}` on "
             f"`{s['env']}`, chunk {s['chunk'][0]} x {s['chunk'][1]}; a request of "
             f"{s['request_bytes']:,} bytes, an answer of {s['answer_bytes']:,}; {s['rounds']} interleaved rounds.", "",
             "| per chunk | median (us) | p99 (us) |", "|---|---|---|"]
    for key, label in ROWS:
        lines.append(f"| {label} | {s['stats'][key]['median']:.0f} | {s['stats'][key]['p99']:.0f} |")
    lines += ["", f"The websocket adds {s['overhead_us']['median']:.0f} us at the median and "
              f"{s['overhead_us']['p99']:.0f} us at p99 per chunk."]
    return "\n".join(lines)


def run(config: BenchRemotePolicyConfig) -> ExperimentResult:
    console = make_console()
    spec = HostSpec(env=config.env or f"tabletop:{config.family}",
                    policy=absolute_source(resolve_input(config.policy)), threads=config.threads)
    summary = {**measure(spec, config.rounds, console.print), "policy": config.policy}
    table = Table(title="policy per chunk: in process vs over openpi's websocket (loopback)")
    for col in ("", "median us", "p99 us"):
        table.add_column(col, justify="right")
    for key, _ in ROWS:
        table.add_row(key, f"{summary['stats'][key]['median']:.0f}", f"{summary['stats'][key]['p99']:.0f}")
    console.print(table)
    if config.docs:
        update_markdown_section(config.docs, "bench_remote_policy", markdown(summary))
    return ExperimentResult(summary)
