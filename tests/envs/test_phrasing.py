"""Subtask phrasings: every family's canonical subtask text is read back, training and held-out phrasings
are disjoint and built from the tokenizer's vocabulary, and the planner words subtasks as asked."""

import itertools

import numpy as np
import pytest

from capsule_rollout.rollout.handoff import SubtaskChannel
from capsule_rollout.rollout.planner import ScriptedPlanner
from capsule_rollout.tabletop.phrasing import COACHING, HELDOUT, TRAIN, coaching_text, parse_subtask, phrase, phrasings
from capsule_rollout.tabletop.scene import BLOCKS, PADS
from capsule_rollout.tabletop.tasks import FAMILIES, RELATIONS, TaskParams
from capsule_rollout.tabletop.tokenizer import VOCAB


def _every_subtask_text() -> set[str]:
    texts = set()
    for index, family in enumerate(FAMILIES):
        for a, b, p, q, variant in itertools.product(range(len(BLOCKS)), range(len(BLOCKS)), range(len(PADS)),
                                                     range(len(PADS)), range(len(RELATIONS))):
            texts.update(s.text for s in family.subtasks(TaskParams(index, a, b, p, q, variant)))
    return texts


def test_every_canonical_subtask_text_is_read_back_and_its_first_training_phrasing_is_itself():
    texts = _every_subtask_text()
    assert len(texts) > 20
    for text in texts:
        words = parse_subtask(text)
        assert words is not None, text
        train = phrasings(text, "train")
        assert train[0] == text
        assert len(set(train)) == len(train) == 3
        heldout = phrasings(text, "heldout")
        assert not set(heldout) & set(train), text  # held out means never seen in training
        names = [n for n in (words.block, words.ref) if n]
        for said in (*train, *heldout):
            assert all(n in said for n in names) and (words.rel in said)


def test_phrasings_use_the_tokenizers_vocabulary_only():
    known = set(VOCAB)
    for table in (TRAIN, HELDOUT):
        for templates in table.values():
            for template in templates:
                said = template.format(block="red", ref="blue", rel="left of")
                assert set(said.split()) <= known, said
    for split in COACHING:
        for index in range(len(COACHING[split])):
            said = coaching_text("orange", split, index)
            assert set(said.split()) - known == {"instead"} and "orange" in said  # the one word coaching adds


def test_the_evaluations_coaching_is_never_said_in_training():
    train = {coaching_text("blue", "train", i) for i in range(len(COACHING["train"]))}
    assert coaching_text("blue") == "place it on the blue pad instead" and coaching_text("blue") not in train
    assert len(train) == len(COACHING["train"]) > 1
    with pytest.raises(ValueError, match="split must be one of"):
        coaching_text("blue", "poetic")


def test_other_texts_are_left_alone_and_bad_requests_are_refused():
    assert parse_subtask("place it on the orange pad instead") is None
    assert phrasings("wave at the camera", "heldout") == ("wave at the camera",)
    assert phrase("pick up the red block", "canonical") == "pick up the red block"
    rng = np.random.default_rng(0)
    drawn = {phrase("pick up the red block", "train", rng) for _ in range(50)}
    assert drawn == set(phrasings("pick up the red block", "train"))
    with pytest.raises(ValueError, match="phrasing must be one of"):
        phrase("pick up the red block", "poetic")
    with pytest.raises(ValueError, match="split must be"):
        phrasings("pick up the red block", "canonical")


def test_the_planner_publishes_the_asked_phrasing_the_same_way_every_time():
    class Env:  # what the planner reads; the tabletop env words its subtasks through `phrase`
        subtask_texts = ("pick up the red block", "place it on the yellow pad")
        instruction = "put the red block on the yellow pad"
        subtask_index = 0

        def phrase(self, text, phrasing, index=0):
            return phrase(text, phrasing, index=index)

    env = Env()
    for phrasing in ("canonical", "heldout"):
        channel = SubtaskChannel()
        try:
            planner = ScriptedPlanner(channel, phrasing, env.phrase)
            planner.reset(env)
            first = channel.read().text
            planner.reset(env)
            assert channel.read().text == first
            expected = {"canonical": ("pick up the red block",),
                        "heldout": phrasings("pick up the red block", "heldout")}[phrasing]
            assert first in expected
        finally:
            channel.close()
    channel = SubtaskChannel()
    try:
        with pytest.raises(ValueError, match="phrasing must be one of"):
            ScriptedPlanner(channel, "poetic", env.phrase)
        with pytest.raises(ValueError, match="words its subtasks one way only"):
            ScriptedPlanner(channel, "heldout")  # an env without phrase()
    finally:
        channel.close()
