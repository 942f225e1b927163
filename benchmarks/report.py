"""The one renderer of the benchmarks' results: a report is paragraphs and tables, printed to the console and, with
`--docs`, written as markdown into the benchmark's section of that file (between `<!-- name:begin -->` and
`<!-- name:end -->`: docs/BENCHMARKS.md keeps its prose around each section)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich import table as rich_table
from rich.console import Console
from rich.text import Text

from capsule_rollout.cli.console import make_console


@dataclass(frozen=True)
class Table:
    """A result table: its columns and rows of cells (text); the title is the console's alone."""

    columns: Sequence[str]
    rows: Sequence[Sequence[str]]
    title: str = ""

    def __post_init__(self) -> None:
        wrong = [row for row in self.rows if len(row) != len(self.columns)]
        if wrong:
            raise ValueError(f"a row of {len(wrong[0])} cells in a table of {len(self.columns)} columns: {wrong[0]}")

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in self.rows])

    def rich(self) -> rich_table.Table:
        table = rich_table.Table(title=self.title or None)
        for column in self.columns:
            table.add_column(Text(column))
        for row in self.rows:
            table.add_row(*(Text(cell) for cell in row))  # cells as they are: no console markup
        return table


Block = str | Table  # a paragraph (lines joined by "\n") or a table


def markdown(blocks: Sequence[Block]) -> str:
    """The report as markdown: its blocks, a blank line between each two."""
    return "\n\n".join(b.markdown() if isinstance(b, Table) else b for b in blocks)


def targets(met: dict[str, bool | None]) -> str:
    """A report's targets, one line each: met, not met, or not measured (None)."""
    words = {True: "met", False: "not met", None: "not measured"}
    return "\n".join(["Targets:", *(f"- {name}: {words[None if ok is None else bool(ok)]}" for name, ok in met.items())])


def publish(section: str, blocks: Sequence[Block], docs: str = "", console: Console | None = None) -> None:
    """Print the report; with `docs`, write it into that file's `section`."""
    console = console or make_console()
    for block in blocks:
        if isinstance(block, Table):
            console.print(block.rich())
        else:
            console.print(block, markup=False, highlight=False)
    if docs:
        write_section(docs, section, markdown(blocks))
        console.print(f"results written to {docs} ({section})", markup=False, highlight=False)


def write_section(path: str | Path, name: str, body: str) -> Path:
    """Replace (or append) the block between `<!-- name:begin -->` and `<!-- name:end -->` with `body`."""
    path = Path(path)
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + ("\n\n" if text else "") + block + "\n"
    path.write_text(text)
    return path
