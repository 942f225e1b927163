"""What a run directory may make `replay` run: the host spec signed inside each initial capsule (`run_capsules`) is
the one replay builds from, a capsule is taken only for the seed and task it was signed for, and a run from
elsewhere names no code replay calls unless the user names it or passes `--trust-code` (`capsules.trust`).

`rollout.json` beside the store is not signed: it may be read, never believed over the signed spec. The fields
that name code are the env, policy and critic sources that are import paths (`package.module:factory`, which
`import_path.resolve` would import and call) and the observers; a registered env id (`gymnasium:Reacher-v5`) and a
checkpoint directory name data.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from capsule_rollout.capsules import Trust
from capsule_rollout.envs.suites import parse_env_id
from capsule_rollout.rollout.host_factory import RunSpec

CODE_FIELDS = ("env", "policy", "critic", "observers")
"""The host spec's fields that can name code to import and call."""


def signed_spec(capsule, path: Path) -> RunSpec | None:
    """The host spec a run signed inside a seed's initial capsule (`run_capsules.save_initial_capsule`); None for a
    capsule saved before runs signed it. ValueError for one that does not read as a spec."""
    text = getattr(capsule, "annotations", {}).get("host_spec")
    if text is None:
        return None
    try:
        return RunSpec.from_json(json.loads(text))
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{path}: the host spec signed in the capsule does not read ({exc})") from None


def check_label(capsule, expected: str, path: Path) -> None:
    """A capsule restores only the seed and task it was signed for: a file moved or swapped on disk is refused."""
    if capsule.meta.label != expected:
        raise ValueError(f"{path} holds the initial capsule of {capsule.meta.label!r}, not of {expected!r}: refused "
                         "(a capsule file moved or swapped on disk restores another seed's state)")


def code_names(spec: RunSpec) -> list[tuple[str, str]]:
    """(field, value) of each source in `spec` that names code (the module docstring)."""
    found = []
    if spec.env and parse_env_id(spec.env.partition("=")[0])[0] is None:
        found.append(("env", spec.env))
    for name in ("policy", "critic"):
        source = getattr(spec, name)
        if source and ":" in source and not Path(source).is_dir():
            found.append((name, source))
    found += [("observers", path) for path, _ in spec.observers]
    return found


def _differ(a: RunSpec, b: RunSpec, fields: tuple[str, ...]) -> list[str]:
    return [f for f in fields if getattr(a, f) != getattr(b, f)]


def replay_spec(file_spec: RunSpec, signed: RunSpec | None, trust: Trust, *, named: dict[str, str],
                source: Path) -> RunSpec:
    """The spec a replay builds its host from: the signed one (the run's `rollout.json` must name the same code, or
    the replay is refused naming what differs), the user's `named` sources over it; a run from elsewhere (`trust`
    DATA) may name no other code. `source`: the capsule file, for the messages."""
    spec = file_spec
    if signed is not None:
        differ = _differ(file_spec, signed, CODE_FIELDS)
        if differ:
            f = differ[0]
            raise ValueError(f"rollout.json names other code than the spec signed in {source} ({f}: "
                             f"{getattr(file_spec, f)!r} in the file, {getattr(signed, f)!r} signed): refused, the run "
                             "directory was edited after its run")
        spec = dataclasses.replace(signed, capsule_dir="")
    elif trust is Trust.DATA:
        raise ValueError(f"{source} carries no signed host spec (a run saved before runs signed one), so what the "
                         "run directory names cannot be checked: replay it with --trust-code only if you would run "
                         "its files as code")
    spec = dataclasses.replace(spec, **{k: v for k, v in named.items() if v})
    if trust is Trust.DATA:
        unnamed = [(f, v) for f, v in code_names(spec) if not named.get(f)]
        if unnamed:
            f, v = unnamed[0]
            yours = "" if f == "observers" else f"Give it yourself (--{f} {v!r}, if you know it), or replay"
            raise ValueError(f"the run from elsewhere names code to call ({f} {v!r}): a capsule trusted as data "
                             f"(--trust) never makes replay import what its run names. {yours or 'Replay'} with "
                             "--trust-code only if you would run its files as code")
    return spec
