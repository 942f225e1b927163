"""The key this user's capsules are signed with, configured once.

Capsule files are signed (`save_capsule(..., key=)`) and checked (`load_capsule(..., key=)`) on every path
that writes or reads them: the actors' initial capsules, `replay`, the verify scenarios, a `CapsuleStore`'s
disk tier. The key comes from, in order:

1. `CAPSULE_ROLLOUT_KEY`: the key itself (16 characters or more);
2. `CAPSULE_ROLLOUT_KEY_FILE`: a file holding it;
3. `$XDG_CONFIG_HOME/capsule_rollout/capsule.key` (`~/.config/...` by default), made on first use with 32
   random bytes (hex), readable by its owner only.

Machines that share capsules share the key (copy the file, or set the variable on each); a Ray driver hands
its key to the actors it starts, so a cluster needs it only where the driver runs.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

KEY_ENV = "CAPSULE_ROLLOUT_KEY"
KEY_FILE_ENV = "CAPSULE_ROLLOUT_KEY_FILE"
MIN_KEY_BYTES = 16


class SigningKeyError(ValueError):
    """The configured key cannot be used; the message says where it came from and what to fix."""


def default_key_path() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "capsule_rollout" / "capsule.key"


def key_source() -> str:
    """Where `signing_key()` takes the key from, in words (for messages and summaries)."""
    if os.environ.get(KEY_ENV):
        return f"${KEY_ENV}"
    return str(Path(os.environ.get(KEY_FILE_ENV) or default_key_path()))


def signing_key(*, create: bool = True) -> bytes:
    """This user's capsule key (see the module docstring); the default file is made when absent and `create`."""
    text = os.environ.get(KEY_ENV)
    if text:
        return _checked(text.strip().encode(), f"${KEY_ENV}")
    named = os.environ.get(KEY_FILE_ENV)
    path = Path(named) if named else default_key_path()
    if not path.exists() and not named and create:
        _make(path)
    try:
        data = path.read_bytes().strip()
    except FileNotFoundError:
        raise SigningKeyError(f"capsule key file {path} does not exist ({'$' + KEY_FILE_ENV if named else 'the default'}"
                              f"): create it (e.g. python -c 'import secrets; print(secrets.token_hex(32))' > {path}) "
                              f"or unset {KEY_FILE_ENV}") from None
    except OSError as exc:
        raise SigningKeyError(f"capsule key file {path} cannot be read ({exc.strerror})") from None
    return _checked(data, str(path))


def _checked(data: bytes, source: str) -> bytes:
    if len(data) < MIN_KEY_BYTES:
        raise SigningKeyError(f"the capsule key from {source} has {len(data)} bytes; a key needs {MIN_KEY_BYTES} or "
                              "more (e.g. python -c 'import secrets; print(secrets.token_hex(32))')")
    return data


def _make(path: Path) -> None:
    """Write a new random key, readable by its owner only, whole or not at all; when another process makes it
    at the same time, the first one's stays."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SigningKeyError(f"cannot make the capsule key file {path} ({exc.strerror}): set {KEY_ENV} or "
                              f"{KEY_FILE_ENV}") from None
    finally:
        tmp.unlink(missing_ok=True)
