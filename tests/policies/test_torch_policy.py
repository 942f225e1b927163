"""`TorchPolicy`: a user's torch module as a rollout policy, its noise as capsule state, its checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import Arena, restore, snapshot
from capsule_rollout.policies.rollout_policy import PolicySpec, RolloutPolicy
from capsule_rollout.policies.state_mlp import StateMLP
from capsule_rollout.policies.torch_policy import TorchPolicy, is_torch_policy, load_torch_policy, save_torch_policy


class NoisyLinear(torch.nn.Module):
    """A user's network: state and an image in, a chunk out, with the wrapper's noise added."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(5 + 3, 4 * 2)

    def forward(self, inputs, noise):
        img = inputs["image_cam"].float().mean(dim=(1, 2)) / 255
        return self.lin(torch.cat([inputs["state"], img], 1)).view(1, 4, 2) + 0.1 * noise


SPEC = PolicySpec(4, 2, ("state", "image_cam"))
SHAPES = {"state": ((5,), "float32"), "image_cam": ((8, 8, 3), "uint8")}


def _obs(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {"state": rng.normal(size=5).astype(np.float32),
            "image_cam": rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)}


def test_noise_is_capsule_state():
    torch.manual_seed(0)
    policy = TorchPolicy(NoisyLinear(), SPEC, SHAPES)
    assert isinstance(policy, RolloutPolicy)
    arena = Arena([policy]).allocate()
    policy.reset(7)
    policy.load_observation(_obs(0))
    capsule = snapshot(arena)
    first = [policy.act().clone() for _ in range(3)]
    assert not torch.equal(first[0], first[1])  # fresh noise every chunk
    restore(arena, capsule)
    again = [policy.act().clone() for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    policy.reset(8)
    policy.load_observation(_obs(0))
    assert not torch.equal(policy.act(), first[0])


def test_bad_observation_refused_before_copy():
    policy = TorchPolicy(NoisyLinear(), SPEC, SHAPES)
    Arena([policy]).allocate()
    policy.load_observation(_obs(1))
    before = policy.buffers["in_state"].clone()
    with pytest.raises(ValueError, match="image_cam"):
        policy.load_observation({"state": _obs(2)["state"], "image_cam": np.zeros((8, 8, 3), np.float32)})
    with pytest.raises(ValueError, match="lacks 'image_cam'"):
        policy.load_observation({"state": _obs(2)["state"]})
    assert torch.equal(policy.buffers["in_state"], before)


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(1)
    module = StateMLP(5, 2, 4, hidden=16)
    module.set_normalization(torch.randn(100, 5) * 3 + 1)
    save_torch_policy(tmp_path, module, factory="capsule_rollout.policies.state_mlp:StateMLP",
                      kwargs={"state_dim": 5, "action_dim": 2, "chunk_length": 4, "hidden": 16},
                      spec=PolicySpec(4, 2, ("state",)), shapes={"state": ((5,), "float32")})
    assert is_torch_policy(tmp_path)
    a = TorchPolicy(module, PolicySpec(4, 2, ("state",)), {"state": ((5,), "float32")})
    b = load_torch_policy(tmp_path)
    assert a.fingerprint() == b.fingerprint()
    for p in (a, b):
        Arena([p]).allocate()
        p.load_observation({"state": _obs(3)["state"]})
    assert torch.equal(a.act(), b.act())


class RowwiseLinear(NoisyLinear):
    """The same network, for any batch size (its rows independent): it says so."""

    batches = True

    def forward(self, inputs, noise):
        img = inputs["image_cam"].float().mean(dim=(1, 2)) / 255
        return self.lin(torch.cat([inputs["state"], img], 1)).view(-1, 4, 2) + 0.1 * noise


def test_a_module_that_batches_serves_every_slot_in_one_call_and_a_slot_capsule_is_a_one_slot_capsule():
    torch.manual_seed(0)
    one = TorchPolicy(RowwiseLinear(), SPEC, SHAPES)
    assert one.batches and not TorchPolicy(NoisyLinear(), SPEC, SHAPES).batches
    Arena([one]).allocate()
    rows = one.batched(4)
    calls = []
    rows.template.module.register_forward_hook(lambda m, args, out: calls.append(out.shape[0]))

    def act(where: int, others: int) -> torch.Tensor:
        for i in range(4):
            rows.slot(i).reset(7 if i == where else others + i)
            rows.slot(i).load_observation(_obs(1 if i == where else others + 10 * i))
        return rows.act_rows(range(4))[where].clone()

    first = act(0, 100)
    assert torch.equal(act(3, 200), first) and calls == [4, 4]  # the same in any row, beside anything; one call
    one.reset(7)
    one.load_observation(_obs(1))
    assert torch.allclose(one.act(), first, atol=1e-6)  # a batch of one: the same but for rounding
    slot = rows.slot(3)
    capsule = snapshot(Arena([slot]).allocate(), step=0, force=True)  # slot 3: seed 7, one chunk drawn
    module = RowwiseLinear()
    module.load_state_dict(one.module.state_dict())
    alone = TorchPolicy(module, SPEC, SHAPES)
    arena = Arena([alone]).allocate()
    restore(arena, capsule)  # a one-slot policy takes the slot's capsule (same buffers, same fingerprint)
    assert alone.buffers["rng"].tolist() == [7, 1]
    with pytest.raises(ValueError, match="batches=False"):
        TorchPolicy(NoisyLinear(), SPEC, SHAPES).batched(2)
