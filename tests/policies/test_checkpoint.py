import json

import pytest
import torch

from capsule_rollout.models.checkpoint import META_FILE, WEIGHTS_FILE, Checkpoint, CheckpointError, save_checkpoint
from capsule_rollout.models.trainer import LoopConfig, make_optimizer, train
from capsule_rollout.tabletop.flow_policy import KIND, load_policy
from tests.policies.tiny import TINY_POLICY, tiny_policy


def _save(model, path, step=7, optimizer=None, **kw):
    return save_checkpoint(path, kind=KIND, model=model, step=step, optimizer=optimizer,
                           config={"model": TINY_POLICY.to_json()}, **kw)


def test_round_trip_keeps_weights_and_normalisation(tmp_path):
    model = tiny_policy()
    model.set_normalization(torch.randn(50, 8), torch.rand(50, 4) * 2 - 1)
    _save(model, tmp_path / "ck")
    loaded = load_policy(str(tmp_path / "ck"))
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert not any(p.suffix == ".tmp" for p in (tmp_path / "ck").iterdir())
    assert Checkpoint(tmp_path / "ck").step == 7 and not Checkpoint(tmp_path / "ck").resumable


def test_refused_checkpoints_say_why(tmp_path):
    model = tiny_policy()
    path = _save(model, tmp_path / "ck")
    meta = json.loads((path / META_FILE).read_text())
    (path / META_FILE).write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(CheckpointError, match="version 99; this code reads version 1"):
        load_policy(str(path))
    (path / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="not a 'value_critic'"):
        Checkpoint(path, kind="value_critic")
    data = bytearray((path / WEIGHTS_FILE).read_bytes())
    data[-1] ^= 1
    (path / WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        load_policy(str(path))
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        Checkpoint(tmp_path / "nothing")


def _loop(model, optimizer, generator, start, steps):
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(123))

    def loss_fn(step):
        idx = torch.randint(0, 64, (8,), generator=generator)
        return ((model.state_in(data[idx]) - 1.0) ** 2).mean()

    train(model=model, optimizer=optimizer, loss_fn=loss_fn, start_step=start,
          config=LoopConfig(steps=steps, warmup=2, progress=False))


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    config = LoopConfig(steps=6, warmup=2, progress=False)
    straight = tiny_policy(seed=1)
    opt = make_optimizer(straight, config)
    _loop(straight, opt, torch.Generator().manual_seed(9), 0, 6)

    first = tiny_policy(seed=1)
    opt1, gen1 = make_optimizer(first, config), torch.Generator().manual_seed(9)
    _loop(first, opt1, gen1, 0, 3)
    _save(first, tmp_path / "ck", step=3, optimizer=opt1, extra_tensors={"generator": gen1.get_state()})

    resumed = tiny_policy(seed=2)  # different init: everything must come from the checkpoint
    ckpt = Checkpoint(tmp_path / "ck", kind=KIND)
    ckpt.load_model(resumed)
    opt2 = make_optimizer(resumed, config)
    gen2 = torch.Generator()
    gen2.set_state(ckpt.load_optimizer(opt2)["generator"])
    _loop(resumed, opt2, gen2, ckpt.step, 6)
    for key, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_export_drops_the_optimizer_and_keeps_the_weights(tmp_path):
    from capsule_rollout.models.checkpoint import export_weights

    model = tiny_policy()
    opt = make_optimizer(model, LoopConfig(steps=3))
    _save(model, tmp_path / "run", optimizer=opt, info={"evals": [1]})
    out = export_weights(tmp_path / "run", tmp_path / "ship", note={"evaluation": {"success_rate": 0.5}})
    ckpt = Checkpoint(out, kind=KIND)
    assert not ckpt.resumable and not (out / "optimizer.safetensors").exists()
    assert ckpt.meta["info"]["evals"] == [1] and ckpt.meta["info"]["evaluation"]["success_rate"] == 0.5
    loaded = load_policy(out)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    with pytest.raises(ValueError, match="different directory"):
        export_weights(tmp_path / "run", tmp_path / "run")


def test_an_exported_checkpoint_names_no_directory_of_this_machine(tmp_path):
    from capsule_rollout.models.checkpoint import export_weights

    model = tiny_policy()
    _save(model, tmp_path / "repo/runs/run", info={"data": str(tmp_path / "repo/runs/demos.zarr"),
                                                   "elsewhere": ["/mnt/scratch/demos.zarr", "runs/kept"]})
    out = export_weights(tmp_path / "repo/runs/run", tmp_path / "repo/ship", root=tmp_path / "repo",
                         note={"evaluation": {"policy_checkpoint": "/tmp/other/run"}})
    info = Checkpoint(out, kind=KIND).meta["info"]
    assert info["data"] == "runs/demos.zarr" and info["exported_from"] == "runs/run"  # inside the repo: relative
    assert info["elsewhere"] == [None, "runs/kept"] and info["evaluation"]["policy_checkpoint"] is None
    assert "/" + tmp_path.parts[1] not in (out / "checkpoint.json").read_text()
