"""How far a capsule's bytes are trusted when they are restored: `Trust`, carried by a `Capsule` in memory (set by
whoever read it, never read from a file), and the classes a user declares safe to make from a capsule at the data
level. The levels (docs/how-to/sharing-capsules.md and docs/DESIGN.md carry the same table):

- `OWN`: a capsule made in this process, or read from a file signed with this user's key. A restore sets what the
  env made: any state of the env's own graph (`capsules.graph.state`), instances of its classes made fresh.
- `DATA` (`replay --trust`): a file not signed with this user's key, the user vouching for its source. A restore
  sets data only: MuJoCo's values (never MjModel's integer arrays: the env's adapter refuses a change), arrays,
  numbers, strings, bytes and containers of them, generators of numpy's and random's own classes (made by their
  constructors, set through their state API, their positions checked), enum members; an instance only
  where the env built here holds one of the same class at that place; a class, function, module or bound method
  only where the env built here holds that very object at that place; never an instance made fresh, but of a
  class `add_safe_types` named (`capsules.data_only`). Anything more is refused naming its place and type.
- `CODE` (`replay --trust-code`): a file not signed with this user's key, treated as code. As `OWN`: as powerful
  as pickle (the env's own code then runs on whatever objects the file describes): only for files you would run.

At every level the reader stays in its bounds (`capsules.state_reader`): it runs nothing a file names, allocates
within its budget and fails with its one error.
"""

from __future__ import annotations

import contextvars
import enum


class Trust(str, enum.Enum):
    """How far a capsule's bytes are trusted (the module docstring's table)."""

    OWN = "own"
    DATA = "data"
    CODE = "code"

    @classmethod
    def parse(cls, value: Trust | str) -> Trust:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"a trust level is one of {[t.value for t in cls]}, got {value!r}") from None


_RESTORING: contextvars.ContextVar[Trust] = contextvars.ContextVar("capsule_restore_trust", default=Trust.OWN)
_SAFE_TYPES: dict[str, type] = {}


class _Restoring:
    __slots__ = ("trust", "token")

    def __init__(self, trust: Trust) -> None:
        self.trust = trust

    def __enter__(self) -> None:
        self.token = _RESTORING.set(self.trust)

    def __exit__(self, *exc: object) -> None:
        _RESTORING.reset(self.token)


def restoring_as(trust: Trust) -> _Restoring:
    """Within the block (`with restoring_as(trust):`), components restore at `trust` (`capsules.restore` and `fork`
    set it from the capsule). A plain class, not a generator: it is entered at every restore."""
    return _Restoring(trust)


def current_trust() -> Trust:
    """The trust level of the capsule being restored now (`OWN` outside a restore)."""
    return _RESTORING.get()


def add_safe_types(*classes: type) -> None:
    """Declare classes whose instances a data-level restore (`--trust`) may make fresh from a capsule, as torch's
    `add_safe_globals` does for its loader: plain records whose methods do nothing a field could turn into code
    (no `eval`, no import by a name held in a field, no call of a field). Their instances are made by `__new__` and
    their attributes set from the capsule's values, which are themselves checked as data."""
    for c in classes:
        if not isinstance(c, type):
            raise TypeError(f"add_safe_types takes classes, got {c!r}")
        _SAFE_TYPES[f"{c.__module__}:{c.__qualname__}"] = c


def safe_type(cls: type) -> bool:
    """Whether `add_safe_types` named this very class."""
    return _SAFE_TYPES.get(f"{cls.__module__}:{cls.__qualname__}") is cls
