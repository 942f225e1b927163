import json
import subprocess
import sys

import pytest

from capsule_rollout.commands import registry
from capsule_rollout.commands.cli import flat_fields
from capsule_rollout.experiments.run import main, parse


def test_usage_lists_every_experiment(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in registry.names():
        assert name in out


def test_unknown_experiment_suggests_the_closest(capsys):
    assert main(["verify_capsul"]) == 2
    assert "did you mean 'verify_capsule'" in capsys.readouterr().err


def test_unknown_option_suggests_the_closest(capsys):
    assert main(["bench_capsules", "--round", "3"]) == 2
    assert "did you mean --rounds" in capsys.readouterr().err
    assert main(["verify_capsule", "stray"]) == 2
    assert "unknown argument 'stray'" in capsys.readouterr().err


def test_bad_values_get_clear_errors(capsys):
    assert main(["verify_capsule", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("verify_capsule", ["--device", "tpu"])
    assert "'tpu' is not one of" in capsys.readouterr().err
    assert main(["bench_capsules", "--sizes_kib", "4", "8"]) == 2
    assert "one buffer count per size" in capsys.readouterr().err


def test_every_config_field_is_documented_and_shown_in_help():
    for name in registry.names():
        config = registry.get(name).config
        leaves = flat_fields(config)  # nested configs give dotted options, e.g. --robot.port
        undocumented = {leaf for leaf, _, _, doc in leaves if not doc}
        assert not undocumented, f"{name}: undocumented fields {undocumented}"
        help_text = subprocess.run(
            [sys.executable, "-m", "capsule_rollout", name, "--help"], capture_output=True, text=True, check=True
        ).stdout
        for leaf, _, _, doc in leaves:
            assert f"--{leaf}" in help_text
            assert doc.split()[0] in help_text
        assert "--json" in help_text
        assert "option_strings" not in help_text, f"{name}: a % in a field doc broke argparse's help formatting"


def test_values_and_tuples_are_parsed():
    _, config, json_path = parse(
        "bench_capsules", ["--sizes_kib", "4", "8", "--buffers", "2", "3", "--quick", "--json", "out.json"]
    )
    assert config.sizes_kib == (4, 8) and config.buffers == (2, 3) and config.quick is True
    assert json_path == "out.json"
    for argv, expected in ((["--no-quick"], False), (["--quick", "false"], False), (["--quick", "yes"], True)):
        _, config, _ = parse("bench_capsules", argv)
        assert config.quick is expected


def test_json_summary_is_written(tmp_path):
    out = tmp_path / "sub" / "v.json"
    assert main(["verify_capsule", "--steps", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["all_bit_exact"] is True


def test_option_groups_are_dotted_and_the_old_names_still_work(capsys):
    dotted = ["--model.policy", "p", "--model.critic", "", "--act.advantage", "positive", "--act.beta", "2",
              "--act.n_exec", "4", "--seeds.first", "7", "--seeds.count", "3"]
    flat = ["--policy", "p", "--critic", "", "--advantage", "positive", "--beta", "2", "--n_exec", "4",
            "--seed", "7", "--episodes", "3"]
    _, new, _ = parse("sim_rollout", dotted)
    _, old, _ = parse("sim_rollout", flat)
    assert new == old and new.model.policy == "p" and new.act.beta == 2.0 and list(new.seeds.range) == [7, 8, 9]
    _, train, _ = parse("train_policy", ["--loop.steps", "5", "--batch_size", "3", "--no-progress", "--eval_episodes", "0"])
    assert (train.loop.steps, train.loop.batch_size, train.loop.progress, train.eval.count) == (5, 3, False, 0)
    assert train.loop.lr == 3e-4 and parse("train_critic", [])[1].loop.batch_size == 128  # each command's defaults
    # a group's own check runs once for every command and names the group's options
    assert main(["eval_policy", "--act.n_exec", "0"]) == 2
    assert "--act.*: n_exec must be >= 1" in capsys.readouterr().err
    assert main(["train_critic", "--loop.batch_size", "0"]) == 2
    assert "--loop.*:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("eval_policy", ["--help"])
    help_text = capsys.readouterr().out
    assert "--act.* options" in help_text and "How the policy acts" in help_text
    assert "--model.policy STR, --policy STR" in help_text  # the old name beside the new one
