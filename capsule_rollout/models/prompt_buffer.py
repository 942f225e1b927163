"""A text (the current subtask or instruction) kept as capsule state: UTF-8 bytes in a fixed buffer plus
their length, so a restore brings back the prompt a wrapped policy or critic was acting on."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from capsule_rollout.capsules import BufferSpec

PROMPT_BYTES = 1024  # the longest prompt a capsule holds (UTF-8); a longer one is refused, not cut


def prompt_specs(device: str = "cpu") -> list[BufferSpec]:
    return [BufferSpec("prompt", (PROMPT_BYTES,), torch.uint8, device, doc="the prompt, UTF-8, zero-padded"),
            BufferSpec("prompt_len", (1,), torch.int64, device)]


def write_prompt(buffers: Mapping[str, torch.Tensor], text: str, who: str) -> None:
    data = text.encode()
    if len(data) > PROMPT_BYTES:
        raise ValueError(f"prompt of {len(data)} bytes; {who}'s capsule holds {PROMPT_BYTES}")
    buffers["prompt"].zero_()
    if data:
        buffers["prompt"][: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffers["prompt_len"].fill_(len(data))


def read_prompt(buffers: Mapping[str, torch.Tensor]) -> str | None:
    """The prompt written last (None: none since the buffers were zeroed)."""
    n = int(buffers["prompt_len"])
    return bytes(buffers["prompt"][:n].cpu().numpy()).decode() if n else None
