"""Rows of the flow policy and the value critic (`tabletop.model_rows`): each row's result is the same whatever row
it is in and whatever the other rows hold; a row's noise stream is `normal_`'s; only rows that act move on."""

from __future__ import annotations

import pytest
import torch

from capsule_rollout.capsules import Arena
from capsule_rollout.models.counter_rng import normal_, normal_rows_
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.flow_policy import load_policy
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.value_critic import load_critic
from tests.policies.tiny import random_obs, tiny_critic, tiny_policy

SHIPPED = "capsule_rollout/checkpoints"


def test_each_row_draws_the_noise_normal_draws_for_its_state_and_only_active_rows_move_on():
    state = torch.tensor([[5, 3], [7, 0], [123456789, 42]])
    out, index = torch.empty(3, 20), torch.arange(20)
    normal_rows_(state, out, index, torch.tensor([1, 0, 1]))
    for row, (seed, counter) in enumerate([(5, 3), (7, 0), (123456789, 42)]):
        alone = torch.empty(20)
        normal_(torch.tensor([seed, counter]), alone, index)
        assert torch.equal(alone, out[row])
    assert state[:, 1].tolist() == [4, 0, 43]


def _policy_rows(model, n: int, trace: bool):
    one = PolicyRuntime(model, trace=trace)
    Arena([one]).allocate()
    return one.batched(n)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("trace", [False, True])
