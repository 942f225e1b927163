"""Envs for the rollout host: the env side of the rollout protocol (`rollout_env`), the capsule adapter for any
MuJoCo env (`mujoco_capsule`, the `suites` registry), offscreen rendering, the robot bridge and operator input;
imports only `capsules`. Importing it defines things only: no environment variable is written (the GL backend
is chosen when a renderer is made: `envs.gl_backend`) and nothing is registered."""
