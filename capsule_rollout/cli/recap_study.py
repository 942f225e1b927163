"""recap_study: RECAP's yardstick measured over run seeds and arms, one resumable stage at a time.

For each run seed: `base` (`recap --iterations 0`: the seed's demonstrations, behaviour cloning, critic 0 and
the BC policy's evaluation on the held-out seeds), then each arm in a copy of `base` (the arm's options on top
of `--recap`; its control arm included) resumed one iteration at a time, the arms side by side (iteration 1 of
every arm, then iteration 2...), then the branch ceiling of each arm's last policy with its last critic on the
held-out seeds (`value_ceiling`). The arms of a seed share its BC, critic 0 and so the first iteration's
rollouts: at iteration 1 they differ only in what the arm changes (how the labels are made, how many rollouts,
how many fine-tuning steps).

Every stage resumes where it stopped (a `recap` run resumes its store and checkpoints); a stage that finished
leaves `<stage>.json` in its run directory and a copy under `--history` (per seed and arm, every iteration's
figures and per-seed outcomes), so a lost run costs a stage and the yardstick accumulates in the repository;
the yardstick's table over everything `--history` holds is written beside it (`yardstick.md`, `learning.yardstick`),
with what a smaller or larger evaluation would have told from the critic arm's measured pairs (power, width, wall).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.recap_report import report_iteration
from capsule_rollout.commands.configs import RecapStudyConfig, ValueCeilingConfig
from capsule_rollout.commands.registry import get as get_command
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.learning.options import Models, RecapConfig, Seeds
from capsule_rollout.learning.recap_loop import recap_loop
from capsule_rollout.learning.yardstick import evaluation_sizes_markdown, load_history, markdown

ARMS: dict[str, Callable[[RecapConfig], dict]] = {  # what each arm changes in the study's `recap` run
    "critic": lambda recap: {},  # labels from the learned critic (`recap`'s default source)
    # a critic that also reads the sim's object and gripper poses
    "privileged": lambda recap: {"critic_privileged": True},
    # 4x the rollouts per iteration (at iteration 1 the first quarter are the critic arm's: the same seeds, policy
    # and critic); compared with the critic arm seed by seed, no control arm of its own
    "rollouts_x4": lambda recap: {"rollout_episodes": 4 * recap.rollout_episodes, "control": False},
    # 3x (a third of) the fine-tuning steps per iteration (at iteration 1 the critic arm's rollouts, critic and
    # labels: only the fine-tuning differs); compared with the critic arm seed by seed, no control arm of its own
    "finetune_x3": lambda recap: {"policy_steps": 3 * recap.policy_steps, "control": False},
    "finetune_third": lambda recap: {"policy_steps": max(1, recap.policy_steps // 3), "control": False},
}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def _done(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def run(config: RecapStudyConfig) -> ExperimentResult:
    console = make_console()
    root = Path(config.root).expanduser().resolve()
    history = Path(config.history)
    summary: dict = {"root": str(root), "seeds": {}}
    for seed in config.seeds if config.run else ():
        seed_dir = root / f"s{seed}"
        base_dir = seed_dir / "base"
        stages = summary["seeds"][seed] = {}
        base = _done(base_dir / "base.json")
        if base is None:
            console.print(f"[bold]seed {seed}: base[/bold] (demonstrations, behaviour cloning, critic 0) -> {base_dir}")
            base = _recap(console, dataclasses.replace(config.recap, out=str(base_dir), seed=seed, iterations=0))
            _write(base_dir / "base.json", base)
        _write(history / f"s{seed}_base.json", base)
        stages["base"] = base["iterations"][0]["success_rate"]
        arm_dirs = {arm: _arm_dir(base_dir, seed_dir / arm) for arm in config.arms}
        last = config.recap.iterations
        for k in range(1, last + 1):  # the arms side by side, an iteration at a time: each seed's pairs come early
            for arm, arm_dir in arm_dirs.items():
                if _done(arm_dir / "arm.json") or k in _kept(arm_dir):
                    continue
                console.print(f"[bold]seed {seed}: arm {arm}[/bold], iteration {k} of {last} -> {arm_dir}")
                recap = dataclasses.replace(config.recap, out=str(arm_dir), seed=seed, iterations=k,
                                            **ARMS[arm](config.recap))
                result = _recap(console, recap, lambda it, d=arm_dir, s=seed, a=arm, o=ARMS[arm](config.recap):
                                _keep(d, history, s, a, o, it))
                if k == last:
                    result.update(arm=arm, arm_options=ARMS[arm](config.recap),
                                  iterations=[_kept(arm_dir)[i] for i in range(k + 1)])
                    _write(arm_dir / "arm.json", result)
        for arm, arm_dir in arm_dirs.items():
            result = _done(arm_dir / "arm.json")
            if result is None:  # no iteration to play (--recap.iterations 0)
                continue
            _write(history / f"s{seed}_{arm}.json", result)
            stages[arm] = [it["success_rate"] for it in result["iterations"]]
            if config.ceiling_branches:
                ceiling = _done(arm_dir / "ceiling.json")
                if ceiling is None:
                    console.print(f"[bold]seed {seed}: arm {arm}: the branch ceiling[/bold] of its last policy")
                    final = result["iterations"][-1]
                    ceiling = _ceiling(config, final["policy"], final["critic"])
                    _write(arm_dir / "ceiling.json", ceiling)
                _write(history / f"s{seed}_{arm}_ceiling.json", ceiling)
    if history.is_dir():  # every seed and arm the history holds, this run's and earlier ones'
        arms = load_history(history)
        table = markdown(arms)
        sizes = evaluation_sizes_markdown(arms)  # how the evaluation's size trades power against wall time
        (history / "yardstick.md").write_text(f"{table}\n\n{sizes}\n")
        console.print(table)
        summary["table"] = table
    return ExperimentResult(summary)


def _arm_dir(base_dir: Path, arm_dir: Path) -> Path:
    """The arm's run directory: a copy of the seed's base (its demonstrations, BC, critic 0 and store), made once."""
    if not arm_dir.exists():
        copying = arm_dir.with_name(arm_dir.name + ".copying")
        shutil.copytree(base_dir, copying, symlinks=True, dirs_exist_ok=True)  # a store's commit links stay links
        copying.rename(arm_dir)
    return arm_dir


def _kept(arm_dir: Path) -> dict[int, dict]:
    """The arm's iterations as first measured (`iterations.json`), by number."""
    return {it["iteration"]: it for it in (_done(arm_dir / "iterations.json") or {}).get("iterations", [])}


