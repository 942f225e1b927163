"""The framework's renderer sizes its scene to the model (`offscreen_renderer.scene_capacity`): the same images as a
scene of `MAX_GEOM`, and a scene found too small is made again at `MAX_GEOM` before its image, leaving the env's
`MjData` as it was."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from capsule_rollout.envs import offscreen_renderer
from capsule_rollout.envs.gl_backend import select_backend
from capsule_rollout.envs.offscreen_renderer import MAX_GEOM, SCENE_GEOMS, OffscreenRenderer, scene_capacity

pytestmark = pytest.mark.skipif(select_backend() is None, reason="no offscreen OpenGL (EGL or OSMesa)")


def _model(spheres: int) -> mujoco.MjModel:
    """`spheres` coloured spheres in a grid, a site, a tendon between two bodies and a fixed camera over them."""
    geoms = "".join(f"<geom type='sphere' size='.03' pos='{(i % 20) * .08 - .8:.2f} {(i // 20) * .08 - .8:.2f} 0' "
                    f"rgba='{(i * 37 % 255) / 255:.3f} {(i * 91 % 255) / 255:.3f} .5 1'/>" for i in range(spheres))
    return mujoco.MjModel.from_xml_string(f"""
<mujoco>
  <visual><global offwidth="64" offheight="64"/></visual>
  <worldbody>
    <light pos="0 0 3"/>
    <camera name="top" pos="0 0 2.5"/>
    {geoms}
    <body name="a" pos="0 .3 .3"><freejoint/><geom size=".05"/><site name="s1" size=".02"/></body>
    <body name="b" pos="0 -.3 .3"><freejoint/><geom size=".05"/><site name="s2" size=".02"/></body>
  </worldbody>
  <tendon><spatial width=".01"><site site="s1"/><site site="s2"/></spatial></tendon>
</mujoco>""")


def _moved(model: mujoco.MjModel, seed: int) -> mujoco.MjData:
    data = mujoco.MjData(model)
    rng = np.random.default_rng(seed)
    data.qpos[:] = data.qpos + rng.normal(0, .2, model.nq)
    mujoco.mj_forward(model, data)
    return data


def _warnings(data: mujoco.MjData) -> list[tuple[int, int]]:
    return [(w.lastinfo, w.number) for w in data.warning]


def test_a_scene_holds_what_the_model_draws_and_no_more_than_it_needs():
    small, large = _model(8), _model(600)
    assert scene_capacity(small) == SCENE_GEOMS  # 10 geoms, 2 sites, a tendon: the smallest scene
    assert scene_capacity(_model(3000)) == MAX_GEOM  # never larger than before
    renderer = OffscreenRenderer(large, 32, 32)
    try:
        renderer.render(_moved(large, 0), "top")
        assert SCENE_GEOMS < renderer.scene.maxgeom < MAX_GEOM
        assert 605 <= renderer.scene.ngeom and 4 * renderer.scene.ngeom <= renderer.scene.maxgeom  # 4x what it drew
    finally:
        renderer.close()


def test_the_images_are_those_of_a_scene_of_max_geom(monkeypatch):
    model = _model(300)
    sized = OffscreenRenderer(model, 32, 32)
    monkeypatch.setattr(offscreen_renderer, "scene_capacity", lambda m: MAX_GEOM)
    full = OffscreenRenderer(model, 32, 32)
    try:
        assert sized.scene.maxgeom < full.scene.maxgeom == MAX_GEOM
        for seed in range(5):
            data = _moved(model, seed)
            for camera in ("top", -1):
                image = sized.render(data, camera)
                assert image.any() and np.array_equal(image, full.render(data, camera))
    finally:
        sized.close()
        full.close()


def test_a_scene_found_full_is_made_again_whole_and_the_env_s_state_is_left_as_it_was(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # MuJoCo appends its full-scene warning to MUJOCO_LOG.TXT here
    model = _model(40)
    full = OffscreenRenderer(model, 32, 32)
    monkeypatch.setattr(offscreen_renderer, "scene_capacity", lambda m: 8)  # fewer than the 42 geoms it draws
    short = OffscreenRenderer(model, 32, 32)
    try:
        assert short.scene.maxgeom == 8
        data = _moved(model, 1)
        before = _warnings(data)
        image = short.render(data, "top")
        assert short.scene.maxgeom == MAX_GEOM and short.scene.ngeom >= 42
        assert _warnings(data) == before  # mujoco 3.x counts a full scene in MjData.warning: put back
        assert np.array_equal(image, full.render(data, "top"))
        assert np.array_equal(short.render(_moved(model, 2), "top"), full.render(_moved(model, 2), "top"))
    finally:
        short.close()
        full.close()


@pytest.mark.parametrize("name", ["tabletop", "Ant-v5", "Humanoid-v5", "Pusher-v5", "Reacher-v5"])
def test_the_models_the_project_runs_fill_at_most_a_quarter_of_their_scene(name):
    """The bound holds where it matters: the tabletop example and gymnasium's MuJoCo envs (the suites' models are
    measured in docs/DESIGN.md) draw what `scene_capacity` counts or less, so no image of theirs needs the fallback."""
    if name == "tabletop":
        from capsule_rollout.tabletop.tabletop_env import TabletopEnv

        env = TabletopEnv(cameras=())
        env.reset(seed=0)
        model, data = env.model, env.data
    else:
        import gymnasium

        env = gymnasium.make(name)
        env.reset(seed=0)
        model, data = env.unwrapped.model, env.unwrapped.data
    renderer = OffscreenRenderer(model, 32, 32)
    try:
        assert renderer.render(data, -1).any()
        assert 0 < renderer.scene.ngeom and 4 * renderer.scene.ngeom <= renderer.scene.maxgeom < MAX_GEOM
    finally:
        renderer.close()
        env.close()
