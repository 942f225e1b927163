import pytest
import torch

from capsule_rollout.capsules import Arena, restore, snapshot
from capsule_rollout.models.counter_rng import make_state, normal_
from capsule_rollout.tabletop.flow_policy import ADV_POSITIVE, FlowPolicy, FlowPolicyConfig
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.tokenizer import Tokenizer
from tests.policies.tiny import TINY_POLICY, obs_of, tiny_policy


def _obs(config, seed=0, batch=None):
    g = torch.Generator().manual_seed(seed)
    shape = (config.image_size, config.image_size, 3) if batch is None else (batch, config.image_size, config.image_size, 3)
    images = {c: torch.randint(0, 256, shape, dtype=torch.uint8, generator=g) for c in config.cameras}
    state = torch.randn(config.state_dim if batch is None else (batch, config.state_dim), generator=g)
    return images, state


def _runtime(model, **kw):
    rt = PolicyRuntime(model, **kw)
    arena = Arena([rt]).allocate()
    rt.set_language("pick up the red block")
    return rt, arena


def test_shapes_and_dtypes_follow_the_spec():
    model = tiny_policy()
    c = model.config
    rt, arena = _runtime(model, batch=3)
    images, state = _obs(c, batch=3)
    chunk = rt.act(obs_of(images, state))
    assert chunk.shape == (3, c.chunk_length, c.action_dim) and chunk.dtype == torch.float32
    assert torch.all(chunk >= model.action_low) and torch.all(chunk <= model.action_high)
    specs = {s.name: s for s in rt.buffer_specs()}
    assert specs["image_front"].dtype == torch.uint8 and specs["image_front"].shape == (3, 16, 16, 3)
    assert specs["rng"].dtype == torch.int64 and specs["lang"].shape == (3, c.lang_dim)
    assert model.embed_language(torch.zeros(2, c.max_tokens, dtype=torch.long)).shape == (2, c.lang_dim)


class _Analytic(FlowPolicy):
    """A policy whose velocity field is given in closed form (normalised action space)."""

    def __init__(self, field):
        super().__init__(TINY_POLICY)
        self.field = field

    def films(self, cond):  # the field reads the conditioning itself
        return []

    def velocity(self, x, t, cond, **_):
        return self.field(x, t, cond)


def test_sampler_transports_to_a_point_mass_exactly():
    target = torch.linspace(-0.8, 0.8, TINY_POLICY.chunk_length * TINY_POLICY.action_dim)
    model = _Analytic(lambda x, t, c: (target - x) / (1 - t[:, None]))  # optimal field for a point mass
    noise = torch.randn(5, target.numel(), generator=torch.Generator().manual_seed(0))
    out = model.sample(torch.zeros(5, 1), noise)
    expected = model.unnormalize_actions(target.view(1, TINY_POLICY.chunk_length, -1)).expand(5, -1, -1)
    assert torch.allclose(out, expected, atol=1e-6)


def test_sampler_transports_gaussian_noise_to_the_target_gaussian():
    mu, sigma, k = 0.3, 0.2, 200

    def field(x, t, c):  # E[y - z | x_t = x] for z ~ N(0, 1), y ~ N(mu, sigma^2)
        t = t[:, None]
        return mu + (t * sigma**2 - (1 - t)) / ((1 - t) ** 2 + t**2 * sigma**2) * (x - t * mu)

    model = _Analytic(field)
    model.config = FlowPolicyConfig(**{**TINY_POLICY.to_json(), "denoise_steps": k, "channels": (8, 8, 8)})
    noise = torch.randn(20000, TINY_POLICY.chunk_length * TINY_POLICY.action_dim, generator=torch.Generator().manual_seed(1))
    out = model.sample(torch.zeros(20000, 1), noise)  # unnormalised with low=-1, high=1: identity
    assert abs(out.mean().item() - mu) < 0.01 and abs(out.std().item() - sigma) < 0.01


