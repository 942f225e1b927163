"""Frozen config dataclasses <-> command-line options.

Each field's help is its attribute docstring (the string literal right after the
field). Nested dataclass fields (option groups) become dotted options (`--robot.host`); an
error from a group's own checks names the group's options. A config class
may keep old option names working for one release: `ALIASES = {"old": "new.dotted"}`
(a ClassVar on the top-level config) adds `--old` as a second name of `--new.dotted`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import textwrap
import types
import typing
from functools import cache
from typing import Any


class ConfigError(ValueError):
    """A command line does not describe a valid config; the message says how to fix it."""


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass, keyed by field name."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], True
    return tp, False


def _scalar_parser(tp: Any, option: str):
    if typing.get_origin(tp) is typing.Literal:
        choices = typing.get_args(tp)

        def parse_choice(text: str):
            for c in choices:
                if str(c) == text:
                    return c
            close = difflib.get_close_matches(text, [str(c) for c in choices], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {[str(c) for c in choices]}{hint}")

        return parse_choice
    if tp is bool:

        def parse_bool(text: str) -> bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (use true/false)")

        return parse_bool
    if tp in (int, float, str):
        return tp
    raise TypeError(f"option {option}: unsupported config field type {tp!r}")


def flat_fields(config: Any, prefix: str = "") -> list[tuple[str, Any, Any, str]]:
    """(dotted name, type, value, doc) for every leaf field of a config instance."""
    cls = type(config)
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out += flat_fields(value, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", hints[f.name], value, docs.get(f.name, "")))
    return out


def _metavar(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return "{" + ",".join(str(c) for c in typing.get_args(tp)) + "}"
    return getattr(tp, "__name__", "VALUE").upper()


def aliases(config_cls: type) -> dict[str, list[str]]:
    """Dotted field name -> its old option names (`ALIASES` of the config class), checked."""
    out: dict[str, list[str]] = {}
    for old, new in getattr(config_cls, "ALIASES", {}).items():
        out.setdefault(new, []).append(old)
    return out


def add_config_options(parser: argparse.ArgumentParser, defaults: Any) -> None:
    """Add one option per (leaf) field of the config `defaults`, help from its docstring."""
    old_names = aliases(type(defaults))
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, tp, default, doc in flat_fields(defaults):
        where = parser
        if "." in name:  # an option group: its options listed together under the group's docstring
            head = name.split(".", 1)[0]
            if head not in groups:
                group_doc = inspect.getdoc(type(getattr(defaults, head))) or ""
                groups[head] = parser.add_argument_group(f"--{head}.* options", group_doc)
            where = groups[head]
        names = [name, *old_names.pop(name, [])]
        options = [f"--{n}" for n in names]
        option = options[0]
        base, optional = _unwrap_optional(tp)
        doc = doc.replace("%", "%%")  # argparse formats help with %
        if len(names) > 1:
            doc += f" (old name{'s' if len(names) > 2 else ''} {', '.join(options[1:])} still accepted)"
        help_text = f"{doc} (default: {default!r})"
        if base is bool and not optional:
            where.add_argument(*options, dest=name, nargs="?", const=True, type=_scalar_parser(bool, option),
                                default=default, metavar="BOOL", help=f"{doc} (default: {default})")
            where.add_argument(*(f"--no-{n}" for n in names), dest=name, action="store_false",
                                help=argparse.SUPPRESS)
        elif typing.get_origin(base) is tuple:
            elem = typing.get_args(base)[0]
            where.add_argument(
                *options, dest=name, nargs="*", type=_scalar_parser(elem, option), default=default,
                help=help_text, metavar=_metavar(elem),
            )
        else:
            parse = _scalar_parser(base, option)
            if optional:
                inner = parse

                def parse(text: str, inner=inner):  # noqa: E731 - "none" clears an optional field
                    return None if text.lower() == "none" else inner(text)

            where.add_argument(*options, dest=name, type=parse, default=default, help=help_text,
                                metavar=_metavar(base))
    if old_names:
        raise TypeError(f"{type(defaults).__name__}.ALIASES names fields that do not exist: {sorted(old_names)}")


def build_config(cls: type, values: dict[str, Any]) -> Any:
    """Rebuild a (possibly nested) config from flat dotted values; validation runs here."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            prefix = f"{f.name}."
            try:
                kwargs[f.name] = build_config(tp, {k[len(prefix):]: v for k, v in values.items()
                                                   if k.startswith(prefix)})
            except ConfigError as exc:  # a group's check names its fields: say which options they are
                raise ConfigError(f"--{prefix}*: {exc}") from None
        elif f.name in values:
            value = values[f.name]
            kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def check_unknown(unknown: list[str], parser: argparse.ArgumentParser) -> None:
    """Turn leftover arguments into an error with a "did you mean" hint."""
    if not unknown:
        return
    known = [s for action in parser._actions for s in action.option_strings]
    bad = unknown[0]
    flag = bad.split("=", 1)[0]
    close = difflib.get_close_matches(flag, known, n=2)
    hint = f"; did you mean {' or '.join(close)}?" if close else "; see --help for the options"
    what = "option" if bad.startswith("-") else "argument"
    raise ConfigError(f"unknown {what} {bad!r}{hint}")
