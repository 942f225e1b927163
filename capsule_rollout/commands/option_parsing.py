"""Frozen config dataclasses <-> command-line options, parsed by tyro (imported only when a command line is).

tyro takes each field's help from its docstring, spells nested dataclass fields (option groups) dotted
(`--robot.host`), lists `--help` by group and suggests similar options for a mistyped one. Here: a bool
option takes a value or none (`--shards`, `--shards true`, `--no-shards`), `none` clears an optional field,
a mistyped choice gets "did you mean", an error from a group's own checks names the group's options, and a
top-level config may keep old option names working for one release: `ALIASES = {"old": "new.dotted"}` (a
ClassVar) adds `--old` as a second name of `--new.dotted`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import typing
from collections.abc import Callable
from typing import Annotated, Any

BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


class ConfigError(Exception):
    """A command line does not describe a valid config; the message says how to fix it (one line)."""


def flat_fields(config: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted name, type, value) for every leaf field of a config instance."""
    hints = typing.get_type_hints(type(config))
    out = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out += flat_fields(value, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", hints[f.name], value))
    return out


def old_names(config: Any) -> dict[str, tuple[str, ...]]:
    """Dotted option -> its old names (`--old`), from the top-level config class's `ALIASES`, checked."""
    leaves = {name for name, _, _ in flat_fields(config)}
    out: dict[str, tuple[str, ...]] = {}
    for old, new in getattr(type(config), "ALIASES", {}).items():
        if new not in leaves:
            raise TypeError(f"{type(config).__name__}.ALIASES: {new!r} (for --{old}) is not an option")
        out[new] = (*out.get(new, ()), f"--{old}")
    return out


def negations(argv: list[str], config: Any) -> list[str]:
    """`--no-flag` (any bool option, by its name or an old one) as `--flag false`, the form tyro parses here."""
    bools = {name for name, tp, _ in flat_fields(config) if tp is bool}
    bools |= {old for old, new in getattr(type(config), "ALIASES", {}).items() if new in bools}
    out = []
    for arg in argv:
        name = arg[5:].replace("-", "_") if arg.startswith(("--no-", "--no_")) else None
        out += [f"--{name}", "false"] if name in bools else [arg]
    return out


def _help(helptext: Any, old: tuple[str, ...] = (), group: type | None = None) -> Callable[[], str | None]:
    """A field's help as one paragraph (its docstring's line breaks are the source's), naming its old names; a
    group's: its class's docstring, then what the field that holds it says."""

    def text() -> str | None:
        doc = helptext() if callable(helptext) else helptext
        if group is not None:
            doc = " ".join(filter(None, [inspect.getdoc(group), doc and f"({doc})"]))
        if not doc:
            return None
        return " ".join(doc.split()) + (f" (old name{'s' * (len(old) > 1)} {', '.join(old)} still accepted)" if old else "")

    return text


def _check_finite(config: Any, prefix: str) -> None:
    """Every float option is a finite number: none of them means anything at NaN or infinity (an option that
    can be off or unbounded says so with `none` or 0)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise ConfigError(f"--{prefix}{f.name} must be a finite number, got {value} (--help says what none or 0 "
                              "means for it)")


def _registry(config: Any):
    """tyro's rules for these configs: bools, `none`, choices with a hint; old names and group errors."""
    import tyro
    from tyro.constructors import ConstructorRegistry, PrimitiveConstructorSpec, StructTypeInfo

    registry = ConstructorRegistry()

    @registry.primitive_rule
    def boolean(info):
        if info.type is not bool:
            return None

        def parse(args: list[str]) -> bool:
            if not args:  # a bare --flag
                return True
            if args[0].lower() not in BOOLS:
                raise ValueError(f"{args[0]!r} is not a boolean (use true/false)")
            return BOOLS[args[0].lower()]

        return PrimitiveConstructorSpec(nargs=(0, 1), metavar="[BOOL]", instance_from_str=parse,
                                        is_instance=lambda x: isinstance(x, bool),
                                        str_from_instance=lambda x: [str(x).lower()])

    @registry.primitive_rule
    def none(info):
        if info.type is not type(None):
            return None

        def parse(args: list[str]) -> None:
            if args[0].lower() != "none":
                raise ValueError(f"{args[0]!r} is not none")

        return PrimitiveConstructorSpec(nargs=1, metavar="{none}", instance_from_str=parse,
                                        is_instance=lambda x: x is None, str_from_instance=lambda x: ["none"])

    @registry.primitive_rule
    def choice(info):
        if typing.get_origin(info.type) is not typing.Literal:
            return None
        choices = typing.get_args(info.type)
        names = [str(c) for c in choices]

        def parse(args: list[str]) -> Any:
            if args[0] in names:
                return choices[names.index(args[0])]
            close = difflib.get_close_matches(args[0], names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{args[0]!r} is not one of {names}{hint}")

        return PrimitiveConstructorSpec(nargs=1, metavar="{" + ",".join(names) + "}", instance_from_str=parse,
                                        is_instance=lambda x: x in choices, str_from_instance=lambda x: [str(x)])

    renamed = old_names(config)
    prefixes: dict[int, tuple[Any, str]] = {}  # id(a group's default) -> (that default, kept alive; "act." ...)
    delegating = []  # not empty while tyro's own dataclass rule answers for the rule below

    @registry.struct_rule
    def group(info: StructTypeInfo):
        if delegating or not dataclasses.is_dataclass(info.type):
            return None
        delegating.append(info.type)
        try:
            spec = ConstructorRegistry.get_struct_spec(info)
        finally:
            delegating.pop()
        prefix = prefixes.get(id(info.default), (None, ""))[1]  # "" at the top level
        fields = []
        for f in spec.fields:
            name = prefix + f.name
            if dataclasses.is_dataclass(f.default):  # a group: a default of its own tells this rule where it is
                own = dataclasses.replace(f.default)
                prefixes[id(own)] = (own, name + ".")
                fields.append(dataclasses.replace(f, default=own, helptext=_help(f.helptext, group=type(own))))
            elif name in renamed:
                fields.append(dataclasses.replace(f, type=Annotated[f.type, tyro.conf.arg(aliases=renamed[name])],
                                                  helptext=_help(f.helptext, renamed[name])))
            else:
                fields.append(dataclasses.replace(f, helptext=_help(f.helptext)))

        @functools.wraps(spec.instantiate)  # the group's docstring stays its description in --help
        def instantiate(**kwargs):
            try:
                made = spec.instantiate(**kwargs)
            except ValueError as exc:  # a group's check names its fields: say which options they are
                raise ConfigError(f"--{prefix}*: {exc}" if prefix else str(exc)) from None
            _check_finite(made, prefix)
            return made

        return dataclasses.replace(spec, instantiate=instantiate, fields=tuple(fields))

    return registry


def parse_config(defaults: Any, argv: list[str], prog: str, description: str) -> tuple[Any, str | None]:
    """The config (from `defaults`, a frozen dataclass instance, and the command line) and `--json PATH`.

    A malformed command line or `--help` exits (2 or 0) after tyro prints its message; a config whose
    checks refuse the values raises `ConfigError`."""
    import tyro

    def command(config=defaults, json=None):
        return config, json

    command.__annotations__ = {  # built here: the config class is this command's (the module's are strings)
        "config": Annotated[type(defaults), tyro.conf.arg(name="")],  # its options unprefixed: --steps
        "json": Annotated[str | None, tyro.conf.arg(metavar="PATH", help="write a machine-readable summary here")],
    }
    description += "\n\nA bool option: --flag, --flag true|false or --no-flag; `none` clears an optional value."
    return tyro.cli(command, args=negations(argv, defaults), prog=prog, description=description,
                    use_underscores=True, config=(tyro.conf.FlagConversionOff,), registry=_registry(defaults))
