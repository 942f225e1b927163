import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import docstring_parser
import pytest

from capsule_rollout.cli.run import main, parse
from capsule_rollout.commands import registry
from capsule_rollout.commands.option_parsing import flat_fields, parse_config


def test_usage_lists_every_experiment(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in registry.names():
        assert name in out


def test_usage_groups_the_commands_by_what_users_do_and_lists_no_benchmark(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    headings = [line[:-1] for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings == ["run and replay", "inspect and verify", "data", "robot", "learning"]
    placed = [name for members in registry.GROUPS.values() for name in members]
    assert sorted(placed) == registry.names()  # every command in exactly one group, none left for "other"
    assert out.index("sim_rollout") < out.index("verify_capsule") < out.index("collect_demos") < out.index("real_recap")
    assert "bench" not in out and "gpu_check" not in out  # the benchmarks live apart: `python -m benchmarks`


def test_unknown_experiment_suggests_the_closest(capsys):
    assert main(["verify_capsul"]) == 2
    assert "did you mean 'verify_capsule'" in capsys.readouterr().err


def test_unknown_option_suggests_the_closest(capsys):
    assert main(["verify_capsule", "--step", "3"]) == 2
    err = capsys.readouterr().err
    assert "Unrecognized options: --step" in err and "Perhaps you meant" in err and "--steps INT" in err
    assert main(["verify_capsule", "stray"]) == 2
    assert "Unrecognized options: stray" in capsys.readouterr().err


def test_bad_values_get_clear_errors(capsys):
    assert main(["verify_capsule", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("verify_capsule", ["--device", "tpu"])
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())  # tyro's message box wraps lines
    assert "'tpu' is not one of" in err and "did you mean 'cpu'" in err
    assert main(["sim_rollout", "--video", "maybe"]) == 2
    assert "'maybe' is not a boolean" in capsys.readouterr().err
    assert main(["consolidate", "--store", "a.zarr", "--out", "a.zarr"]) == 2  # a check across two options
    assert "--out (the zarr store to write, another one)" in capsys.readouterr().err


def field_docs(config, prefix=""):
    """Dotted option -> its field's docstring, read as tyro reads it (docstring_parser)."""
    docs = {p.arg_name: p.description or "" for p in docstring_parser.parse_from_object(type(config)).params}
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out |= field_docs(value, f"{prefix}{f.name}.")
        else:
            out[f"{prefix}{f.name}"] = docs.get(f.name, "")
    return out


def test_every_config_field_is_documented_and_shown_in_help():
    for name in registry.names():
        config = registry.get(name).config
        docs = field_docs(config)  # nested configs give dotted options, e.g. --robot.port
        assert set(docs) == {leaf for leaf, _, _ in flat_fields(config)}
        undocumented = {leaf for leaf, doc in docs.items() if not doc}
        assert not undocumented, f"{name}: undocumented fields {undocumented}"
        help_text = subprocess.run(
            [sys.executable, "-m", "capsule_rollout", name, "--help"], capture_output=True, text=True, check=True
        ).stdout
        for leaf, doc in docs.items():
            assert f"--{leaf}" in help_text
            assert doc.split()[0] in help_text
            assert all(word in help_text for word in doc.split() if "%" in word), f"{name}: a % in {leaf}'s doc"
        assert "--json" in help_text


def test_values_and_tuples_are_parsed():
    _, config, json_path = parse("sim_rollout", ["--pin_seeds", "4", "8", "--observers", "a:b", "--shards", "--json",
                                                 "out.json"])
    assert config.pin_seeds == (4, 8) and config.observers == ("a:b",) and config.shards is True
    assert json_path == "out.json"
    for argv, expected in ((["--no-video"], False), (["--video", "false"], False), (["--video", "yes"], True)):
        _, config, _ = parse("sim_rollout", argv)
        assert config.video is expected


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
    assert main(["recap", "--select.count", "-1"]) == 2  # two groups of one class: the error names the right one
    assert "--select.*: first and count must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("eval_policy", ["--help"])
    help_text = capsys.readouterr().out
    assert "act options" in help_text and "How the policy acts" in help_text
    assert "--policy STR, --model.policy STR" in help_text  # the old name beside the new one
    assert "(old name --policy still accepted)" in " ".join(help_text.replace("│", " ").split())  # box lines wrap


def test_equals_forms_none_and_bools_everywhere():
    _, config, json_path = parse("sim_rollout", ["--value_threshold=0.5", "--act.beta=2", "--shards=true", "--video",
                                                 "false", "--no-progress", "--pin_seeds", "3", "4", "--json=s.json"])
    assert (config.value_threshold, config.act.beta, config.shards, config.video, config.progress) == (0.5, 2.0, True,
                                                                                                      False, False)
    assert config.pin_seeds == (3, 4) and json_path == "s.json"
    _, config, _ = parse("sim_rollout", ["--value_threshold", "0.5", "--value_threshold", "none", "--beta", "None"])
    assert config.value_threshold is None and config.act.beta is None  # the last one given counts; none clears it
    assert parse("verify_capsule", ["--cameras", "none"])[1].cameras is None
    assert parse("real_recap", ["--operator", "none", "--no-teleop"])[1].operator == "none"  # a choice named none


def test_aliases_must_name_an_option():
    @dataclass(frozen=True)
    class Broken:
        ALIASES: ClassVar[dict[str, str]] = {"old": "nowhere"}
        x: int = 1
        """A field."""

    with pytest.raises(TypeError, match="'nowhere' \\(for --old\\) is not an option"):
        parse_config(Broken(), [], "prog", "summary")


def test_listing_commands_leaves_the_cli_library_unimported():
    probe = ("import sys; from capsule_rollout.cli.run import main, parse; main([]); before = 'tyro' in sys.modules;"
             " parse('verify_capsule', []); print(before, 'tyro' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split()[-2:] == ["False", "True"]
