"""recap: the RECAP loop in sim, measured on fixed held-out seeds every iteration.

Iteration 0: behaviour cloning on mixed-quality demonstrations (the noisy expert).
Iteration k >= 1:
  1. collect rollouts with policy k-1 (acting with the positive indicator) and
     critic k-1; a simulated operator takes over with the scripted expert when the
     chunk's value drops (`ValueTakeover`), and those steps are flagged;
  2. with `--advantage_source branches|distilled|combined`, branch values at sampled
     chunks of those rollouts (capsule forks on the actor pool, `learning.branch_values`;
     `--branch_select unsure`: the chunks whose critic label is least sure; `open`: more
     continuations where a cheap screening pass's disagree);
  3. train critic k on everything collected so far (`distilled`: with the branch
     values as its targets where they exist);
  4. label advantages as a sidecar next to the store: N-step from critic k
     (`critic`, `distilled`) or, `branches`, the branched chunks' value after minus
     before (other steps unlabelled), or, `combined`, critic k's with the branched
     chunks' in their place; per-task threshold, interventions positive;
  5. fine-tune policy k from policy k-1 on everything, conditioned on the labels
     (indicator dropout keeps it unconditional too);
  6. with `--betas`, choose the guidance weight (or none) on a separate block of
     selection seeds; evaluate policy k with the positive indicator (and that
     weight) on the held-out seeds, and
     critic k's failure AUC from its values at the mid-episode step (half the
     episode limit, the same step for every episode) on those evaluation episodes.
Control arm (`--control`): the same number of fine-tuning steps on the same data,
without labels, from the previous control policy; evaluated on the same seeds and
compared seed by seed (exact McNemar test), so a gain can be told apart from what
more training on more data gives by itself.
The loop knows no policy family: how demonstrations are collected, how the policy and critic are trained,
what env is played and how an evaluation is judged come from a recipe (`learning.recap_recipe`, `--recipe`; the
example's is `tabletop.tabletop_recipe.TabletopRecipe`, the default).
JSON per iteration: success rate with a 95% interval, mean steps to success,
successes per hour of simulated time, interventions per rollout episode, the
critic's failure AUC, the guidance choice, the control arm, and the control steps
simulated to collect the iteration's data (rollouts, branches).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from capsule_rollout.critics.advantage import INDICATOR_POSITIVE
from capsule_rollout.learning.advantage_labels import label_store
from capsule_rollout.learning.branch_values import BranchPlan, branches_path, collect_branches, label_store_from_branches
from capsule_rollout.learning.options import LabelAdvantagesConfig, RecapConfig
from capsule_rollout.learning.recap_recipe import RecapRecipe, load_recipe
from capsule_rollout.learning.stats import failure_auc_summary, mid_episode_value, paired_comparison
from capsule_rollout.learning.training import Log
from capsule_rollout.models.checkpoint import update_info
from capsule_rollout.policies.conditioning import CONDITIONING_INFO, Conditioning
from capsule_rollout.rollout.host_factory import ACTING_INFO, RunSpec
from capsule_rollout.rollout.ray_rollout import init_ray, run_rollouts, shutdown_ray
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.stores.episode_schema import IMAGE_PREFIX
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.zarr_recorder import ZarrRecorder


def _rollouts(config: RecapConfig, recipe: RecapRecipe, policy_dir: Path, critic_dir: Path, store: Path, k: int,
              beta: float | None) -> tuple[dict, RunSpec, list[str]]:
    """Iteration k's rollouts on the actor pool: policy k-1 acting with the positive indicator, critic k-1
    triggering the simulated operator's takeovers; each episode recorded once (a resumed run skips what
    the store holds). Returns their summary, the spec that played them and their ids."""
    spec = dataclasses.replace(recipe.rollout_spec(config), policy=str(policy_dir), critic=str(critic_dir),
                               advantage="positive", beta=beta, host=HostConfig(n_exec=config.n_exec, noise_seed=k),
                               takeover=(config.takeover_threshold, config.takeover_steps), slots=config.slots)
    first = config.rollout_first_seed(k)
    items = [WorkItem(f"recap{k}-{config.family}-s{seed:07d}", seed)
             for seed in range(first, first + config.rollout_episodes)]
    with ZarrRecorder(store) as recorder:
        todo = [it for it in items if it.episode_id not in recorder]  # a resumed run: recorded before it stopped
        _, stats = run_rollouts(spec, todo, actors=config.actors, recorder=recorder)
    if stats.gave_up:  # the driver raises nothing for what happens to actors: an iteration cannot go on without them
        raise RuntimeError(f"iteration {k}'s rollouts gave up: {stats.gave_up}")
    ids = [it.episode_id for it in items]
    return _rollout_summary(store, ids, recipe.episode_limit(config) // 2), spec, ids


def _rollout_summary(store: Path, ids: list[str], at_step: int) -> dict:
    """Success, takeovers and the online critic's failure AUC over the iteration's recorded rollouts
    (read back from the store, so a resumed iteration reports the episodes recorded before it stopped)."""
    reader = open_episode_reader(store)
    wanted = set(ids)
    episodes = successes = interventions = steps = 0
    mids: list[tuple[float, bool]] = []
    for index, episode_id in enumerate(reader.episode_ids):
        if episode_id not in wanted:
            continue
        episode = reader.episode(index, ["intervention", "value"])
        episodes += 1
        steps += episode.meta.length
        successes += int(episode.meta.success)
        flags = np.asarray(episode.steps["intervention"], bool)
        mid = mid_episode_value(np.asarray(episode.steps["value"]), at_step)
        if mid is not None and not flags.any():  # a takeover changes the outcome the value predicted
            mids.append((mid, bool(episode.meta.success)))
        interventions += int(flags[:1].sum()) + int(np.sum(flags[1:] & ~flags[:-1]))  # takeovers started
    return {"rollout_episodes": episodes, "rollout_steps": steps,
            "rollout_success_rate": successes / episodes if episodes else 0.0,
            "interventions_per_episode": interventions / episodes if episodes else 0.0,
            # the critic that ran online (k-1) never saw these episodes: an out-of-sample figure,
            # over the episodes nobody took over
            "critic_failure_auc_rollouts": failure_auc_summary(mids)}


def resumable_store(config: RecapConfig, recipe: RecapRecipe) -> tuple[Path, tuple[str, ...]]:
    """The run's store (made), and the cameras it records; a resumed run's store must record every camera
    this run's models see (ValueError otherwise)."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    store = out / "episodes.zarr"
    cameras = recipe.cameras(config)
    if store.exists() and len(reader := open_episode_reader(store)):  # a resumed run: same cameras?
        missing = [c for c in cameras if f"{IMAGE_PREFIX}{c}" not in reader.keys]
        if missing:
            raise ValueError(f"{store} records no images of camera(s) {missing}, which this run's models see "
                             "(--critic_cameras): start a new --out, or keep the cameras that run had")
    return store, cameras


