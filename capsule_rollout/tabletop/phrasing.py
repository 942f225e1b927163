"""Other ways to say a subtask: paraphrases for training, held-out ones for evaluation, coaching texts.

A task family's subtasks have one canonical text each (`tabletop.tasks`: "pick up the red block",
"place it on the yellow pad", "put it on the green block", "put it left of the blue block").
`parse_subtask` reads a canonical text back into its parts, and `phrase` says the same subtask
another way. The phrasings come in two disjoint sets: `TRAIN` ones, which training may swap in for
the canonical text (`train_policy --paraphrase P`), and `HELDOUT` ones, which a policy never sees in
training and which `eval_policy --phrasing heldout` publishes instead of the canonical text. Every
phrasing is built from the tokenizer's vocabulary (`tabletop.tokenizer.VOCAB`).

Coaching texts (an operator sending the held block to another pad mid-episode) come in the same two
sets: `COACHING["train"]`, which coached demonstrations say (`collect_demos --coach`), and
`COACHING["heldout"]`, which the coaching evaluation says (`eval_policy --coach`) and training never
does. They add one word to the vocabulary's: "instead".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from capsule_rollout.tabletop.scene import BLOCKS, PADS
from capsule_rollout.tabletop.tasks import RELATIONS

KINDS = ("pick", "pad", "stack", "relation")

# index 0 of TRAIN is the canonical text (what `tabletop.tasks` writes)
TRAIN: dict[str, tuple[str, ...]] = {
    "pick": ("pick up the {block} block", "grasp the {block} block", "lift the {block} block"),
    "pad": ("place it on the {ref} pad", "put it on the {ref} pad", "move it to the {ref} pad"),
    "stack": ("put it on the {ref} block", "stack it on the {ref} block", "place it on top of the {ref} block"),
    "relation": ("put it {rel} the {ref} block", "place it {rel} the {ref} block", "move it {rel} the {ref} block"),
}
HELDOUT: dict[str, tuple[str, ...]] = {
    "pick": ("pick the {block} block up", "go to the {block} block and grasp it"),
    "pad": ("drop it onto the {ref} pad", "release it on the {ref} pad"),
    "stack": ("put it on top of the {ref} block", "stack it onto the {ref} block"),
    "relation": ("release it {rel} the {ref} block", "drop it {rel} the {ref} block"),
}
PHRASINGS = ("canonical", "train", "heldout")

_COLOR = "|".join(BLOCKS + PADS)
_REL = "|".join(RELATIONS)
_CANONICAL = {
    "pick": re.compile(rf"^pick up the (?P<block>{_COLOR}) block$"),
    "pad": re.compile(rf"^place it on the (?P<ref>{_COLOR}) pad$"),
    "stack": re.compile(rf"^put it on the (?P<ref>{_COLOR}) block$"),
    "relation": re.compile(rf"^put it (?P<rel>{_REL}) the (?P<ref>{_COLOR}) block$"),
}


@dataclass(frozen=True)
class SubtaskWords:
    """What a canonical subtask text says: its kind and the names it fills in."""

    kind: str
    block: str = ""  # the block to pick (kind "pick")
    ref: str = ""  # the pad or block it goes to / next to
    rel: str = ""  # the relation (kind "relation")

    def say(self, template: str) -> str:
        return template.format(block=self.block, ref=self.ref, rel=self.rel)


def parse_subtask(text: str) -> SubtaskWords | None:
    """The parts of a canonical subtask text; None for any other text (coaching, a suite's instruction)."""
    for kind, pattern in _CANONICAL.items():
        m = pattern.match(text.strip())
        if m:
            return SubtaskWords(kind, **m.groupdict())
    return None


def phrasings(text: str, split: str) -> tuple[str, ...]:
    """Every phrasing of `split` ("train": canonical first, or "heldout") of a canonical subtask text;
    a text `parse_subtask` does not read has only itself."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    words = parse_subtask(text)
    if words is None:
        return (text,)
    return tuple(words.say(t) for t in (TRAIN if split == "train" else HELDOUT)[words.kind])


def phrase(text: str, phrasing: str, rng: np.random.Generator | None = None, index: int = 0) -> str:
    """`text` said the `phrasing` way: "canonical" (unchanged), or a "train" / "heldout" phrasing
    (drawn from `rng`, else the `index`-th, cycling)."""
    if phrasing not in PHRASINGS:
        raise ValueError(f"phrasing must be one of {PHRASINGS}, got {phrasing!r}")
    if phrasing == "canonical":
        return text
    options = phrasings(text, phrasing)
    k = int(rng.integers(len(options))) if rng is not None else index % len(options)
    return options[k]


COACHING: dict[str, tuple[str, ...]] = {
    "train": ("put it on the {pad} pad instead", "move it to the {pad} pad instead"),
    "heldout": ("place it on the {pad} pad instead",),
}


def coaching_text(pad: str, split: str = "heldout", index: int = 0) -> str:
    """What an operator says to send the held block to another pad mid-episode: the `index`-th (cycling)
    coaching text of `split` ("heldout": what the coaching evaluation says; "train": coached demonstrations)."""
    if split not in COACHING:
        raise ValueError(f"split must be one of {tuple(COACHING)}, got {split!r}")
    options = COACHING[split]
    return options[index % len(options)].format(pad=pad)