def test_guidance_combines_conditional_and_unconditional_fields():
    a, b = 0.5, -0.25

    def field(x, t, c):  # cond rows (c = 1) head to a, unconditional rows (c = 0) to b
        goal = torch.where(c[:, :1] > 0.5, a, b)
        return (goal - x) / (1 - t[:, None])

    model = _Analytic(field)
    noise = torch.randn(4, TINY_POLICY.chunk_length * TINY_POLICY.action_dim)
    for beta in (0.0, 1.0, 2.0):
        out = model.sample(torch.ones(4, 1), noise, cond_none=torch.zeros(4, 1), beta=beta)
        assert torch.allclose(out, torch.full_like(out, b + beta * (a - b)).clamp(-1, 1), atol=1e-5)


@pytest.mark.parametrize("guidance", [False, True])
def test_runtime_equals_a_direct_eager_call_bit_for_bit(guidance):
    model = tiny_policy()
    rt, _ = _runtime(model, seed=5, guidance=guidance)
    rt.set_conditioning(ADV_POSITIVE, beta=1.7 if guidance else None)
    images, state = _obs(model.config)
    chunk = rt.act(obs_of(images, state)).clone()
    from capsule_rollout.models.runtime import invariant_copy

    def by_hand(m):
        with torch.no_grad():  # the same computation by hand, from the same generator state
            rng, noise = make_state(5), torch.empty(1, m.config.chunk_length * m.config.action_dim)
            normal_(rng, noise, torch.arange(noise.numel()))
            lang = m.embed_language(torch.from_numpy(m.tokenizer.encode("pick up the red block"))[None])
            feats = m.features({k: v[None] for k, v in images.items()}, state[None], lang)
            cond = m.condition(feats, torch.tensor([ADV_POSITIVE]))
            if guidance:
                return m.sample(cond, noise, cond_none=m.condition(feats, torch.tensor([0])), beta=torch.tensor(1.7))
            return m.sample(cond, noise)

    # the runtime's batch-invariant copy bit for bit; the model as trained within rounding
    assert torch.equal(chunk, by_hand(invariant_copy(model)))
    assert torch.allclose(chunk, by_hand(model), atol=1e-5)
    assert rt.runner.mode == "eager" and int(rt.buffers["rng"][1]) == 1


def test_restore_gives_identical_chunks_and_noise_advances():
    model = tiny_policy()
    rt, arena = _runtime(model, seed=2)
    images, state = _obs(model.config)
    capsule = snapshot(arena)
    first, second = rt.act(obs_of(images, state)).clone(), rt.act(obs_of(images, state)).clone()
    assert not torch.equal(first, second)  # the noise counter moved on
    rt.set_language("place it on the orange pad")
    restore(arena, capsule)
    assert torch.equal(rt.act(obs_of(images, state)), first)


@pytest.mark.parametrize("trace", [False, True])
def test_noise_scale_multiplies_the_noise_before_the_flow(trace):
    """The chunk is the flow integrated from the scaled draw; at scale 0 every noise stream gives one chunk."""
    model = tiny_policy()
    images, state = _obs(model.config)
    unit, _ = _runtime(model, seed=5, trace=trace)
    unit.act(obs_of(images, state))
    draw = unit.buffers["noise"].clone()
    half, _ = _runtime(model, seed=5, noise_scale=0.5, trace=trace)
    chunk = half.act(obs_of(images, state)).clone()
    assert torch.equal(half.buffers["noise"], draw * 0.5)
    with torch.no_grad():
        lang = model.embed_language(torch.from_numpy(model.tokenizer.encode("pick up the red block"))[None])
        feats = model.features({k: v[None] for k, v in images.items()}, state[None], lang)
        direct = model.sample(model.condition(feats, torch.tensor([0])), draw * 0.5)
    assert torch.allclose(chunk, direct, atol=1e-6)
    zero = [_runtime(model, seed=seed, noise_scale=0.0, trace=trace)[0] for seed in (1, 2)]
    chunks = [rt.act(obs_of(images, state)).clone() for rt in zero] + [zero[0].act(obs_of(images, state)).clone()]
    assert torch.equal(chunks[0], chunks[1]) and torch.equal(chunks[0], chunks[2])
    assert not torch.equal(chunks[0], chunk)
    # a capsule fits only a runtime with the same scale; the default keeps the fingerprint capsules had before
    assert "noise_scale" not in unit.fingerprint() and half.fingerprint()["noise_scale"] == "0.5"
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="noise_scale"):
            PolicyRuntime(model, noise_scale=bad)