def recap_loop(config: RecapConfig, log: Log = print, report: Callable[[dict], None] | None = None,
               recipe: RecapRecipe | None = None) -> dict:
    """The RECAP loop of `config` (see the module docstring) with `recipe` (default: `load_recipe(config.recipe)`);
    `report(iteration)` is called as each one ends. Returns the summary (every iteration's figures)."""
    recipe = load_recipe(config.recipe) if recipe is None else recipe
    store, cameras = resumable_store(config, recipe)
    out = store.parent
    seeds, select = list(config.eval.range), list(config.select.range)
    demos = recipe.collect_demos(config, store, cameras)
    log(f"{config.demo_episodes} demonstrations ({demos['skipped_already_recorded']} already recorded) "
        f"-> {store}")
    timing = {"rollouts_s": 0.0, "branches_s": 0.0, "training_s": 0.0, "evaluation_s": 0.0}
    where = init_ray() if config.actors else ""
    try:
        return _loop(config, recipe, log, report or (lambda it: None), out, store, seeds, select, timing)
    finally:
        if where:
            shutdown_ray(where)


def _loop(config: RecapConfig, recipe: RecapRecipe, log: Log, report: Callable[[dict], None], out: Path, store: Path,
          seeds: list[int], select: list[int], timing: dict) -> dict:
    loop = _Loop(config, recipe, log, out, store, seeds, select, timing)
    log(f"[bold]iteration 0[/bold]: behaviour cloning on {config.demo_episodes} noisy demos")
    iterations = [loop.behaviour_cloning()]
    report(iterations[-1])
    for k in range(1, config.iterations + 1):
        log(f"[bold]iteration {k}[/bold]: rollouts, critic, advantage labels, conditioned policy")
        iterations.append(loop.iteration(k))
        report(iterations[-1])
    summary = {"family": config.family, "seed": config.seed, "eval_seeds": [seeds[0], seeds[-1]],
               "advantage_source": config.advantage_source,
               "iterations": iterations, "actors": config.actors,
               "gain_points": 100 * (iterations[-1]["success_rate"] - iterations[0]["success_rate"]),
               # the other yardstick: successes per hour of simulated time, last iteration / BC
               "successes_per_sim_hour_ratio": (iterations[-1]["successes_per_sim_hour"] /
                                                iterations[0]["successes_per_sim_hour"]
                                                if iterations[0]["successes_per_sim_hour"] else None),
               "store": str(store)}
    if config.control and config.iterations:
        last = iterations[-1]
        summary["gain_over_control_points"] = 100 * (last["success_rate"] - last["control"]["success_rate"])
    return summary


