"""Suites of third-party MuJoCo envs and the one registry that names them.

An env id is `suite:task` (`gymnasium:Pusher-v5`, `metaworld:pick-place-v3`,
`robotics:FetchPickAndPlace-v4`) or an import path `package.module:factory` whose
factory returns a `RolloutEnv` or a gymnasium MuJoCo env (wrapped with the default
capture: MjData, generators and known wrappers; no declared attributes).
Each suite's declarations live in one small module (`envs/suites/<module>.py`).
"""

from capsule_rollout.envs.suites.catalog import (
    SUITES,
    Suite,
    SuiteUnavailableError,
    expert_for,
    make_env,
    parse_env_id,
    suite_tasks,
)

__all__ = ["SUITES", "Suite", "SuiteUnavailableError", "expert_for", "make_env", "parse_env_id", "suite_tasks"]
