"""What every benchmark shares: its command line (`python -m benchmarks.NAME`: options from its config, each
documented in `--help`), the listing `python -m benchmarks` prints, and the one renderer of result tables."""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import subprocess
import sys
from pathlib import Path

import docstring_parser
import pytest

from benchmarks.__main__ import SHARED, listing
from benchmarks.report import Table, markdown, publish, targets, write_section
from capsule_rollout.commands.option_parsing import flat_fields

ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in SHARED)
ARGPARSE = {"gpu_slots"}  # a GPU experiment with its own argparse command line (a report after every stage)


def config_class(module) -> type:
    [cls] = [v for v in vars(module).values() if isinstance(v, type) and dataclasses.is_dataclass(v)
             and v.__module__ == module.__name__ and v.__name__.endswith("Config")]
    return cls


def test_the_listing_names_every_benchmark_with_what_it_measures():
    text = listing()
    assert len(NAMES) >= 15
    for name in NAMES:
        line = next(line for line in text.splitlines() if line.startswith(f"  {name} "))
        assert len(line.split()) > 3, line  # the first paragraph of its docstring
    out = subprocess.run([sys.executable, "-m", "benchmarks"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == text


@pytest.mark.parametrize("name", sorted(set(NAMES) - ARGPARSE))
def test_every_option_is_documented_and_shown_in_help(name, capsys):
    module = importlib.import_module(f"benchmarks.{name}")
    config = config_class(module)()
    assert dataclasses.is_dataclass(config) and type(config).__dataclass_params__.frozen
    docs = {p.arg_name: p.description or "" for p in docstring_parser.parse_from_object(type(config)).params}
    leaves = [leaf for leaf, _, _ in flat_fields(config)]
    assert not [leaf for leaf in leaves if not docs.get(leaf)], f"{name}: undocumented options"
    assert module.main(["--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert f"python -m benchmarks.{name}" in help_text and "--json" in help_text
    for leaf in leaves:
        assert f"--{leaf}" in help_text and docs[leaf].split()[0] in help_text


def test_a_bad_command_line_is_refused_in_one_line(capsys):
    from benchmarks.capsules import main

    assert main(["--round", "3"]) == 2
    err = capsys.readouterr().err
    assert "Unrecognized options: --round" in err and "--rounds INT" in err
    assert main(["--sizes_kib", "4", "8"]) == 2  # the config's own check
    assert "error: --sizes_kib has 2 values but --buffers has 3: give one buffer count per size" in capsys.readouterr().err
    assert main(["--quick", "maybe"]) == 2
    assert "'maybe' is not a boolean" in capsys.readouterr().err


def test_a_report_is_written_into_its_section_and_printed(tmp_path):
    blocks = ["Device: **cpu**.", Table(("measure", "value"), [("a [b]", "1"), ("c", "2")], title="t"),
              targets({"fast": True, "small": False, "gpu": None})]
    assert markdown(blocks) == ("Device: **cpu**.\n\n| measure | value |\n|---|---|\n| a [b] | 1 |\n| c | 2 |\n\n"
                                "Targets:\n- fast: met\n- small: not met\n- gpu: not measured")
    docs = tmp_path / "B.md"
    docs.write_text("# Results\n\n<!-- x:begin -->\nold\n<!-- x:end -->\n\nafter\n")
    out = io.StringIO()
    from rich.console import Console

    publish("x", blocks, str(docs), console=Console(file=out, width=100))
    assert docs.read_text() == f"# Results\n\n<!-- x:begin -->\n{markdown(blocks)}\n<!-- x:end -->\n\nafter\n"
    assert "a [b]" in out.getvalue() and "Device: **cpu**." in out.getvalue()  # cells as they are: no markup
    write_section(docs, "y", "new")  # a section the file lacks is appended
    assert docs.read_text().endswith("after\n\n<!-- y:begin -->\nnew\n<!-- y:end -->\n")
    with pytest.raises(ValueError, match="a row of 1 cells in a table of 2 columns"):
        Table(("a", "b"), [("only",)])


@pytest.mark.slow
def test_the_gpu_slots_check_runs_its_rows_part_on_the_cpu(tmp_path):
    """`gpu_check`'s slots step on a CPU at the smallest size: part (a), the rows compared bit for bit."""
    out = tmp_path / "q.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_slots", "--device", "cpu", "--quick", "--skip_b",
                           "--ns", "1", "2", "--iters", "2", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    per_n = json.loads(out.read_text())["a"]["per_n"]
    assert set(per_n) == {"1", "2"} and not [r["error"] for r in per_n.values() if "error" in r]
    assert all(r["policy_equal"] and r["critic_equal"] for r in per_n.values())