class _Loop:
    """The loop's state from one iteration to the next (the policy, its critic, the guidance weight, the control
    policy) and its steps, each timed into `timing`."""

    def __init__(self, config: RecapConfig, recipe: RecapRecipe, log: Log, out: Path, store: Path, seeds: list[int],
                 select: list[int], timing: dict) -> None:
        self.config, self.recipe, self.log, self.out, self.store = config, recipe, log, out, store
        self.seeds, self.select, self.timing = seeds, select, timing
        self.beta: float | None = None  # the BC policy never saw the indicator: it acts unguided
        self.policy_dir = self.control_dir = out / "policy_0"
        self.critic_dir: Path | None = None

    def critic_for(self, k: int, branch_values: str = "") -> Path:
        path = self.out / f"critic_{k}"
        t0 = time.perf_counter()
        self.recipe.fit_critic(self.config, self.store, path, branch_values=branch_values, log=self.log)
        self.timing["training_s"] += time.perf_counter() - t0
        return path

    def fit(self, out: Path, steps: int, init: Path | None = None, advantage_labels: Path | None = None) -> None:
        t0 = time.perf_counter()
        self.recipe.fit_policy(self.config, self.store, out, steps=steps, init=init, advantage_labels=advantage_labels,
                               log=self.log)
        self.timing["training_s"] += time.perf_counter() - t0

    def evaluate(self, policy_dir: Path, conditioned: bool, critic_dir: Path | None = None,
                 beta: float | None = None, on: list[int] | None = None) -> dict:
        t0 = time.perf_counter()
        result = self.recipe.evaluate(self.config, policy_dir, self.seeds if on is None else on,
                                      conditioned=conditioned, beta=beta if conditioned else None, critic=critic_dir)
        self.timing["evaluation_s"] += time.perf_counter() - t0
        return result

    def choose_beta(self, policy_dir: Path) -> tuple[float | None, dict | None]:
        """The guidance weight the conditioned policy acts with: `--beta`, or the best of the positive
        indicator alone and each of `--betas` on the selection seeds (ties: the weaker guidance)."""
        config, select = self.config, self.select
        if not config.betas:
            return config.beta, None
        trials = []
        for beta in (None, *sorted(config.betas)):
            r = self.evaluate(policy_dir, True, beta=beta, on=select)
            trials.append({"beta": beta, "successes": r["successes"], "success_rate": r["success_rate"]})
            self.log(f"  guidance {'off (indicator alone)' if beta is None else f'beta {beta:g}'}: "
                     f"{r['successes']}/{r['episodes']} on the selection seeds")
        best = max(trials, key=lambda t: t["successes"])  # the first maximum: trials go from weak to strong
        return best["beta"], {"beta": best["beta"], "select_seeds": [select[0], select[-1]], "trials": trials}

    def behaviour_cloning(self) -> dict:
        """Iteration 0: the policy cloned from the demonstrations, its critic, both evaluated."""
        self.fit(self.policy_dir, self.config.bc_steps)
        self.critic_dir = self.critic_for(0)
        result = self.evaluate(self.policy_dir, False, self.critic_dir)
        return {"iteration": 0, **_metrics(result), "interventions_per_episode": 0.0,
                "policy": str(self.policy_dir), "critic": str(self.critic_dir)}

    def labels(self, branched: dict | None) -> tuple[str, np.ndarray, float]:
        """The advantage labels of the store's steps, from the critic, the branch values or both: (the sidecar
        file, the indicator of each step, the fraction of steps labelled)."""
        config, store = self.config, self.store
        labels = None
        if config.advantage_source != "branches":
            labels = label_store(self.recipe.store_critic(self.critic_dir), str(store), n=config.n,
                                 max_steps=LabelAdvantagesConfig.max_steps,
                                 positive_fraction=config.positive_fraction, critic_name=str(self.critic_dir))
            sidecar, indicator, labelled = labels.sidecar, labels.labels.indicator, 1.0
        if config.advantage_source in ("branches", "combined"):
            sidecar, from_branches = label_store_from_branches(str(store), branched["table"], critic=labels,
                                                              positive_fraction=config.positive_fraction)
            indicator, labelled = from_branches.indicator, from_branches.labelled_fraction
            branched["branch_fraction"] = from_branches.branch_fraction  # steps labelled from branch values
        return sidecar, indicator, labelled

    def iteration(self, k: int) -> dict:
        """Iteration k: rollouts of the current policy, branch values, the critic, advantage labels, the
        conditioned policy and its guidance weight, evaluated (and the control policy, when asked for)."""
        config, timing = self.config, self.timing
        started, before = time.perf_counter(), dict(timing)
        t0 = time.perf_counter()
        rollouts, spec, ids = _rollouts(config, self.recipe, self.policy_dir, self.critic_dir, self.store, k, self.beta)
        timing["rollouts_s"] += time.perf_counter() - t0
        branched = (_branch(config, spec, self.store, ids, timing, self.log)
                    if config.advantage_source != "critic" else None)
        distil = config.advantage_source == "distilled"
        self.critic_dir = self.critic_for(k, branch_values=str(branches_path(self.store)) if distil else "")
        sidecar, indicator, labelled = self.labels(branched)
        new_policy = self.out / f"policy_{k}"
        self.fit(new_policy, config.policy_steps, init=self.policy_dir, advantage_labels=Path(sidecar))
        self.policy_dir = policy_dir = new_policy
        beta, guidance = self.choose_beta(policy_dir)
        self.beta = beta
        # the checkpoint records how it acts: sim_rollout, eval_policy and real_recap run it so by default
        update_info(policy_dir, **{CONDITIONING_INFO: Conditioning("positive", beta).to_json(),
                                   ACTING_INFO: {"n_exec": config.n_exec}})
        result = self.evaluate(policy_dir, True, self.critic_dir, beta=beta)
        it = {"iteration": k, **_metrics(result), "beta": beta, **rollouts, "policy": str(policy_dir),
              "critic": str(self.critic_dir), "advantage_source": config.advantage_source,
              "positive_fraction": float(np.mean(indicator == INDICATOR_POSITIVE)), "labelled_fraction": labelled,
              "simulated_steps": {"rollouts": rollouts["rollout_steps"],
                                  "branches": branched["steps"] if branched else 0}}
        if branched:
            it["branching"] = {key: v for key, v in branched.items() if key != "table"}
        if guidance is not None:
            # the indicator alone on the held-out seeds too, whatever was chosen: how much guidance adds
            alone = result if beta is None else self.evaluate(policy_dir, True)
            it["guidance"] = {**guidance, "indicator_alone": _metrics(alone),
                              "paired": paired_comparison(result["success_by_seed"], alone["success_by_seed"])}
        if config.control:
            it["control"] = self.control(k, result)
        it["wall_s"] = {"iteration": time.perf_counter() - started, "actors": config.actors,
                        **{key: timing[key] - before[key] for key in timing}}
        return it

    def control(self, k: int, result: dict) -> dict:
        """Same data, same steps, no labels: what more training on more data gives by itself."""
        new_control = self.out / f"control_{k}"
        self.fit(new_control, self.config.policy_steps, init=self.control_dir)
        self.control_dir = new_control
        control = self.evaluate(self.control_dir, False)
        return {**_metrics(control), "policy": str(self.control_dir),
                "paired": paired_comparison(result["success_by_seed"], control["success_by_seed"])}


