"""`Tokenizer`: deterministic word-level tokens for instructions (no download).

Known words get fixed ids; any other word is hashed (crc32) into one of
`hash_buckets` ids, so coaching text never fails to encode and the same word
always maps to the same id.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

VOCAB = (
    "<pad>", "put", "place", "move", "stack", "pick", "up", "the", "a", "block", "blocks", "pad", "pads",
    "on", "onto", "to", "top", "of", "it", "and", "left", "right", "in", "front", "behind", "next",
    "red", "green", "blue", "yellow", "purple", "orange", "then", "first", "again", "slowly", "release",
    "lift", "drop", "grasp", "go", "back", "stop",
)
_WORD = re.compile(r"[a-z0-9]+")


class Tokenizer:
    """`encode(text) -> (max_tokens,) int64` ids, 0 = padding."""

    def __init__(self, *, max_tokens: int = 24, hash_buckets: int = 256, vocab: tuple[str, ...] = VOCAB) -> None:
        if vocab[0] != "<pad>":
            raise ValueError("the first vocabulary entry must be '<pad>' (id 0)")
        self.vocab = vocab
        self.max_tokens = max_tokens
        self.hash_buckets = hash_buckets
        self._ids = {w: i for i, w in enumerate(vocab)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) + self.hash_buckets

    def word_id(self, word: str) -> int:
        known = self._ids.get(word)
        if known is not None:
            return known
        return len(self.vocab) + zlib.crc32(word.encode()) % self.hash_buckets

    def encode(self, text: str) -> np.ndarray:
        words = _WORD.findall(text.lower())[: self.max_tokens]
        out = np.zeros(self.max_tokens, dtype=np.int64)
        out[: len(words)] = [self.word_id(w) for w in words]
        return out

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.encode(t) for t in texts]) if texts else np.zeros((0, self.max_tokens), np.int64)

    def to_json(self) -> dict:
        return {"max_tokens": self.max_tokens, "hash_buckets": self.hash_buckets, "vocab": list(self.vocab)}

    @classmethod
    def from_json(cls, data: dict) -> Tokenizer:
        return cls(max_tokens=data["max_tokens"], hash_buckets=data["hash_buckets"], vocab=tuple(data["vocab"]))
