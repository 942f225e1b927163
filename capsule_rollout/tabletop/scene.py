"""The tabletop scene: a suction gantry, three coloured blocks and three target pads.

Units: metres, seconds, kilograms. The table top is the plane z = 0; x points right
and y away from the front camera. The end effector (EE) is a suction cup on a
gravity-compensated x/y/z gantry driven by position servos; an adhesion actuator
is the suction. Every input (servo targets, suction) lives in `ctrl`, so the
whole physical state is MuJoCo's `mjSTATE_INTEGRATION`.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCKS = ("red", "green", "blue")
PADS = ("yellow", "purple", "orange")
BLOCK_RGBA = {"red": "0.85 0.12 0.1 1", "green": "0.15 0.7 0.15 1", "blue": "0.1 0.25 0.9 1"}
PAD_RGBA = {"yellow": "0.95 0.85 0.1 1", "purple": "0.6 0.2 0.75 1", "orange": "0.98 0.5 0.05 1"}

BLOCK_HALF = 0.02  # blocks are 4 cm cubes
PAD_RADIUS = 0.045
CUP_HALF_HEIGHT = 0.008
EE_HOME_Z = 0.3  # gantry joint origin height; joint z = EE z - EE_HOME_Z
WORKSPACE_LOW = (-0.25, -0.25, 0.03)  # reachable EE positions (m)
WORKSPACE_HIGH = (0.25, 0.25, 0.30)
SPAWN_HALF = 0.2  # blocks and pads spawn in [-0.2, 0.2]^2
TIMESTEP = 0.002


@dataclass(frozen=True)
class SceneConfig:
    """Physical parameters that shape the dynamics (they enter the env fingerprint)."""

    servo_kp: float = 800.0  # N/m, gantry position servos
    servo_kv: float = 60.0  # N s/m
    suction_gain: float = 15.0  # N, adhesion force at full suction
    block_mass: float = 0.05  # kg
    friction: float = 1.0


def scene_xml(config: SceneConfig = SceneConfig(), max_image: int = 256) -> str:
    """The MJCF of the scene; `max_image` sizes the offscreen buffer."""
    blocks = "\n".join(
        f'    <body name="block_{c}" pos="0 0 {BLOCK_HALF}"><freejoint name="block_{c}"/>'
        f'<geom name="block_{c}" type="box" size="{BLOCK_HALF} {BLOCK_HALF} {BLOCK_HALF}" '
        f'mass="{config.block_mass}" rgba="{BLOCK_RGBA[c]}"/></body>'
        for c in BLOCKS
    )
    pads = "\n".join(
        f'    <body name="pad_{c}" mocap="true" pos="0 0 0.0005"><geom name="pad_{c}" type="cylinder" '
        f'size="{PAD_RADIUS} 0.0005" rgba="{PAD_RGBA[c]}" contype="0" conaffinity="0"/></body>'
        for c in PADS
    )
    kp, kv = config.servo_kp, config.servo_kv
    return f"""
<mujoco model="tabletop">
  <option timestep="{TIMESTEP}" integrator="implicitfast" cone="elliptic" impratio="10"/>
  <visual>
    <quality offsamples="0" shadowsize="0"/>
    <global offwidth="{max_image}" offheight="{max_image}"/>
    <headlight ambient="0.35 0.35 0.35" diffuse="0.45 0.45 0.45" specular="0 0 0"/>
  </visual>
  <default><geom friction="{config.friction} 0.005 0.0001" solref="0.01 1"/></default>
  <worldbody>
    <light pos="0 -0.3 1.2" dir="0 0.25 -1" directional="true" castshadow="false" diffuse="0.4 0.4 0.4"/>
    <geom name="table" type="box" size="0.35 0.35 0.02" pos="0 0 -0.02" rgba="0.55 0.45 0.35 1"/>
    <camera name="front" pos="0 -0.55 0.55" xyaxes="1 0 0 0 0.7 0.7" fovy="55"/>
    <camera name="top" pos="0 0 0.95" xyaxes="1 0 0 0 1 0" fovy="42"/>
    <body name="ee" pos="0 0 {EE_HOME_Z}" gravcomp="1">
      <joint name="ee_x" type="slide" axis="1 0 0" range="-0.3 0.3" damping="5"/>
      <joint name="ee_y" type="slide" axis="0 1 0" range="-0.3 0.3" damping="5"/>
      <joint name="ee_z" type="slide" axis="0 0 1" range="-0.29 0.05" damping="5"/>
      <inertial pos="0 0 0" mass="1" diaginertia="0.01 0.01 0.01"/>
      <geom name="ee_rod" type="cylinder" size="0.008 0.05" pos="0 0 0.06" rgba="0.3 0.3 0.3 1" contype="0" conaffinity="0"/>
      <geom name="cup" type="cylinder" size="0.018 {CUP_HALF_HEIGHT}" rgba="0.15 0.15 0.15 1" margin="0.01" gap="0.01"/>
    </body>
{blocks}
{pads}
  </worldbody>
  <actuator>
    <position name="servo_x" joint="ee_x" kp="{kp}" kv="{kv}" ctrlrange="-0.3 0.3"/>
    <position name="servo_y" joint="ee_y" kp="{kp}" kv="{kv}" ctrlrange="-0.3 0.3"/>
    <position name="servo_z" joint="ee_z" kp="{kp}" kv="{kv}" ctrlrange="-0.29 0.05"/>
    <adhesion name="suction" body="ee" ctrlrange="0 1" gain="{config.suction_gain}"/>
  </actuator>
</mujoco>
"""