def _keep(arm_dir: Path, history: Path, seed: int, arm: str, options: dict, iteration: dict) -> None:
    """Keep an iteration's figures as first measured: a later run of the arm resumes through the iterations
    before its own (their evaluations played again, their training done), and says whether the held-out
    outcomes came out the same (`replayed_same`) but keeps the first wall times. The arm's history file is
    written with every iteration so far (a stopped arm keeps what it measured)."""
    kept = _kept(arm_dir)
    k = iteration["iteration"]
    if k in kept:
        first = kept[k]
        first["replayed_same"] = first.get("replayed_same", True) and (
            first["success_by_seed"] == iteration["success_by_seed"]
            and first.get("control", {}).get("success_by_seed") == iteration.get("control", {}).get("success_by_seed"))
    else:
        kept[k] = iteration
    its = [kept[i] for i in sorted(kept)]
    _write(arm_dir / "iterations.json", {"iterations": its})
    if not _done(arm_dir / "arm.json"):
        _write(history / f"s{seed}_{arm}.json", {"seed": seed, "arm": arm, "arm_options": options,
                                                 "complete": False, "iterations": its})


def _recap(console, recap: RecapConfig, report=None) -> dict:
    t0 = time.perf_counter()

    def reported(it: dict) -> None:
        report_iteration(console, it)
        if report is not None:
            report(it)

    summary = recap_loop(recap, log=console.print, report=reported)
    summary["complete"] = True
    summary["wall_s_this_run"] = time.perf_counter() - t0  # a resumed stage: the part played in this run
    summary["config"] = dataclasses.asdict(recap)
    return summary


def _ceiling(config: RecapStudyConfig, policy: str, critic: str) -> dict:
    ceiling = ValueCeilingConfig(model=Models(policy=policy, critic=critic), family=config.recap.family,
                                 seeds=Seeds(first=config.recap.eval.first, count=config.recap.eval.count),
                                 branches=config.ceiling_branches, slots=config.recap.slots)
    result = get_command("value_ceiling").load_runner()(ceiling)  # the command, run by its name
    if result.exit_code:
        raise SystemExit(f"error: the branch ceiling of {policy} failed: {result.summary.get('error')}")
    return result.summary
