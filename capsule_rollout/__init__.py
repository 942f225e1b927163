"""capsule-rollout: robot RL rollouts on Ray, every episode reset, branched and replayed bit for bit from
execution-state capsules.

The layers are subpackages (`capsule_rollout.capsules`, `.envs`, `.policies`, `.critics`, `.models`,
`.rollout`, `.learning`, `.commands`, `.cli`; docs/DESIGN.md section 2). Importing
this package, or any of them, only defines things: no environment variable is written and nothing is
registered (the tabletop gymnasium ids: `capsule_rollout.tabletop.register_envs()`). The command line:
`python -m capsule_rollout NAME [--field value ...]` (or the `capsule-rollout` script).
"""

from importlib.metadata import PackageNotFoundError, version


def _version() -> str:
    for name in ("capsule-rollout", "capsule-rollout-robot"):  # the whole project, or its robot side alone
        try:
            return version(name)
        except PackageNotFoundError:
            pass
    return "0+unknown"  # run from a checkout that was never installed


__version__ = _version()