def test_bad_inputs_get_clear_errors():
    model = tiny_policy()
    rt, _ = _runtime(model)
    images, state = _obs(model.config)
    with pytest.raises(ValueError, match="uint8"):
        rt.act(obs_of({"front": images["front"].float()}, state))
    with pytest.raises(ValueError, match=r"expected shape \(1, 16, 16, 3\)"):
        rt.act(obs_of({"front": torch.zeros(1, 32, 32, 3, dtype=torch.uint8)}, state))
    with pytest.raises(ValueError, match="non-finite"):
        rt.act(obs_of(images, torch.full((8,), float("nan"))))
    with pytest.raises(ValueError, match=r"observation lacks \['image_front'\]"):
        rt.act(obs_of({"top": images["front"]}, state))
    with pytest.raises(ValueError, match="indicator"):
        rt.set_conditioning(5)
    with pytest.raises(ValueError, match="unknown policy config fields"):
        FlowPolicyConfig.from_json({**TINY_POLICY.to_json(), "layers": 3})


def test_tokenizer_is_deterministic_and_hashes_unknown_words():
    tok = Tokenizer(max_tokens=6)
    ids = tok.encode("Put the RED block, then zorp!")
    assert ids.tolist()[:5] == [tok.word_id(w) for w in ("put", "the", "red", "block", "then")]
    assert ids[5] == tok.word_id("zorp") >= len(tok.vocab) and Tokenizer(max_tokens=6).encode("zorp")[0] == ids[5]
    assert tok.encode("").tolist() == [0] * 6
    assert Tokenizer.from_json(tok.to_json()).encode("zorp the pad").tolist() == tok.encode("zorp the pad").tolist()


@pytest.mark.gpu
def test_cuda_graph_capture_equals_eager():
    model = tiny_policy()
    eager = PolicyRuntime(model, device="cuda", capture=False, name="eager", seed=4)
    graph = PolicyRuntime(model, device="cuda", capture=True, name="graph", seed=4)
    arena = Arena([eager, graph]).allocate()
    images, state = _obs(model.config)
    for rt in (eager, graph):
        rt.set_language("pick up the red block")
    capsule = snapshot(arena)
    outs = {}
    for rt in (eager, graph):
        outs[rt.name] = [rt.act(obs_of(images, state)).clone() for _ in range(3)]
    for a, b in zip(outs["eager"], outs["graph"]):
        assert torch.equal(a, b)
    assert graph.runner.mode == "cuda_graph" and graph.runner.graph is not None
    restore(arena, capsule)  # restore refills buffers in place: replay without re-capture
    captured = graph.runner.graph
    assert torch.equal(graph.act(obs_of(images, state)), outs["graph"][0]) and graph.runner.graph is captured


def test_traced_cpu_path_stays_bit_identical_to_eager_over_many_calls():
    """TorchScript re-optimises after its profiling runs: compare well past them, on the shipped size."""
    torch.manual_seed(0)
    model = FlowPolicy(FlowPolicyConfig())
    traced, _ = _runtime(model, seed=3, guidance=True)
    eager, _ = _runtime(model, seed=3, guidance=True, trace=False)
    assert isinstance(traced.core, torch.jit.ScriptModule) and not isinstance(eager.core, torch.jit.ScriptModule)
    for i in range(12):
        images, state = _obs(model.config, seed=i)
        assert torch.equal(traced.act(obs_of(images, state)), eager.act(obs_of(images, state))), f"call {i}"


def test_traced_critic_equals_eager():
    from capsule_rollout.tabletop.critic_runtime import CriticRuntime
    from capsule_rollout.tabletop.value_critic import ValueCritic

    torch.manual_seed(0)
    critic = ValueCritic()
    runtimes = [CriticRuntime(critic, trace=t) for t in (None, False)]
    Arena(runtimes[:1]).allocate()
    Arena(runtimes[1:]).allocate()
    for rt in runtimes:
        rt.set_language("pick up the red block")
    for i in range(12):
        images, state = _obs(FlowPolicyConfig(), seed=i)
        a, b = (rt.evaluate(obs_of(images, state)).clone() for rt in runtimes)
        assert torch.equal(a, b) and torch.equal(runtimes[0].buffers["logits"], runtimes[1].buffers["logits"])
