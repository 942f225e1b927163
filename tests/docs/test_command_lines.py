"""Every command line the docs show parses with the project's real command line, so a renamed command or option
fails here: README.md and docs/**/*.md, each fenced code block's `python -m capsule_rollout NAME ...` (and the
robot side's command), parsed as the command would parse it, never run. The benchmarks' commands are left to
`make bench`."""

from __future__ import annotations

import contextlib
import io

import pytest

from capsule_rollout.commands import registry
from capsule_rollout.commands.option_parsing import ConfigError, old_names, parse_config
from tests.docs.command_lines import PROJECT, ROBOT, ROOT, command_lines, commands_in, shell_lines, tokens_of

LINES = command_lines()


def _is_benchmark(name: str) -> bool:
    return name.startswith("bench_")


def parse_project(argv: tuple[str, ...], old_names_allowed: bool = False) -> str:
    """'' when `python -m capsule_rollout *argv` parses, else what the command line answers; an option's old name
    (still accepted for one release) is refused unless `old_names_allowed`."""
    if not argv:
        return ""  # the list of commands
    try:
        experiment = registry.get(argv[0])
    except registry.UnknownExperimentError as exc:
        return str(exc)
    args = list(argv[1:])
    olds = {old for names in old_names(experiment.config).values() for old in names}
    for arg in args:
        name = arg.split("=", 1)[0]
        name = "--" + name[5:] if name.startswith("--no-") else name
        if name in olds and not old_names_allowed:
            return f"{name} is an old name kept for one release: the docs use the new one (--help names it)"
    if "--help" in args or "-h" in args:
        return ""
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            parse_config(experiment.config, args, f"python -m capsule_rollout {argv[0]}", experiment.summary)
    except SystemExit as exc:
        return err.getvalue().strip()[-1500:] or f"exit {exc.code}"
    except ConfigError as exc:
        return str(exc)
    return ""


def parse_robot(argv: tuple[str, ...]) -> str:
    from capsule_rollout.robot_side.serve import LEROBOT_PREFIXES, parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            parser().parse_args([a for a in argv if not a.startswith(LEROBOT_PREFIXES)])
    except SystemExit as exc:
        return err.getvalue().strip() or f"exit {exc.code}"
    return ""


def test_the_docs_show_command_lines_of_the_project_and_of_the_robot_side():
    programs = [line.program for line in LINES]
    assert programs.count(PROJECT) >= 30 and programs.count(ROBOT) >= 2, programs
    assert any(line.path.name == "README.md" for line in LINES)


@pytest.mark.parametrize("line", [line for line in LINES if not (line.program == PROJECT and line.argv and
                                                                  _is_benchmark(line.argv[0]))],
                         ids=lambda line: f"{line.where()}:{' '.join(line.argv[:1])}")
def test_command_line_parses(line):
    # BENCHMARKS.md is written by the benchmarks: its command lines must parse, old names included
    results = line.path == ROOT / "docs" / "BENCHMARKS.md"
    problem = parse_project(line.argv, results) if line.program == PROJECT else parse_robot(line.argv)
    assert not problem, f"{line.where()}: {' '.join(line.argv)}\n{problem}"


# ---- the finder and the parser themselves ------------------------------------------------------------------------


def test_lines_are_joined_and_found_after_any_python_or_as_the_script(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "text: python -m capsule_rollout not_in_a_block",
        "```bash",
        "python -m capsule_rollout replay --store runs/a/episodes.zarr \\",
        "    --episode x-s1  # a comment --no-such",
        "ray job submit --address http://h:8265 -- python -m capsule_rollout sim_rollout --actors 8 && echo done",
        ".venv-lerobot/bin/capsule-rollout-robot --port 1 --robot.type=so101",
        "```",
        "```python",
        'run("python -m capsule_rollout verify_capsule")',
        "```",
    ]))
    found = [(line.line, line.program, line.argv) for line in command_lines([page])]
    assert found == [
        (3, PROJECT, ("replay", "--store", "runs/a/episodes.zarr", "--episode", "x-s1")),
        (5, PROJECT, ("sim_rollout", "--actors", "8")),
        (6, ROBOT, ("--port", "1", "--robot.type=so101")),
    ]


def test_a_renamed_option_an_old_name_and_an_unknown_command_are_caught():
    assert parse_project(("replay", "--store", "s", "--episode", "e")) == ""
    assert parse_project(("replay", "--store", "s", "--episodes", "e"))  # no such option
    assert "old name" in parse_project(("sim_rollout", "--policy", "p"))  # --model.policy's old name
    assert "unknown" in parse_project(("sim_rolout",))
    assert parse_project(("sim_rollout", "--family", "no_such_family"))
    assert parse_robot(("--port", "5555", "--robot.type=so101_follower")) == ""
    assert parse_robot(("--no-such-option",))


def test_shell_lines_skip_python_and_keep_line_numbers():
    text = "```\nA \\\n B\nC\n```\n```py\nD\n```\n"
    assert shell_lines(text) == [(2, "A   B"), (4, "C")]
    assert commands_in(tokens_of("python3 -m capsule_rollout verify_capsule > out.txt")) == [
        (PROJECT, ["verify_capsule"])]
    assert ROOT.joinpath("README.md").exists()
