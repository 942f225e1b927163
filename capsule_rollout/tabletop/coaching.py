"""Coaching evaluation: an operator overwrites the subtask mid-episode; does the policy follow it?

At the first step of the episode's first place-on-a-pad subtask (when the planner has just published
"place it on the yellow pad"), a simulated operator coaches through the hand-off: "place it on the
purple pad instead", naming a pad that no goal of the task uses, the one farthest from every other
block. The planner does not publish again until the env's subtask changes, and the env still waits
for the original goal, so the coaching text stays the policy's subtask to the end of the episode.
An episode *follows* the coaching when it ends with the block resting on the coached pad (not held);
it *kept the plan* when the block ended on the original pad (the env's success). Beside them: how many
released the block nearer the coached pad than any other (the direction followed, precisely or not).
"""

from __future__ import annotations

import itertools

import numpy as np

from capsule_rollout.learning.closed_loop_eval import run_items
from capsule_rollout.learning.stats import wilson_interval
from capsule_rollout.robot_side.operator_input import Kind, OperatorEvent
from capsule_rollout.rollout.host_factory import build_host, make_observers
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.tabletop.phrasing import coaching_text
from capsule_rollout.tabletop.scene import PADS
from capsule_rollout.tabletop.tabletop_eval import eval_spec
from capsule_rollout.tabletop.tasks import FAMILIES, Goal, Subtask, TaskParams, family_index

COACHABLE = tuple(f.name for f in FAMILIES if any(s.goal is not None and s.goal.kind == "pad"
                                                  for s in f.subtasks(TaskParams(0))))  # goal kinds only


class PadCoach(EpisodeObserver):
    """The simulated operator (an `OperatorSource`: `poll`) and the judge (an observer: `episode_end`)."""

    name = "coaching"

    def __init__(self, split: str = "heldout") -> None:
        coaching_text("red", split)  # a clear error for an unknown split
        self.split = split  # which coaching texts it says (`tabletop.phrasing.COACHING`): the episode seed picks one
        self.env = None  # the env of the episode under way
        self.seed = 0
        self.coached: tuple[str, str, str, int] | None = None  # block, original pad, coached pad, step

    def episode_start(self, host, seed: int) -> None:
        self.bind(host.env, seed)

    def bind(self, env, seed: int) -> None:
        """Watch `env`'s episode of `seed` (reset, or about to be)."""
        self.env, self.seed, self.coached = env, seed, None

    def poll(self, step: int) -> list[OperatorEvent]:
        if self.coached is not None or self.env is None or self.env.subtask_index >= len(self.env.subtasks):
            return []
        sub = self.env.subtasks[self.env.subtask_index]
        if sub.goal is None or sub.goal.kind != "pad":
            return []
        world = self.env.world()
        used = {s.goal.ref for s in self.env.subtasks if s.goal is not None and s.goal.kind == "pad"}
        others = [b for b in world.blocks if b != sub.block]

        def clearance(pad: str) -> float:
            return min((float(np.linalg.norm(world.blocks[b][:2] - world.pads[pad][:2])) for b in others),
                       default=np.inf)

        free = [p for p in PADS if p not in used]
        if not free:
            return []
        pad = max(free, key=clearance)
        self.coached = (sub.block, sub.goal.ref, pad, step)
        return [OperatorEvent(Kind.COACH, coaching_text(pad, self.split, self.seed))]

    def close(self) -> None:
        pass

    def episode_end(self, host, result) -> None:
        if self.coached is None:
            result.extra[self.name] = {"coached": False}
            return
        block, original, pad, step = self.coached
        world = host.env.world()
        distance = {p: float(np.linalg.norm(world.blocks[block][:2] - world.pads[p][:2])) for p in world.pads}
        nearest = min(distance, key=distance.get)
        result.extra[self.name] = {
            "coached": True, "step": step, "block": block, "original_pad": original, "coached_pad": pad,
            "followed": Goal("pad", pad).satisfied(block, world),
            "kept_plan": Goal("pad", original).satisfied(block, world),
            "held_at_end": world.holding == block,
            "nearest_pad": nearest, "distance_to_coached_pad_m": distance[pad],
        }


# A coached demonstration's step limit: the coached plan (a pick and a place) took 40 steps (median), 63 at most, over
# 100 seeds of pick_place and of sort; the rest is the expert waiting above the placed block, as the policy must.
COACHED_MAX_STEPS = 80


def coached_expert(env, expert, coach: PadCoach):
    """The act callable of a coached demonstration: when `coach` speaks, the env's plan becomes the subtasks
    done so far and the coached one ("put it on the blue pad instead", the held block to the coached pad),
    and `expert` (which acts on the env's current subtask) follows it. The plan ends there, as it does for the
    policy in the coaching evaluation (where the env waits for its original goal to the end of the episode):
    after placing the block the expert lets go and rises clear of it (`ScriptedExpert.wait`). The env's own task
    is not met (its goal is the original pad), so such an episode records success False and runs to the step
    limit."""
    steps = itertools.count()

    def act():
        said = coach.poll(next(steps))
        if said:
            block, _, pad, _ = coach.coached
            i = env.subtask_index
            env.subtasks = [*env.subtasks[:i], Subtask(said[0].text, block, Goal("pad", pad))]
        return expert.act() if env.subtask_index < len(env.subtasks) else expert.wait()

    return act


def evaluate_coaching(policy: str, *, family: str, seeds: list[int], n_exec: int = 8, noise_seed: int = 0,
                      advantage: str = "checkpoint", beta: float | None = None, noise_scale: float = 1.0) -> dict:
    """Coach every episode of `family` (one with a place-on-a-pad subtask) on `seeds`, in this process;
    returns how many episodes were coached, followed the coaching, or kept to the original plan."""
    family_index(family)  # a clear error for an unknown name
    if family not in COACHABLE:
        raise ValueError(f"coaching sends a held block to another pad: family {family!r} has no place-on-a-pad "
                         f"subtask (coachable: {', '.join(COACHABLE)})")
    spec = eval_spec(policy, family=family, n_exec=n_exec, noise_seed=noise_seed, advantage=advantage, beta=beta,
                     noise_scale=noise_scale)
    coach = PadCoach()
    host = build_host(spec, observers=[*make_observers(spec), coach], operator=coach)
    reports = run_items(spec, [WorkItem(f"{family}-s{seed:07d}", seed) for seed in seeds], host=host)
    outcomes = [r.extra["coaching"] for r in reports]
    coached = [o for o in outcomes if o["coached"]]
    followed = sum(o["followed"] for o in coached)
    kept = sum(o["kept_plan"] for o in coached)
    n = len(coached)
    toward = sum(o["nearest_pad"] == o["coached_pad"] and not o["held_at_end"] for o in coached)
    return {
        "family": family, "episodes": len(outcomes), "coached": n,
        "followed": followed, "follow_rate": followed / n if n else None,
        "follow_ci95": list(wilson_interval(followed, n)) if n else None,
        "kept_plan": kept, "kept_plan_rate": kept / n if n else None,
        "neither": n - followed - kept,
        # released nearer the coached pad than any other (on it or off it): the direction followed
        "released_nearest_coached": toward, "released_nearest_coached_rate": toward / n if n else None,
        "held_at_end": sum(o["held_at_end"] for o in coached),
        "example": coaching_text("<other>"),
    }
