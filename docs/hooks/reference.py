"""The reference pages, made from the code at every docs build (an MkDocs hook, `mkdocs.yml`: `hooks`).

- `reference/commands.md`: every command in the command registry (`capsule_rollout.commands.registry`) with every
  option of its config, its old names, type, default and the help `--help` shows (the field's docstring).
- `reference/api/<package>.md`: the public face of each package that names one (`__all__`, or the lazy
  `_EXPORTS` table behind it), one mkdocstrings block per name, read from the source by griffe.

Nothing here imports MkDocs but `on_files` (the hook itself), so tests/docs import the generators without it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "capsule_rollout"
COMMANDS_PAGE = "reference/commands.md"
MODULES_PAGE = "reference/modules.md"
API_DIR = "reference/api"


# ---- commands -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    name: str  # dotted, without dashes: "seeds.count"
    old_names: tuple[str, ...]  # "--episodes"
    type: str
    default: str
    help: str


@dataclass(frozen=True)
class Group:
    name: str  # "seeds"
    help: str


def _source_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring (the string after the field), else the comment on the field's line."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        lines = source.splitlines()
        body = ast.parse(source).body[0].body
        for stmt, after in zip(body, [*body[1:], None]):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
            else:
                rest = lines[stmt.end_lineno - 1][stmt.end_col_offset:].strip()
                if rest.startswith("#"):
                    docs[stmt.target.id] = rest.lstrip("#").strip()
    return docs


def type_name(tp: Any) -> str:
    """A field's type as `--help` spells its value: INT, {a,b}, STR ..., INT|none."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "{" + ",".join(str(a) for a in args) + "}"
    if origin is tuple:
        return f"{type_name(args[0])} ..." if len(args) == 2 and args[1] is Ellipsis else " ".join(map(type_name, args))
    if args and type(None) in args:  # X | None
        return "|".join(type_name(a) for a in args if a is not type(None)) + "|none"
    if tp is bool:
        return "[BOOL]"
    return getattr(tp, "__name__", str(tp)).upper()


def default_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return " ".join(map(default_text, value)) if value else "(none given)"
    if value == "":
        return '""'
    return str(value)


def command_options(config: Any) -> list[Option | Group]:
    """Every option of a command's config, in the order `--help` lists them; a group's header before its options."""
    from capsule_rollout.commands.option_parsing import old_names

    renamed = old_names(config)
    out: list[Option | Group] = []

    def walk(obj: Any, prefix: str, group_help: str = "") -> None:
        hints = typing.get_type_hints(type(obj))
        docs = _source_docs(type(obj))
        for f in dataclasses.fields(obj):
            value, name = getattr(obj, f.name), prefix + f.name
            if dataclasses.is_dataclass(hints[f.name]):
                own = inspect.getdoc(type(value)) or ""
                if own.startswith(type(value).__name__ + "("):  # the signature dataclasses write when none is given
                    own = ""
                said = docs.get(f.name, "")
                out.append(Group(name, f"{own} ({said})" if own and said else own or said))
                walk(value, name + ".")
            else:
                out.append(Option(name, renamed.get(name, ()), type_name(hints[f.name]), default_text(value),
                                  " ".join(docs.get(f.name, "").split())))

    walk(config, "")
    return out


def command_names() -> list[str]:
    from capsule_rollout.commands import registry

    return registry.names()


def _md(text: str) -> str:
    """Prose for Markdown: `<`, `>` and `*` outside code spans shown as they are."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*")
    return "`".join(parts)


COMMANDS_INTRO = """\
# Commands

Every command of `python -m capsule_rollout NAME [--option value ...] [--json PATH]` (also the `capsule-rollout`
script), with every option, made from the command registry (`capsule_rollout/commands/registry.py`) and each
option's docstring when the site is built: the same text `python -m capsule_rollout NAME --help` prints.

How the command line reads:

- `--key value` or `--key=value`; a bool option as `--flag`, `--flag true|false` or `--no-flag`; `none` clears an
  optional value; a mistyped option or choice gets the closest ones; a value a config's checks refuse gets one
  `error:` line (exit 2).
