"""bench_tasks: a mix of tasks on env slots as a user runs it (`sim_rollout` processes): the mix against one family,
rows filled per batched call, start-up (against an earlier checkout), steps/s over the env alone.

The measurements are `benchmarks/tasks_mix.py`'s; this command prints them and writes its section into `--docs`.
"""

from __future__ import annotations

import dataclasses

from capsule_rollout.benchmarks.support import update_markdown_section
from capsule_rollout.benchmarks.tasks_mix import measure
from capsule_rollout.commands.bench_configs import BenchTasksConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console, measure_table
from capsule_rollout.experiments.paths import resolve_input


def run(config: BenchTasksConfig) -> ExperimentResult:
    console = make_console()
    config = dataclasses.replace(config, policy=resolve_input(config.policy), critic=resolve_input(config.critic))
    summary = measure(config, console.print)
    console.print(measure_table(f"bench_tasks ({summary['actors']} actors x {summary['slots']} slots)", _rows(summary)))
    if config.docs:
        update_markdown_section(config.docs, "bench_tasks", _markdown(summary))
    return ExperimentResult(summary)


def _rows(s: dict) -> list[tuple[str, str, str]]:
    one, n = s["one_family"], s["episodes"]
    rows = [(f"{s['family']} alone, {n} episodes: steps/s once started / with start-up",
             f"{one['steps_per_s_started']:.0f} / {one['steps_per_s']:.0f}", ""),
            (f"{s['family']} alone: rows filled per call, all / while an item waited",
             f"{one['rows_filled']:.0%} / {one['rows_filled_with_work_left']:.0%}", "")]
    for m in s["mix"]:
        calls = f"episodes per call {m['episodes_per_call']}" if m["episodes_per_call"] else "default calls"
        rows += [(f"--family all, {n} episodes ({calls}): steps/s once started / with start-up",
                  f"{m['steps_per_s_started']:.0f} / {m['steps_per_s']:.0f}", ""),
                 (f"--family all ({calls}) / {s['family']} alone, once started", f"{m['over_one_family']:.3f}x",
                  "≥ 0.9x" if m is s["mix"][0] else ""),
                 (f"--family all ({calls}) / {s['family']} alone, once started, each over its episodes' env alone "
                  "(the layout's cost, the tasks' own cost aside)", f"{m['over_one_family_per_env']:.3f}x", ""),
                 (f"--family all ({calls}): rows filled per call, all / while an item waited",
                  f"{m['rows_filled']:.0%} / {m['rows_filled_with_work_left']:.0%}",
                  "≥ 90% while an item waited" if m is s["mix"][0] else ""),
                 (f"--family all ({calls}): steps/s over the env alone (once started); the limit the models' share "
                  f"of a core ({m['models_share']:.0%}) sets",
                  f"{m['over_env_alone']:.2f} / {m['limit_over_env_alone']:.2f}", ""),
                 (f"--family all ({calls}): the driver's CPU (recording, Ray's calls) over the cores' time",
                  f"{m['driver_share']:.0%}", "")]
    if s.get("mix_before"):
        b, now = s["mix_before"], s["mix"][0]
        rows.append((f"--family all, {n} episodes, with start-up: now / the earlier checkout",
                     f"{now['steps_per_s']:.0f} / {b['steps_per_s']:.0f} steps/s ({b['now_over_before']:.2f}x)", ""))
    a = s["env_alone"]
    o = s["env_alone_one_family"]
    rows.append((f"the env alone: the mix's {a['episodes']} episodes / {s['family']}'s {o['episodes']} replayed on "
                 f"{a['processes']} processes, images every step",
                 f"{a['steps_per_s']:.0f} / {o['steps_per_s']:.0f} steps/s", ""))
    st = s["startup"]
    ph = st["now_phases"]
    rows.append(("one-seed run, process wall time: now" + (" / before" if "before_process_s" in st else ""),
                 f"{st['now_process_s']:.1f} s" + (f" / {st['before_process_s']:.1f} s ({st['before_over_now']:.2f}x)"
                                                   if "before_process_s" in st else ""), ""))
    rows.append(("one-seed run now: before the command / inputs checked and preflight / Ray's start / to the "
                 "first actor ready / its episodes back",
                 f"{ph['before_command_s']:.1f} / {ph['preflight_s']:.1f} / {ph['ray_s']:.1f} / "
                 f"{ph['to_actors_ready_s']:.1f} / {ph['to_first_episode_s']:.1f} s", ""))
    return rows


def _markdown(s: dict) -> str:
    m = s["machine"]
    lines = [f"Device: **cpu** ({m.get('cpu', '?')}, {s['cores']} cores), torch {m.get('torch', '?')}; each run a "
             f"`sim_rollout` process, {s['actors']} actors x {s['slots']} slots, the shipped policy and critic; "
             f"{s['rounds']} paired rounds, medians.", "", "| measure | value | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in _rows(s)]
    met = {k: "met" if v else "not met" for k, v in s["targets"].items()}
    lines += ["", "Targets: " + ", ".join(f"{k}: {v}" for k, v in met.items())]
    return "\n".join(lines)
