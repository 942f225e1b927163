"""Errors in a user's code told as a user reads them: one line naming the object and the method (or factory),
then the user's own traceback frames (none of this project's, Ray's, the standard library's or the numeric
libraries'). Standard library only: every layer raises and reads these.

    with calling(critic, "value"):          # DistanceCritic.value raised KeyError: 'obs'
        answer = critic.value(obs)          #   File "/lab/mylab/critic.py", line 12, in value ...

`UserCodeError` carries the frames as text (`frames`), so they travel from a Ray actor to the driver and into
a run's summary; `str()` of one is its one line.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB = tuple(os.path.abspath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"],
                                                      sysconfig.get_paths()["platstdlib"]})
_SITE_DIRS = ("site-packages", "dist-packages")
# libraries whose frames say nothing about a user's bug (the user's own frames are above them)
_FRAMEWORKS = frozenset({"ray", "numpy", "torch", "gymnasium", "mujoco", "zarr", "tyro", "capsule_rollout"})
FRAMES_SHOWN = 12
"""The most frames kept (the innermost ones)."""


class UserCodeError(RuntimeError):
    """A user's env, policy, critic or factory raised, or answered against its contract. `str()`: one line
    naming the object and method; `frames`: the user's own traceback frames, formatted (may be empty)."""

    def __init__(self, message: str, frames: str = "", *, stop_reason: str | None = None) -> None:
        super().__init__(message)
        self.message, self.frames = message, frames
        if stop_reason is not None:  # what the host records the episode's end as (e.g. a remote policy's)
            self.stop_reason = stop_reason

    def details(self) -> str:
        """The line and the frames below it."""
        return join(self.message, self.frames)

    def __reduce__(self):  # crosses process boundaries (Ray) whole
        return (_rebuild, (self.message, self.frames, getattr(self, "stop_reason", None)))


def _rebuild(message: str, frames: str, stop_reason: str | None) -> UserCodeError:
    return UserCodeError(message, frames, stop_reason=stop_reason)


class ContractError(UserCodeError, ValueError):
    """A user's object answered against its contract (a chunk of the wrong shape, a value that is no number):
    the message names the object, the method and the fix ("DistanceCritic.value returned ndarray (1,): return
    a float")."""

    def __reduce__(self):
        return (ContractError, (self.message, self.frames))


def join(line: str, frames: str) -> str:
    """A one-line message and the frames under it."""
    return f"{line}\n{frames}" if frames else line


def _is_users(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE) or path.startswith(_STDLIB):
        return False
    parts = path.split(os.sep)
    for i, part in enumerate(parts[:-1]):
        if part in _SITE_DIRS and parts[i + 1] in _FRAMEWORKS:
            return False
    return True


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


def user_frames(exc: BaseException | None) -> str:
    """The frames of `exc`'s traceback in the user's own code, formatted as Python prints them: from the
    innermost exception of its chain (`__cause__`, `__context__`) that has any; a `UserCodeError`'s own; "" when
    no frame is the user's (the one line says it all)."""
    chain = list(_chain(exc))
    for item in chain:
        if isinstance(item, UserCodeError) and item.frames:
            return item.frames
    for item in reversed(chain):
        frames = [f for f in traceback.extract_tb(item.__traceback__) if _is_users(f.filename)]
        if frames:
            return "".join(traceback.format_list(frames[-FRAMES_SHOWN:])).rstrip()
    return ""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`Type: message` on one line (a long message cut)."""
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe(exc: BaseException) -> tuple[str, str]:
    """(one line, the user's frames) of any exception: a `UserCodeError`'s own, else `Type: message`."""
    if isinstance(exc, UserCodeError):
        return exc.message, exc.frames or user_frames(exc.__cause__)
    return one_line(exc), user_frames(exc)


def name_of(obj: Any) -> str:
    """How a user calls the object: its class's name (a function's or class's own name when given one)."""
    if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__") and not hasattr(obj, "__self__") \
            and type(obj).__name__ == "function":
        return obj.__qualname__
    return type(obj).__name__


@contextmanager
def calling(obj: Any, method: str) -> Iterator[None]:
    """Run a call into `obj.method`: what it raises comes out as a `UserCodeError` ("Critic.value raised
    KeyError: 'obs'") with the user's frames, caused by the original (a `stop_reason` it names is kept)."""
    try:
        yield
    except UserCodeError:
        raise
    except Exception as exc:
        raise UserCodeError(f"{name_of(obj)}.{method} raised {one_line(exc)}", user_frames(exc),
                            stop_reason=getattr(exc, "stop_reason", None)) from exc
