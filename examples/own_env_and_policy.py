"""Your own MuJoCo env, an openpi-style `infer(obs)` policy and a `value(obs)` critic on 2 Ray actors: capsule
resets, every episode recorded, one replayed bit for bit. `python -m examples.own_env_and_policy` (README.md)."""
import gymnasium as gym
import mujoco
import numpy as np

XML = """<mujoco><worldbody><light pos="0 0 2"/><geom type="plane" size="1 1 .1"/>
<body name="puck" pos="0 0 .05"><joint name="x" type="slide" axis="1 0 0"/><joint name="y" type="slide"
axis="0 1 0"/><geom type="sphere" size=".05"/></body><body name="goal" mocap="true"><geom type="cylinder"
size=".06 .005" contype="0" conaffinity="0" rgba="0 1 0 1"/></body></worldbody><actuator><motor joint="x"
ctrlrange="-1 1"/><motor joint="y" ctrlrange="-1 1"/></actuator></mujoco>"""


class PuckToGoal(gym.Env):
    """Push a puck onto a goal drawn from the seed (kept in MjData as a mocap body's position)."""
    metadata = {"render_fps": 100}  # its control rate (5 steps of 2 ms), kept with its stores for export_lerobot
    def __init__(self):
        self.model = mujoco.MjModel.from_xml_string(XML)
        self.data = mujoco.MjData(self.model)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (6,), np.float64)

    def observe(self):  # puck position, velocity; goal position
        return np.concatenate([self.data.qpos, self.data.qvel, self.data.mocap_pos[0, :2]])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        mujoco.mj_resetData(self.model, self.data)
        self.data.mocap_pos[0, :2] = self.np_random.uniform(-0.4, 0.4, 2)
        mujoco.mj_forward(self.model, self.data)
        return self.observe(), {}

    def step(self, action):
        self.data.ctrl[:] = action
        mujoco.mj_step(self.model, self.data, nstep=5)
        done = bool(np.linalg.norm(self.data.qpos - self.data.mocap_pos[0, :2]) < 0.05)  # on the goal
        return self.observe(), float(done), done, False, {"success": done}


class PushTowardGoal:
    """A chunk of 8 actions per call; its exploration is the `noise` it is handed (so capsules replay it)."""
    chunk_length = 8

    def infer(self, obs, *, noise):
        s = obs["state"]
        return np.clip(3.0 * (s[4:6] - s[0:2]) - 0.5 * s[2:4] + 0.2 * noise, -1.0, 1.0)  # the chunk (8, 2)


class GoalDistance:
    def value(self, obs):  # a critic: how good the state is (here: minus the puck's distance to the goal)
        return -float(np.linalg.norm(obs["state"][4:6] - obs["state"][0:2]))


def make_env(steps: int = 150):  # as its users make it (gymnasium's TimeLimit); `make_env={"steps": 50}`: 50
    return gym.wrappers.TimeLimit(PuckToGoal(), max_episode_steps=steps)


make_policy, make_critic = PushTowardGoal, GoalDistance  # factories, called in each process that plays episodes


if __name__ == "__main__":
    from capsule_rollout.rollout import record_rollouts, replay_episode
    me = __spec__.name  # this module, as the actors import it
    run = record_rollouts("runs/example", env=f"{me}:make_env", policy=f"{me}:make_policy", critic=f"{me}:make_critic",
                          seeds=range(3), repeats=2)
    print("resets", run.summary["reset_kinds"], "successes", run.summary["successes"], "of", run.summary["episodes"])
    print("replay bit-identical:", replay_episode(run.out, run.episode_ids[-1]).exact)
