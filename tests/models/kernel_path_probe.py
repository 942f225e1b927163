"""Run by tests/models/test_kernel_paths.py in a fresh process under one kernel path (environment variables set
before torch loads): prints, as JSON, the exact sums' digest and whether the shipped models' rows agree."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import torch

from capsule_rollout.capsules import Arena
from capsule_rollout.models.exact_sums import ExactWeights, exact_linear, widens
from capsule_rollout.models.runtime import invariant_copy
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.flow_policy import load_policy
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.value_critic import load_critic
from tests.policies.tiny import random_obs

SHIPPED = "capsule_rollout/checkpoints"


def main() -> None:
    rng = np.random.default_rng(0)  # numpy's draws: torch's normal draws differ between kernel paths
    weight, bias = (torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)) for shape in ((256, 272), 256))
    x = torch.from_numpy(rng.standard_normal((8, 272), dtype=np.float32) * np.logspace(-3, 3, 8, dtype=np.float32)[:, None])
    w = ExactWeights(weight, bias)
    sums = exact_linear(x, w.t, w.bias, w.bits_in)
    digest = hashlib.sha256(sums.numpy().tobytes()).hexdigest()[:16]
    # with the float32 copy of the weights: widened where this path's kernels make that cheaper, the same bits
    same_with_copy = w.t32 is not None and torch.equal(exact_linear(x, w.t, w.bias, w.bits_in, w.t32), sums)

    policy, critic = PolicyRuntime(load_policy(f"{SHIPPED}/policy")), CriticRuntime(load_critic(f"{SHIPPED}/critic"))
    Arena([policy, critic]).allocate()
    config = policy.config
    policy.set_language("pick")
    policy.reset(7)
    critic.set_language("pick")
    chunk, value = policy.act(random_obs(config, 1)).clone(), critic.evaluate(random_obs(config, 1), step=4).clone()
    rows, judges = policy.batched(8), critic.batched(8)
    agree = []
    for where in (None, 0, 5, 7):  # every row the batch of one's inputs, then that row beside other rows
        for i in range(8):
            mine = where is None or i == where
            rows.slot(i).set_language("pick" if mine else f"place {i}")
            rows.slot(i).reset(7 if mine else 100 + i)
            rows.slot(i).load_observation(random_obs(config, 1 if mine else 50 + i))
            judges.slot(i).set_language("pick" if mine else f"place {i}")
            judges.slot(i).load_observation(random_obs(config, 1 if mine else 50 + i), step=4 if mine else i)
        chunks, values = rows.act_rows(range(8)), judges.evaluate_rows(range(8))
        at = range(8) if where is None else [where]
        agree.append(all(torch.equal(chunks[i], chunk[0]) and torch.equal(values[i], value[0]) for i in at))
    torch.manual_seed(0)
    narrow = invariant_copy(torch.nn.Sequential(torch.nn.Linear(6, 20), torch.nn.SiLU(), torch.nn.Linear(20, 20),
                                                torch.nn.Sigmoid()).eval())
    xs = torch.randn(64, 6) * 3
    with torch.no_grad():  # rows of 20 activations: a multiple of no vector width
        narrow_agree = torch.equal(narrow(xs), torch.cat([narrow(xs[i: i + 1]) for i in range(xs.shape[0])]))
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "sums": digest,
                      "rows_agree": all(agree), "one_call": rows.runtime.together and judges.runtime.together,
                      "narrow_rows_agree": narrow_agree, "widens": widens(torch.device("cpu")),
                      "same_with_copy": same_with_copy}))


if __name__ == "__main__":
    main()