def _branch(config: RecapConfig, spec: RunSpec, store: Path, ids: list[str], timing: dict, log: Log) -> dict:
    """Branch values at sampled chunks of the iteration's rollouts (`ids`), played by hosts built from the
    `spec` that recorded them; what it cost in control steps (a resumed run counts what it played before)."""
    t0 = time.perf_counter()
    plan = BranchPlan(rate=config.branch_rate, branches=config.branches, seed=config.seed,
                      select=config.branch_select, positive_fraction=config.positive_fraction,
                      screen=config.branch_screen)
    table = collect_branches(spec, store, ids, plan, max_steps=LabelAdvantagesConfig.max_steps,
                             actors=config.actors, log=log)
    timing["branches_s"] += time.perf_counter() - t0
    wanted = set(ids)
    out = {"table": table, "steps": sum(n for e, n in table.done.items() if e in wanted),
           "boundaries": sum(e in wanted for e in table.episode_ids),
           "episodes_branched": sum(1 for e in ids if table.done.get(e)), "rate": plan.rate,
           "branches": plan.branches, "select": plan.select}
    if table.screen is not None:  # `open`: the screening pass's boundaries, and those of the open chunks
        out.update(screen=plan.screen, screened_boundaries=sum(e in wanted for e in table.screen.episode_ids))
    return out


def _metrics(result: dict) -> dict:
    metrics = {"success_rate": result["success_rate"], "ci95": result["ci95"],
               "mean_steps_to_success": result["mean_steps_to_success"], "eval_episodes": result["episodes"],
               "successes_per_sim_hour": result["successes_per_sim_hour"],
               "success_by_seed": result["success_by_seed"]}
    if "critic_failure_auc" in result:  # the iteration's critic on these held-out episodes (it never saw them)
        metrics["critic_failure_auc_eval"] = result["critic_failure_auc"]
        metrics["phase_alone_failure_auc_eval"] = result["phase_alone_failure_auc"]  # what the phase alone gives
        metrics["critic_phases_eval"] = result["critic_phases"]
        if result.get("critic_failure_auc_state_only"):  # a plan critic: the AUC above is with the chunk
            metrics["critic_failure_auc_state_only_eval"] = result["critic_failure_auc_state_only"][0]
    return metrics