def test_a_policy_row_is_the_same_in_any_row_beside_anything(n, trace):
    rows = _policy_rows(tiny_policy(), n, trace)
    config = rows.runtime.config

    def act(where: int, others_seed: int) -> torch.Tensor:
        for i in range(n):
            slot = rows.slot(i)
            slot.set_language("pick up the red cube" if i == where else f"other {i}")
            slot.reset(11 if i == where else others_seed + i)
            slot.load_observation(random_obs(config, 42 if i == where else others_seed + 100 * i))
        return rows.act_rows(range(n))[where].clone()

    first = act(0, 1)
    for where, others in [(n - 1, 2), (n // 2, 3)]:
        assert torch.equal(act(where, others), first), (where, others)


def test_the_shipped_policy_and_critic_rows_are_row_invariant_at_8():
    rows = _policy_rows(load_policy(f"{SHIPPED}/policy"), 8, True)
    config = rows.runtime.config
    one = CriticRuntime(load_critic(f"{SHIPPED}/critic"))
    Arena([one]).allocate()
    critic = one.batched(8)
    results = []
    for where in (3, 6):
        for i in range(8):
            rows.slot(i).set_language("pick" if i == where else "place")
            rows.slot(i).reset(7 if i == where else 100 + i)
            rows.slot(i).load_observation(random_obs(config, 1 if i == where else 50 + i))
            critic.slot(i).set_language("pick" if i == where else "place")
            critic.slot(i).load_observation(random_obs(config, 1 if i == where else 50 + i), step=4 if i == where else i)
        results.append((rows.act_rows([where])[where].clone(), critic.evaluate_rows([where])[where].clone()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    one.set_language("pick")
    one.load_observation(random_obs(config, 1), step=4)
    value = one.evaluate()  # a batch of one: the value head is the one it always was
    assert torch.equal(value, one.model.value(one.buffers["logits"]))


def test_acting_moves_only_the_active_rows_streams_and_a_slot_capsule_holds_its_row():
    rows = _policy_rows(tiny_policy(), 4, False)
    for i in range(4):
        rows.slot(i).reset(10 + i)
        rows.slot(i).load_observation(random_obs(rows.runtime.config, i))
    rows.act_rows([1, 3])
    assert rows.runtime.buffers["rng"].tolist() == [[10, 0], [11, 1], [12, 0], [13, 1]]
    slot = rows.slot(3)
    arena = Arena([slot]).allocate()
    arena.before_snapshot()
    assert slot.buffers["rng"].tolist() == [13, 1] and slot.buffers["lang"].shape == (1, rows.runtime.config.lang_dim)
    slot.buffers["rng"].copy_(torch.tensor([99, 5]))
    arena.after_restore()
    assert rows.runtime.buffers["rng"].tolist() == [[10, 0], [11, 1], [12, 0], [99, 5]]
    assert slot.fingerprint()["batch"] == "1"


def test_a_critic_row_refuses_a_step_per_batch_and_rows_need_a_batch_of_one_to_start_from():
    one = CriticRuntime(tiny_critic())
    Arena([one]).allocate()
    critic = one.batched(3)
    with pytest.raises(ValueError, match="a slot's step is one count"):
        critic.slot(0).load_observation(random_obs(critic.runtime.config, 0), step=[1, 2, 3])
    with pytest.raises(ValueError, match="made from a runtime of batch 1"):
        PolicyRuntime(tiny_policy(), batch=2).batched(4)


@pytest.mark.parametrize("trace", [False, True])
@pytest.mark.parametrize("guidance", [False, True])
def test_a_row_is_the_batch_of_ones_at_any_number_of_rows(trace, guidance):
    """Batch-invariant runtimes (`models.runtime`, exact sums): a row's chunk and value are those of a runtime of
    batch 1 at 1 to 17 rows, in every position (first beside others, then every row the same), in one call."""
    model, critic_model = load_policy(f"{SHIPPED}/policy"), load_critic(f"{SHIPPED}/critic")
    config = model.config
    one, judge = PolicyRuntime(model, trace=trace, guidance=guidance), CriticRuntime(critic_model, trace=trace)
    Arena([one, judge]).allocate()
    one.reset(7)
    one.set_language("pick")
    judge.set_language("pick")
    if guidance:
        one.set_conditioning(1, 1.5)
    chunk = one.act(random_obs(config, 1)).clone()
    value = judge.evaluate(random_obs(config, 1), step=4).clone()
    for n in (1, 2, 3, 5, 8, 9, 16, 17):
        rows, critic = one.batched(n), judge.batched(n)
        for i in range(n):
            for slot in (rows.slot(i), critic.slot(i)):
                slot.set_language("pick" if i == 0 else "place")
            rows.slot(i).reset(7 if i == 0 else 100 + i)
            if guidance:
                rows.slot(i).set_conditioning(1, 1.5 if i == 0 else 3.0)
            rows.slot(i).load_observation(random_obs(config, 1 if i == 0 else 50 + i))
            critic.slot(i).load_observation(random_obs(config, 1 if i == 0 else 50 + i), step=4 if i == 0 else i)
        assert torch.equal(rows.act_rows(range(n))[0], chunk[0]), n
        assert torch.equal(critic.evaluate_rows(range(n))[0:1], value), n
        assert (rows.runtime.together, critic.runtime.together) == (True, True)
        for i in range(n):  # every position holds the first row's inputs: each gives what the batch of one gave
            for slot in (rows.slot(i), critic.slot(i)):
                slot.set_language("pick")
            rows.slot(i).reset(7)
            if guidance:
                rows.slot(i).set_conditioning(1, 1.5)
            rows.slot(i).load_observation(random_obs(config, 1))
            critic.slot(i).load_observation(random_obs(config, 1), step=4)
        assert torch.equal(rows.act_rows(range(n)), chunk.expand(n, -1, -1)), n
        assert torch.equal(critic.evaluate_rows(range(n)), value.expand(n)), n


def test_the_copy_sums_exactly_and_the_rows_run_one_at_a_time_where_together_differs():
    from capsule_rollout.models.exact_sums import ExactWeights, exact_linear
    from capsule_rollout.models.runtime import in_rows, invariant_copy, rows_agree

    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.SiLU(), torch.nn.Linear(5, 3))
    copy = invariant_copy(model)
    assert copy is not model and invariant_copy(copy) is copy and model[0].forward.__name__ == "forward"
    x = torch.randn(3, 2, 6)
    assert copy(x).shape == (3, 2, 3) and torch.allclose(copy(x), model(x), atol=1e-6)
    w = ExactWeights(model[0].weight, model[0].bias)
    first = exact_linear(x, w.t, w.bias, w.bits_in)
    assert torch.equal(copy[0](x), first)
    for i in range(3):
        for j in range(2):
            assert torch.equal(copy(x[i: i + 1, j: j + 1]), copy(x)[i: i + 1, j: j + 1])
    calls = []

    def fn(a, b):
        calls.append(a.shape[0])
        return a.sum(-1) + b[:, 0] * a.shape[0]  # rounds by batch: together differs from alone

    rows = (torch.randn(5, 3), torch.randn(5, 2))
    assert not rows_agree(fn, rows) and rows_agree(lambda a, b: a * 2 + b[:, :1], rows)
    calls.clear()
    alone = in_rows(fn, rows, False)
    assert calls == [1] * 5 and torch.equal(alone, torch.cat([fn(rows[0][i:i + 1], rows[1][i:i + 1]) for i in range(5)]))
    with pytest.raises(TypeError):
        PolicyRuntime(tiny_policy(), row_block=4)
    assert getattr(PolicyRuntime(tiny_policy(), batch_invariant=False).model, "_sums", None) is None
    assert PolicyRuntime(tiny_policy()).fingerprint()["sums"] == "exact"
    assert "sums" not in PolicyRuntime(tiny_policy(), batch_invariant=False).fingerprint()


def test_runs_recorded_before_exact_sums_still_play_their_padded_rows():
    """A run recorded before exact sums (`sums` "padded"): its runtimes pad rows as they did, and its capsules'
    fingerprint (no `sums`) fits them; an exact runtime refuses those capsules by that entry."""
    from capsule_rollout.models.runtime import LINEAR_ROWS, batch_invariance

    with batch_invariance(True, "padded"):
        old = PolicyRuntime(tiny_policy(), trace=False)
    assert old.sums == "padded" and "sums" not in old.fingerprint() and LINEAR_ROWS == 4
    Arena([old]).allocate()
    old.reset(3)
    obs = random_obs(old.config, 2)
    chunk = old.act(obs).clone()
    rows = old.batched(3)
    assert rows.runtime.sums == "padded" and not rows.runtime.together  # each row what a batch of one computes
    for i in range(3):
        rows.slot(i).reset(3 if i == 1 else 50 + i)
        rows.slot(i).load_observation(obs if i == 1 else random_obs(old.config, 9 + i))
    assert torch.equal(rows.act_rows(range(3))[1], chunk[0])
    with pytest.raises(ValueError, match="sums is one of"):
        PolicyRuntime(tiny_policy(), sums="rounded")
