"""MuJoCo tabletop tasks (gymnasium API) and, later, the robot bridge; imports only `capsules`.

Importing this package picks MuJoCo's offscreen GL backend (`envs.gl_backend`),
so import it before `mujoco`, and registers the gymnasium ids (mujoco loads lazily, at
`gymnasium.make`): `TabletopPickPlace-v0`, `TabletopStack-v0`,
`TabletopArrange-v0`, `TabletopSort-v0`.
"""

import gymnasium  # noqa: E402

from envs import gl_backend  # noqa: F401  (first: chooses MUJOCO_GL before any module loads mujoco)

ENV_IDS = {
    "TabletopPickPlace-v0": "pick_place",
    "TabletopStack-v0": "stack",
    "TabletopArrange-v0": "arrange",
    "TabletopSort-v0": "sort",
}

for _env_id, _family in ENV_IDS.items():
    if _env_id not in gymnasium.registry:
        gymnasium.register(_env_id, entry_point="envs.tabletop_env:TabletopEnv", kwargs={"family": _family})
