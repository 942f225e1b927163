"""ChunkDataset's paraphrase swap: with probability p a window's subtask tokens are one of its text's
phrasings, never another text's; without phrasings a swap is refused."""

import numpy as np
import pytest
import torch

from capsule_rollout.policies.chunk_dataset import ChunkDataset


def _data(phrasings=None, n=40):
    tokens = np.zeros((n, 4), np.int64)
    text_ids = np.arange(n) % 2  # two texts, alternating steps
    tokens[:, 0] = 1 + text_ids  # recorded tokens: [1 0 0 0] or [2 0 0 0]
    return ChunkDataset(images={"front": np.zeros((n, 4, 4, 3), np.uint8)}, states=np.zeros((n, 2), np.float32),
                        actions=np.zeros((n, 2), np.float32), tokens=tokens, episode_ends=np.array([n]),
                        chunk_length=3, phrasings=None if phrasings is None else (text_ids, phrasings))


def test_swapped_tokens_are_phrasings_of_the_steps_own_text():
    table = np.zeros((2, 3, 4), np.int64)
    table[0, :, 0] = [1, 10, 11]  # text 0: itself and two other phrasings
    table[1, :, 0] = [2, 20, 21]
    data = _data(table)
    steps = torch.arange(40)
    assert torch.equal(data.batch(steps)["tokens"], data.tokens)  # p = 0: as recorded
    swapped = data.batch(steps, paraphrase=1.0, generator=torch.Generator().manual_seed(0))["tokens"][:, 0]
    own = {0: {1, 10, 11}, 1: {2, 20, 21}}
    assert all(int(t) in own[i % 2] for i, t in enumerate(swapped))
    assert len(set(swapped.tolist())) > 2  # other phrasings do come up
    half = torch.stack([data.batch(steps, paraphrase=0.5, generator=torch.Generator().manual_seed(s))["tokens"][:, 0]
                        for s in range(20)])
    recorded = data.tokens[:, 0]
    kept = (half == recorded).float().mean().item()
    assert 0.55 < kept < 0.8  # 1 - p + p / 3 = 0.67 of the draws show the recorded text


def test_bad_phrasing_tables_and_swaps_without_one_are_refused():
    with pytest.raises(ValueError, match="paraphrase > 0 needs"):
        _data().batch(torch.arange(3), paraphrase=0.5)
    with pytest.raises(ValueError, match="must index the table"):
        _data(np.zeros((1, 3, 4), np.int64))
    with pytest.raises(ValueError, match="must cover"):
        _data(np.zeros((2, 3, 5), np.int64))
