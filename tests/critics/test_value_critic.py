import dataclasses

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import Arena
from capsule_rollout.critics.returns import normalized_returns
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.value_critic import ACTOR_DEMONSTRATOR, ACTOR_POLICY, CriticConfig, ValueCritic
from tests.policies.tiny import TINY_CRITIC, obs_of, tiny_critic


def test_two_hot_targets_have_the_exact_expectation():
    critic = tiny_critic()
    targets = torch.tensor([-1.0, -0.73, -0.5, -0.0125, 0.0, 0.4, -3.0])
    probs = critic.two_hot(targets)
    assert torch.allclose(probs.sum(-1), torch.ones(7))
    assert torch.allclose(probs @ critic.support, targets.clamp(-1, 0), atol=1e-6)
    assert ((probs > 0).sum(-1) <= 2).all()


def test_value_is_the_expectation_within_bounds():
    critic = tiny_critic()
    logits = torch.randn(5, critic.config.bins)
    value = critic.value(logits)
    assert value.shape == (5,) and torch.all(value >= -1) and torch.all(value <= 0)
    peaked = torch.full((1, critic.config.bins), -1e9)
    peaked[0, 5] = 0.0
    assert torch.isclose(critic.value(peaked), critic.support[5:6]).all()


def test_normalized_returns_on_hand_made_episodes():
    # success after 4 steps (rewards -1, -1, -1, 0), max 10 steps
    assert np.allclose(normalized_returns([-1, -1, -1, 0], True, 10), [-0.3, -0.2, -0.1, 0.0])
    # failure: a -max_steps penalty clips every step to -1
    assert np.allclose(normalized_returns([-1, -1, -1], False, 10), [-1, -1, -1])
    # a small explicit penalty keeps the shape
    assert np.allclose(normalized_returns([-1, -1], False, 10, failure_penalty=-1.0), [-0.3, -0.2])
    with pytest.raises(ValueError):
        normalized_returns([-1], True, 0)


