"""Task families: language instruction, subtasks with progress predicates, success.

A task instance is a small tuple of ints (`TaskParams`), so it fits a capsule
buffer and the instruction text is derived from it. Predicates read a `World`
(positions from the simulator), never the simulator itself.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from capsule_rollout.tabletop.scene import BLOCK_HALF, BLOCKS, PAD_RADIUS, PADS, SPAWN_HALF

LIFT_Z = 0.08  # a held block above this height counts as picked (m)
RELATIONS = ("left of", "right of", "in front of", "behind")
_RELATION_DIR = {"left of": (-1.0, 0.0), "right of": (1.0, 0.0), "in front of": (0.0, -1.0), "behind": (0.0, 1.0)}
RELATION_OFFSET = 0.08  # where the expert puts a block "left of" another (m)
PARAM_SLOTS = 6  # family, a, b, p, q, variant
GOAL_CLEARANCE = 0.065  # a goal spot must be this far from blocks not involved (m)


@dataclass(frozen=True)
class World:
    """What predicates see: positions (m) and what the suction cup holds."""

    ee: np.ndarray  # (3,)
    blocks: dict[str, np.ndarray]  # name -> (3,) centre
    pads: dict[str, np.ndarray]  # name -> (3,) centre
    holding: str | None


@dataclass(frozen=True)
class Goal:
    """Where a placed block must end up: on a pad, on a block, or next to a block."""

    kind: str  # "pad" | "stack" | "relation"
    ref: str  # pad or block name
    relation: str = ""

    def target_xy(self, world: World) -> np.ndarray:
        base = (world.pads if self.kind == "pad" else world.blocks)[self.ref][:2]
        if self.kind == "relation":
            return base + RELATION_OFFSET * np.asarray(_RELATION_DIR[self.relation])
        return base.copy()

    def surface_z(self, world: World) -> float:
        """Height of the surface the block rests on (m)."""
        return float(world.blocks[self.ref][2] + BLOCK_HALF) if self.kind == "stack" else 0.0

    def satisfied(self, block: str, world: World) -> bool:
        pos = world.blocks[block]
        if world.holding == block:
            return False
        if self.kind == "pad":
            on_pad = np.linalg.norm(pos[:2] - world.pads[self.ref][:2]) < PAD_RADIUS - 0.01
            return bool(on_pad and pos[2] < BLOCK_HALF + 0.01)
        ref = world.blocks[self.ref]
        if self.kind == "stack":
            dz = pos[2] - ref[2]
            return bool(np.linalg.norm(pos[:2] - ref[:2]) < 0.02 and 2 * BLOCK_HALF - 0.006 < dz < 2 * BLOCK_HALF + 0.01)
        direction = np.asarray(_RELATION_DIR[self.relation])
        offset = pos[:2] - ref[:2]
        along = float(offset @ direction)
        across = abs(float(offset @ np.array([-direction[1], direction[0]])))
        return bool(0.05 < along < 0.13 and across < 0.035 and pos[2] < BLOCK_HALF + 0.01)


@dataclass(frozen=True)
class Subtask:
    """One step of a task, with its own language; `goal` is None for a pick."""

    text: str
    block: str
    goal: Goal | None = None

    @property
    def kind(self) -> str:
        return "pick" if self.goal is None else "place"

    def done(self, world: World) -> bool:
        if self.goal is None:
            return world.holding == self.block and world.blocks[self.block][2] > LIFT_Z
        return self.goal.satisfied(self.block, world)

    def progress(self, world: World) -> float:
        """0..1, 1 exactly when `done`; rises as the subtask gets closer."""
        if self.done(world):
            return 1.0
        block = world.blocks[self.block]
        if self.goal is None:
            if world.holding == self.block:
                return 0.5 + 0.45 * min(1.0, max(0.0, block[2] / LIFT_Z))
            reach = np.linalg.norm(world.ee - (block + np.array([0, 0, BLOCK_HALF])))
            return 0.45 * max(0.0, 1.0 - reach / 0.5)
        dist = np.linalg.norm(block[:2] - self.goal.target_xy(world))
        return 0.95 * max(0.0, 1.0 - dist / 0.5)


@dataclass(frozen=True)
class TaskParams:
    """A task instance as ints: family index, blocks a/b, pads p/q, template variant."""

    family: int
    a: int = 0
    b: int = 0
    p: int = 0
    q: int = 0
    variant: int = 0

    def to_array(self) -> np.ndarray:
        return np.array([self.family, self.a, self.b, self.p, self.q, self.variant], dtype=np.int64)

    @classmethod
    def from_array(cls, arr: np.ndarray) -> TaskParams:
        return cls(*(int(x) for x in arr[:PARAM_SLOTS]))


class TaskFamily:
    """Base of a family of language-conditioned tasks."""

    name: ClassVar[str]
    max_steps: ClassVar[int]
    templates: ClassVar[tuple[str, ...]]

    def sample(self, rng: np.random.Generator, family_index: int) -> TaskParams:
        a, b = rng.choice(len(BLOCKS), size=2, replace=False)
        p, q = rng.choice(len(PADS), size=2, replace=False)
        return TaskParams(family_index, int(a), int(b), int(p), int(q), int(rng.integers(len(self.templates))))

    def fields(self, params: TaskParams) -> dict[str, str]:
        return {
            "a": BLOCKS[params.a], "b": BLOCKS[params.b], "p": PADS[params.p], "q": PADS[params.q],
            "rel": RELATIONS[params.variant % len(RELATIONS)],
        }

    def instruction(self, params: TaskParams) -> str:
        return self.templates[params.variant % len(self.templates)].format(**self.fields(params))

    def subtasks(self, params: TaskParams) -> list[Subtask]:  # pragma: no cover - abstract
        raise NotImplementedError

    def success(self, params: TaskParams, world: World) -> bool:
        return world.holding is None and all(s.done(world) for s in self.subtasks(params) if s.goal is not None)

    def feasible(self, params: TaskParams, world: World) -> bool:
        """Not already solved, and every goal inside the workspace and clear of other blocks."""
        for sub in self.subtasks(params):
            if sub.goal is None:
                continue
            xy = sub.goal.target_xy(world)
            if np.any(np.abs(xy) > SPAWN_HALF + 0.02):
                return False
            for name, pos in world.blocks.items():
                if name not in (sub.block, sub.goal.ref) and np.linalg.norm(pos[:2] - xy) < GOAL_CLEARANCE:
                    return False
        return not self.success(params, world)


class PickPlace(TaskFamily):
    name = "pick_place"
    max_steps = 80
    templates = (
        "put the {a} block on the {p} pad",
        "place the {a} block onto the {p} pad",
        "move the {a} block to the {p} pad",
    )

    def subtasks(self, params: TaskParams) -> list[Subtask]:
        f = self.fields(params)
        return [Subtask(f"pick up the {f['a']} block", f["a"]),
                Subtask(f"place it on the {f['p']} pad", f["a"], Goal("pad", f["p"]))]


class Stack(TaskFamily):
    name = "stack"
    max_steps = 80
    templates = ("stack the {a} block on the {b} block", "put the {a} block on top of the {b} block")

    def subtasks(self, params: TaskParams) -> list[Subtask]:
        f = self.fields(params)
        return [Subtask(f"pick up the {f['a']} block", f["a"]),
                Subtask(f"put it on the {f['b']} block", f["a"], Goal("stack", f["b"]))]


class Arrange(TaskFamily):
    name = "arrange"
    max_steps = 80
    templates = ("put the {a} block {rel} the {b} block",)

    def sample(self, rng: np.random.Generator, family_index: int) -> TaskParams:
        base = super().sample(rng, family_index)
        return TaskParams(family_index, base.a, base.b, base.p, base.q, int(rng.integers(len(RELATIONS))))

    def subtasks(self, params: TaskParams) -> list[Subtask]:
        f = self.fields(params)
        return [Subtask(f"pick up the {f['a']} block", f["a"]),
                Subtask(f"put it {f['rel']} the {f['b']} block", f["a"], Goal("relation", f["b"], f["rel"]))]


class Sort(TaskFamily):
    name = "sort"
    max_steps = 150
    templates = ("put the {a} block on the {p} pad and the {b} block on the {q} pad",)

    def subtasks(self, params: TaskParams) -> list[Subtask]:
        f = self.fields(params)
        return [
            Subtask(f"pick up the {f['a']} block", f["a"]),
            Subtask(f"place it on the {f['p']} pad", f["a"], Goal("pad", f["p"])),
            Subtask(f"pick up the {f['b']} block", f["b"]),
            Subtask(f"place it on the {f['q']} pad", f["b"], Goal("pad", f["q"])),
        ]


FAMILIES: tuple[TaskFamily, ...] = (PickPlace(), Stack(), Arrange(), Sort())
FAMILY_NAMES = tuple(f.name for f in FAMILIES)


def family_index(name: str) -> int:
    try:
        return FAMILY_NAMES.index(name)
    except ValueError:
        close = difflib.get_close_matches(name, FAMILY_NAMES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown task family {name!r}{hint} (known: {', '.join(FAMILY_NAMES)})") from None
