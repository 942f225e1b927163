"""The README stays a front door: short, its own-env path near the top, `make demo` and `make test` its set-up,
a development section with the make targets, links that lead somewhere, tables of one sentence a cell."""

from __future__ import annotations

import re

from tests.docs.command_lines import ROOT

README = (ROOT / "README.md").read_text()


def _prose_lines(text: str) -> list[str]:
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def test_under_15000_characters():
    assert len(README) < 15_000, len(README)


def test_no_line_over_300_characters_outside_code_blocks():
    long = [line[:80] for line in _prose_lines(README) if len(line) > 300]
    assert not long, long


def test_the_own_env_path_comes_within_the_first_4000_characters():
    heading = README.index("\n## Your own env and policy")
    call = README.index("record_rollouts(")
    assert heading < call < 4_000, (heading, call)
    block = README[README.rfind("```python", 0, call):call]
    assert "def make_env" in block and "infer(self, obs, *, noise)" in block  # objects, not import paths


def test_make_demo_and_make_test_are_the_two_set_up_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


def test_development_section_names_the_targets_and_their_timings_from_a_fresh_clone():
    development = README[README.index("\n## Development"):]
    for target in ("make test", "make test-slow", "make lint", "make docs"):
        assert f"`{target}`" in development
    assert "from a fresh clone" in development and re.search(r"unit tier \d+m\d+s", development)


def test_relative_links_lead_to_files():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


def test_table_cells_are_at_most_a_sentence():
    for line in _prose_lines(README):
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        for cell in line.strip("|").split("|"):
            text = re.sub(r"`[^`]*`", "code", cell).strip()
            assert len(re.findall(r"[.!?](\s|$)", text)) <= 1 and len(text) <= 120, cell