- Options that several commands share come in groups, spelled dotted: `--model.policy`, `--model.critic` (the
  checkpoints), `--act.advantage`, `--act.beta`, `--act.n_exec`, `--act.noise_scale` (how the policy acts; each
  defaults to what the policy checkpoint records), `--seeds.first`, `--seeds.count` (a block of episode seeds),
  `--loop.steps`, `--loop.lr` ... (a training run's loop).
- The flat names the groups replaced (`--policy`, `--episodes`, `--steps` ...) are still accepted for one release;
  each option below lists its old names. The docs use the new ones.
- Every command also takes `--json PATH` (a machine-readable summary written there) and `--help`.
"""


def render_commands() -> str:
    from capsule_rollout.commands import registry

    names = command_names()
    lines = [COMMANDS_INTRO, "| command | what it does |", "|---|---|"]
    lines += [f"| [`{n}`](#{n}) | {_md(registry.get(n).summary)} |" for n in names]
    for n in names:
        experiment = registry.get(n)
        lines += ["", f"## {n}", "", _md(experiment.summary), "", "```text",
                  f"python -m capsule_rollout {n} [OPTIONS] [--json PATH]", "```", ""]
        for item in command_options(experiment.config):
            indent = "    " * item.name.count(".")  # a group's options nested under it
            if isinstance(item, Group):
                lines.append(f"{indent}- **`--{item.name}.*`**: {_md(item.help)}")
                continue
            old = f" (old name{'s' * (len(item.old_names) > 1)} {', '.join(f'`{o}`' for o in item.old_names)})" \
                if item.old_names else ""
            lines.append(f"{indent}- `--{item.name}` `{item.type}` (default `{item.default}`){old}: {_md(item.help)}")
    return "\n".join(lines) + "\n"


# ---- public API -----------------------------------------------------------------------------------------------


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def public_names(module: Path) -> tuple[list[str], dict[str, str]] | None:
    """A module's `__all__` (read from its source, nothing imported) and, for a package whose names load lazily,
    the module each name comes from (`_EXPORTS`); None for a module that names no public face."""
    tree = ast.parse(module.read_text())
    names: list[str] | None = None
    exports: dict[str, str] = {}
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assign):
            continue
        targets = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        targets += [e.id for t in stmt.targets if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Name)]
        if "_EXPORTS" in targets and isinstance(_literal(stmt.value), dict):
            exports = _literal(stmt.value)
        if "__all__" in targets:
            value = _literal(stmt.value)
            names = list(value) if isinstance(value, list | tuple) else sorted(exports)
    return None if names is None else (names, exports)


def public_modules() -> dict[str, tuple[list[str], dict[str, str]]]:
    """`capsule_rollout.<name>` -> (its public names, where lazily exported ones live), for each top-level
    module or package of the project that has an `__all__`."""
    out = {}
    for path in sorted(PACKAGE.iterdir()):
        source = path / "__init__.py" if path.is_dir() else path
        if path.name.startswith("_") or source.suffix != ".py" or not source.exists():
            continue
        found = public_names(source)
        if found is not None:
            out[f"capsule_rollout.{path.stem}"] = found
    return out


def render_api_page(module: str, names: list[str], exports: dict[str, str]) -> str:
    lines = [f"# `{module}`", "", f"::: {module}", "    options:", "      members: false",
             "      show_root_heading: false", "      show_root_toc_entry: false", ""]
    for name in names:
        target = f"{exports[name]}.{name}" if name in exports else f"{module}.{name}"
        lines += [f"::: {target}", "    options:", f"      toc_label: {name}", ""]
    return "\n".join(lines)


def api_pages() -> dict[str, str]:
    pages = {f"{API_DIR}/{m.removeprefix('capsule_rollout.')}.md": render_api_page(m, *found)
             for m, found in public_modules().items()}
    index = ["# Public API", "", "What a user imports: each package's public face (its `__all__`), from the",
             "docstrings in the code. Deep module paths are the package's own.", "", "| module | names |", "|---|---|"]
    for m, (names, _) in public_modules().items():
        index.append(f"| [`{m}`]({m.removeprefix('capsule_rollout.')}.md) | {len(names)} |")
    pages[f"{API_DIR}/index.md"] = "\n".join(index) + "\n"
    return pages


# ---- modules ------------------------------------------------------------------------------------------------


def first_paragraph(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


MODULES_INTRO = """\
# Modules

Every module of the package, by package, each with the first paragraph of its docstring (made from the code when
the site is built). Imports go one way, and a test parses them: the [design](../DESIGN.md), section 2, draws
the layers. A user imports from the packages' public faces ([public API](api/index.md)); deep module paths are
the package's own.
"""


def render_modules() -> str:
    lines = [MODULES_INTRO]
    roots = sorted(p for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    lines += ["## `capsule_rollout`", "", _md(first_paragraph(PACKAGE / "__init__.py")), ""]
    lines += [f"- `{p.name}`: {_md(first_paragraph(p))}" for p in roots]
    for package in sorted(p for p in PACKAGE.rglob("*") if (p / "__init__.py").is_file() and p != PACKAGE):
        name = ".".join(package.relative_to(ROOT).parts)
        lines += ["", f"## `{name}`", "", _md(first_paragraph(package / "__init__.py")), ""]
        lines += [f"- `{p.name}`: {_md(first_paragraph(p))}" for p in sorted(package.glob("*.py"))
                  if p.name != "__init__.py"]
    return "\n".join(lines) + "\n"


# ---- the MkDocs hook ------------------------------------------------------------------------------------------


def on_config(config):
    """The nav's "Public API" entry: its index, then a page per public module (as many as the code has)."""
    index = f"{API_DIR}/index.md"
    pages = [index, *({m: f"{API_DIR}/{m.removeprefix('capsule_rollout.')}.md"} for m in public_modules())]

    def expand(items: list) -> None:
        for item in items:
            for title, value in item.items() if isinstance(item, dict) else ():
                if value == index:
                    item[title] = pages
                elif isinstance(value, list):
                    expand(value)

    expand(config["nav"])
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, text in {COMMANDS_PAGE: render_commands(), MODULES_PAGE: render_modules(), **api_pages()}.items():
        files.append(File.generated(config, path, content=text))
    return files
