"""The command lines the docs show: every `python -m capsule_rollout ...` / `capsule-rollout ...` (and the robot
side's `capsule_rollout.robot_side.serve` / `capsule-rollout-robot`) in a fenced code block of README.md or a page
under docs/, as the argument list the shell would hand the command."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
SHELL_OPERATORS = {"&&", "||", ";", "|", "&", ">", ">>", "<", "2>", "(", ")"}
PROJECT, ROBOT = "capsule_rollout", "capsule_rollout.robot_side.serve"
SCRIPTS = {"capsule-rollout": PROJECT, "capsule-rollout-robot": ROBOT}
MENTIONS = re.compile(r"-m\s+capsule_rollout\b|\bcapsule-rollout\b")
NOT_SHELL = {"python", "py", "pycon", "toml", "yaml", "yml", "json"}  # blocks whose lines no shell runs


@dataclass(frozen=True)
class CommandLine:
    path: Path
    line: int  # 1-based, where the command's first line is
    program: str  # PROJECT or ROBOT
    argv: tuple[str, ...]  # after the program: the command name first for PROJECT

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, logical line) of every line in a fenced code block that a shell would run: backslash
    continuations joined, blocks in Python or data languages left out."""
    out: list[tuple[int, str]] = []
    fence, language, pending, start = None, "", "", 0
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence, language = match.group(1), match.group(2).lower()
            continue
        if line.strip().startswith(fence):
            fence, pending = None, ""
            continue
        if language in NOT_SHELL:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def commands_in(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """(program, its arguments) for each call of the project's commands among a shell line's tokens."""
    out = []
    for i, token in enumerate(tokens):
        program = None
        if token == "-m" and i + 1 < len(tokens) and tokens[i + 1] in (PROJECT, ROBOT):
            program, first = tokens[i + 1], i + 2
        elif Path(token).name in SCRIPTS:
            program, first = SCRIPTS[Path(token).name], i + 1
        if program is None:
            continue
        args = []
        for arg in tokens[first:]:
            if arg in SHELL_OPERATORS:
                break
            args.append(arg)
        out.append((program, args))
    return out


def tokens_of(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def command_lines(files: list[Path] | None = None) -> list[CommandLine]:
    found = []
    for path in doc_files() if files is None else files:
        for number, line in shell_lines(path.read_text()):
            if not MENTIONS.search(line):
                continue
            try:
                tokens = tokens_of(line)
            except ValueError as exc:  # unbalanced quotes: the shell could not run it either
                raise ValueError(f"{path.relative_to(ROOT)}:{number}: {exc}: {line}") from None
            for program, args in commands_in(tokens):
                found.append(CommandLine(path, number, program, tuple(args)))
    return found
