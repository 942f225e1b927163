"""What an experiment returns, and the machine-readable summary written by `--json`."""

from __future__ import annotations

import json
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsule_rollout.stores.store_damage import StoreDamageError


@dataclass
class ExperimentResult:
    summary: dict[str, Any] = field(default_factory=dict)  # written to --json PATH
    exit_code: int = 0  # non-zero: the experiment's check failed


class UsageError(ValueError):
    """Bad input an experiment found once it looked at its files (a checkpoint, a store): the CLI prints
    the message and exits with status 2, as for a bad option."""


@contextmanager
def checking_inputs():
    """Turn ValueError / FileNotFoundError raised while an experiment checks its inputs into a UsageError (a
    damaged store is no usage error: `StoreDamageError` passes through)."""
    try:
        yield
    except (UsageError, StoreDamageError):
        raise
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from exc


def _jsonable(value: Any) -> Any:
    """Strict JSON: non-finite floats become null, tuples lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> Path:
    """Write `data` as strict JSON, atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(_jsonable(data), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path