def test_critic_learns_a_constant_target():
    critic = tiny_critic()
    opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
    images = {"front": torch.randint(0, 256, (16, 16, 16, 3), dtype=torch.uint8)}
    state, tokens = torch.randn(16, 8), torch.zeros(16, critic.config.max_tokens, dtype=torch.long)
    target, step = torch.full((16,), -0.4), torch.arange(16)
    for _ in range(150):
        loss = critic.loss(images, state, critic.embed_language(tokens), target, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        value = critic.value(critic.logits(images, state, critic.embed_language(tokens), step))
    assert torch.allclose(value, target, atol=0.03)


def test_runtime_refuses_bad_inputs():
    rt = CriticRuntime(tiny_critic())
    Arena([rt]).allocate()
    rt.set_language("pick up the red block")
    with pytest.raises(ValueError, match="uint8"):
        rt.evaluate(obs_of({"front": torch.zeros(16, 16, 3)}, torch.zeros(8)), step=0)
    with pytest.raises(ValueError, match="non-finite"):
        rt.evaluate(obs_of({"front": torch.zeros(16, 16, 3, dtype=torch.uint8)}, torch.full((8,), float("inf"))), step=0)
    value = rt.evaluate(obs_of({"front": torch.zeros(16, 16, 3, dtype=torch.uint8)}, torch.zeros(8)), step=0)
    assert value.shape == (1,) and -1 <= float(value) <= 0


def test_critic_with_a_time_input_needs_the_step():
    critic = tiny_critic()
    images = {"front": torch.zeros(2, 16, 16, 3, dtype=torch.uint8)}
    tokens = torch.from_numpy(critic.tokenizer.encode_batch(["pick up the red block"] * 2))
    state, lang = torch.zeros(2, 8), critic.embed_language(tokens)
    with pytest.raises(ValueError, match="pass step="):
        critic.logits(images, state, lang)
    rt = CriticRuntime(critic)
    Arena([rt]).allocate()
    rt.set_language("pick up the red block")
    with pytest.raises(ValueError, match="pass step="):
        rt.evaluate(obs_of({"front": images["front"][0]}, state[0]))
    with pytest.raises(ValueError, match="count >= 0"):
        rt.evaluate(obs_of({"front": images["front"][0]}, state[0]), step=-1)
    # the runtime (traced core, static buffers) gives the model's own value at that step
    for step in (0, 37, 79):
        got = float(rt.evaluate(obs_of({"front": images["front"][0]}, state[0]), step=step)[0])
        with torch.no_grad():
            want = float(critic.value(critic.logits(images, state, lang, torch.tensor([step, step])))[0])
        assert got == pytest.approx(want, abs=1e-6)


def test_time_input_lets_the_critic_tell_equal_states_apart():
    """Same observation, target set by the time left: only the critic that sees the step can fit it."""
    images = {"front": torch.zeros(32, 16, 16, 3, dtype=torch.uint8)}
    state, tokens = torch.zeros(32, 8), torch.zeros(32, TINY_CRITIC.max_tokens, dtype=torch.long)
    step = torch.arange(32) * 2.5
    target = -(1 - step / 80)  # the later, the more of the episode is gone
    errors = {}
    for limit in (80, 0):
        torch.manual_seed(0)
        critic = ValueCritic(dataclasses.replace(TINY_CRITIC, episode_limit=limit))
        opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
        for _ in range(300):
            loss = critic.loss(images, state, critic.embed_language(tokens), target, step)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            value = critic.value(critic.logits(images, state, critic.embed_language(tokens), step))
        errors[limit] = float((value - target).abs().mean())
    assert errors[80] < 0.05 and errors[0] > 0.2, errors


def test_checkpoint_configs_from_before_the_time_input_load_without_it():
    old = {k: v for k, v in TINY_CRITIC.to_json().items() if k != "episode_limit"}
    config = CriticConfig.from_json(old)
    assert config.episode_limit == 0
    critic = ValueCritic(config)
    with torch.no_grad():  # and it needs no step
        critic.logits({"front": torch.zeros(1, 16, 16, 3, dtype=torch.uint8)}, torch.zeros(1, 8),
                      critic.embed_language(torch.zeros(1, config.max_tokens, dtype=torch.long)))
    with pytest.raises(ValueError, match="episode_limit"):
        CriticConfig(episode_limit=-1)
    renamed = CriticConfig.from_json({**old, "horizon": 80})  # written before `horizon` was renamed
    assert renamed.episode_limit == 80


def test_actor_input_keeps_the_demonstrators_and_the_policys_returns_apart():
    """The same states lead to success under a demonstrator and to failure under the policy: a critic
    told who acts fits both; one that is not can only fit their mixture, which is neither."""
    frames = torch.randint(0, 256, (16, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    images = {"front": torch.cat([frames, frames])}  # the same 16 observations under each actor
    state, tokens = torch.zeros(32, 8), torch.zeros(32, TINY_CRITIC.max_tokens, dtype=torch.long)
    step = torch.cat([torch.arange(16)] * 2)
    actor = torch.tensor([ACTOR_DEMONSTRATOR] * 16 + [ACTOR_POLICY] * 16)
    target = torch.where(actor == ACTOR_POLICY, -1.0, -0.2)
    errors = {}
    for actor_input in (True, False):
        torch.manual_seed(0)
        critic = ValueCritic(dataclasses.replace(TINY_CRITIC, actor_input=actor_input))
        opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
        for _ in range(300):
            loss = critic.loss(images, state, critic.embed_language(tokens), target, step, actor)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            value = critic.value(critic.logits(images, state, critic.embed_language(tokens), step, actor))
        errors[actor_input] = float((value - target).abs().mean())
    assert errors[True] < 0.05 and errors[False] > 0.3, errors
    with pytest.raises(ValueError, match="pass actor="):
        critic = ValueCritic(dataclasses.replace(TINY_CRITIC, actor_input=True))
        critic.logits(images, state, critic.embed_language(tokens), step)


def test_runtime_values_states_for_the_policy():
    torch.manual_seed(0)
    critic = ValueCritic(dataclasses.replace(TINY_CRITIC, actor_input=True))
    with torch.no_grad():  # make the actor input matter
        critic.state_in[0].weight[:, -1] = 5.0
    rt = CriticRuntime(critic)
    Arena([rt]).allocate()
    rt.set_language("pick up the red block")
    image, state = torch.randint(0, 256, (1, 16, 16, 3), dtype=torch.uint8), torch.zeros(1, 8)
    got = float(rt.evaluate(obs_of({"front": image[0]}, state[0]), step=12)[0])
    lang = critic.embed_language(torch.from_numpy(critic.tokenizer.encode_batch(["pick up the red block"])))
    with torch.no_grad():
        want = {a: float(critic.value(critic.logits({"front": image}, state, lang, torch.tensor([12]),
                                                    torch.tensor([a])))[0]) for a in (ACTOR_DEMONSTRATOR, ACTOR_POLICY)}
    assert got == pytest.approx(want[ACTOR_POLICY], abs=1e-6)
    assert abs(want[ACTOR_POLICY] - want[ACTOR_DEMONSTRATOR]) > 1e-3


def test_critic_backbone_starts_from_the_policys_encoders():
    from tests.policies.tiny import tiny_policy

    policy, critic = tiny_policy(seed=1), tiny_critic(seed=2)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    assert not torch.equal(critic.vision["front"].out[0].weight, policy.vision["front"].out[0].weight)
    assert critic.load_backbone(policy) == ["language", "vision.front"]
    for name in ("language", "vision"):
        mine, theirs = getattr(critic, name).state_dict(), getattr(policy, name).state_dict()
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    # the critic's own parts stay its own, and the policy is left as it was
    assert critic.head[0].weight.shape[0] == TINY_CRITIC.hidden
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    critic.vision["front"].out[0].weight.data.add_(1.0)  # copies, not shared tensors
    assert torch.equal(policy.vision["front"].out[0].weight, before["vision.front.out.0.weight"])


def test_critic_backbone_refuses_a_policy_that_does_not_fit():
    from tests.policies.tiny import tiny_policy

    wider = ValueCritic(dataclasses.replace(TINY_CRITIC, vision_dim=24))
    with pytest.raises(ValueError, match="vision.front encoder does not fit"):
        wider.load_backbone(tiny_policy())
    top_only = ValueCritic(dataclasses.replace(TINY_CRITIC, cameras=("top",)))
    with pytest.raises(ValueError, match="sees none of the critic's cameras"):
        top_only.load_backbone(tiny_policy())
    other_words = ValueCritic(dataclasses.replace(TINY_CRITIC, hash_buckets=64))
    with pytest.raises(ValueError, match="tokenizer differs"):
        other_words.load_backbone(tiny_policy())


def test_plan_input_tells_apart_what_the_same_state_leads_to():
    """From the same states, plans that move up succeed and plans that move down fail: a critic that
    reads the plan fits both; without a plan (hidden in training a third of the time) it gives their
    mixture, the value of the state alone."""
    frames = torch.randint(0, 256, (16, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    images = {"front": torch.cat([frames, frames])}
    state, tokens, step = torch.zeros(32, 8), torch.zeros(32, TINY_CRITIC.max_tokens, dtype=torch.long), torch.zeros(32)
    plan = torch.zeros(32, 3, 4)
    plan[:16, :, 2], plan[16:, :, 2] = 1.0, -1.0
    target = torch.cat([torch.full((16,), -0.1), torch.full((16,), -0.9)])
    torch.manual_seed(0)
    critic = ValueCritic(dataclasses.replace(TINY_CRITIC, plan_steps=3))
    opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(400):
        hidden = plan.clone()
        hidden[torch.rand(32, generator=g) < 0.3] = float("nan")
        loss = critic.loss(images, state, critic.embed_language(tokens), target, step, None, hidden)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        lang = critic.embed_language(tokens)
        with_plan = critic.value(critic.logits(images, state, lang, step, None, plan))
        alone = critic.value(critic.logits(images, state, lang, step))
        nan_rows = critic.value(critic.logits(images, state, lang, step, None, torch.full_like(plan, float("nan"))))
    assert float((with_plan - target).abs().mean()) < 0.05
    assert float((alone - target.mean()).abs().mean()) < 0.1  # the mixture of the two outcomes
    assert torch.equal(alone, nan_rows)  # a NaN plan is no plan
    with pytest.raises(ValueError, match=r"plan must be \(B, 3, 4\)"):
        critic.logits(images, state, lang, step, None, plan[:, :2])
    with pytest.raises(ValueError, match="reads no plan"):
        ValueCritic(TINY_CRITIC).logits(images, state, lang, step, None, plan)


def test_runtime_values_the_state_alone_until_given_the_plan():
    torch.manual_seed(0)
    critic = ValueCritic(dataclasses.replace(TINY_CRITIC, plan_steps=2))
    with torch.no_grad():  # make the plan matter
        critic.plan_in[0].weight.fill_(1.0)
        critic.no_plan.fill_(-1.0)
    rt = CriticRuntime(critic)
    Arena([rt]).allocate()
    rt.set_language("pick up the red block")
    image, state = torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8), torch.zeros(8)
    chunk = torch.linspace(-1, 1, 16 * 4).reshape(16, 4)  # a policy chunk, longer than the plan
    lang = critic.embed_language(torch.from_numpy(critic.tokenizer.encode_batch(["pick up the red block"])))
    with torch.no_grad():
        want_alone = float(critic.value(critic.logits({"front": image[None]}, state[None], lang, torch.tensor([3])))[0])
        want_plan = float(critic.value(critic.logits({"front": image[None]}, state[None], lang, torch.tensor([3]),
                                                     None, chunk[None, :2]))[0])
    assert float(rt.evaluate(obs_of({"front": image}, state), step=3)[0]) == pytest.approx(want_alone, abs=1e-6)
    assert float(rt.evaluate(plan=chunk)[0]) == pytest.approx(want_plan, abs=1e-6)  # same observation, with plan
    assert abs(want_plan - want_alone) > 1e-3
    # a new observation drops the old plan
    assert float(rt.evaluate(obs_of({"front": image}, state), step=3)[0]) == pytest.approx(want_alone, abs=1e-6)
    with pytest.raises(ValueError, match="T >= 2"):
        rt.evaluate(plan=chunk[:1])
    with pytest.raises(ValueError, match="NaN"):
        rt.evaluate(plan=torch.full((2, 4), float("nan")))
    with pytest.raises(ValueError, match="reads no plan"):
        plain = CriticRuntime(ValueCritic(TINY_CRITIC))
        Arena([plain]).allocate()
        plain.load_plan(chunk)


def test_a_privileged_critic_tells_apart_states_a_robot_sees_the_same():
    """Same images and robot state, different object poses (the sim's privileged state): one outcome each. A
    critic that reads the privileged state fits both; one that does not can only give their mixture."""
    frames = torch.randint(0, 256, (16, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    images = {"front": torch.cat([frames, frames])}
    state, tokens, step = torch.zeros(32, 8), torch.zeros(32, TINY_CRITIC.max_tokens, dtype=torch.long), torch.zeros(32)
    privileged = torch.zeros(32, 5)
    privileged[:16, 0], privileged[16:, 0] = 0.05, -0.05  # a block 5 cm left or right of where it should be
    target = torch.cat([torch.full((16,), -0.1), torch.full((16,), -0.9)])
    fits = {}
    for dim in (5, 0):
        torch.manual_seed(0)
        critic = ValueCritic(dataclasses.replace(TINY_CRITIC, privileged_dim=dim))
        critic.set_normalization(state, privileged if dim else None)
        opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
        for _ in range(300):
            loss = critic.loss(images, state, critic.embed_language(tokens), target, step, None, None,
                               privileged if dim else None)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            value = critic.value(critic.logits(images, state, critic.embed_language(tokens), step, None, None,
                                               privileged if dim else None))
        fits[dim] = float((value - target).abs().mean())
    assert fits[5] < 0.05 and fits[0] > 0.3  # without it: the mixture, 0.4 from either outcome
    with pytest.raises(ValueError, match="privileged state"):
        critic = ValueCritic(dataclasses.replace(TINY_CRITIC, privileged_dim=5))
        critic.logits(images, state, critic.embed_language(tokens), step)


def test_a_privileged_critic_reads_the_envs_privileged_observation_in_a_runtime_and_in_rows():
    from capsule_rollout.tabletop.model_rows import CriticRows

    torch.manual_seed(0)
    critic = ValueCritic(dataclasses.replace(TINY_CRITIC, privileged_dim=3))
    with torch.no_grad():  # make the privileged input matter
        critic.privileged_in[0].weight.fill_(1.0)
    rt = CriticRuntime(critic)
    Arena([rt]).allocate()
    assert rt.spec.observation_keys == ("image_front", "state", "privileged")
    rt.set_language("pick up the red block")
    image, state = torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8), torch.zeros(8)
    lang = critic.embed_language(torch.from_numpy(critic.tokenizer.encode_batch(["pick up the red block"])))
    values = []
    for p in (np.zeros(3, np.float32), np.full(3, 0.5, np.float32)):
        with torch.no_grad():
            want = float(critic.value(critic.logits({"front": image[None]}, state[None], lang, torch.tensor([3]), None,
                                                    None, torch.from_numpy(p)[None]))[0])
        got = float(rt.evaluate({**obs_of({"front": image}, state), "privileged": p}, step=3)[0])
        assert got == pytest.approx(want, abs=1e-6)
        values.append(got)
    assert abs(values[0] - values[1]) > 1e-3
    with pytest.raises(ValueError, match=r"lacks \['privileged'\]"):
        rt.evaluate(obs_of({"front": image}, state), step=3)
    with pytest.raises(ValueError, match="non-finite"):
        rt.evaluate({**obs_of({"front": image}, state), "privileged": np.full(3, np.nan, np.float32)}, step=3)
    with pytest.raises(ValueError, match="expected shape"):
        rt.evaluate({**obs_of({"front": image}, state), "privileged": np.zeros(4, np.float32)}, step=3)
    rows = CriticRows(CriticRuntime(critic), 3)  # slots: each row its own privileged state, the same values
    for i, p in enumerate((np.zeros(3, np.float32), np.full(3, 0.5, np.float32), np.zeros(3, np.float32))):
        rows.slot(i).set_language("pick up the red block")
        rows.slot(i).load_observation({**obs_of({"front": image}, state), "privileged": p}, step=3)
    got = rows.evaluate_rows([0, 1, 2])
    assert [float(v) for v in got] == pytest.approx([values[0], values[1], values[0]], abs=1e-6)
    with pytest.raises(ValueError, match=r"lacks \['privileged'\]"):
        rows.slot(0).load_observation(obs_of({"front": image}, state), step=3)
