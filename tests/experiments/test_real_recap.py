"""real_recap against a SimRobotServer on loopback: complete episodes with intervention flags and labels."""

import json

import numpy as np
import pytest

from envs.robot_bridge import SimRobotServer
from experiments.real_recap import parse_script
from experiments.run import main
from rollout.npz_recorder import read_npz_episode
from rollout.zarr_reader import ZarrEpisodeReader
from tests.policies.tiny import save_tiny_checkpoints


def test_real_recap_records_operator_labels_and_interventions(tmp_path):
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    summary = tmp_path / "s.json"
    with SimRobotServer(image_size=16) as server:
        port = server.address[1]
        assert main(["real_recap", "--robot.port", str(port), "--episodes", "2", "--seed", "7",
                     "--out", str(tmp_path / "run"), "--policy", policy, "--critic", critic, "--n_exec", "2",
                     "--operator", "script", "--script", "2:takeover_on", "5:takeover_off", "8:end_success",
                     "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert data["episodes"] == 2 and data["successes"] == 2 and data["stop_reasons"] == {"operator_end": 2}
    assert data["interventions_per_episode"] == 3.0
    reader = ZarrEpisodeReader(data["store"])
    assert len(reader) == 2
    ep = reader.episode(0)
    assert ep.meta.success and ep.meta.length == 9 and ep.meta.seed == 7
    assert ep.steps["intervention"].tolist() == [False, False, True, True, True, False, False, False, False]
    assert np.isnan(ep.steps["policy_action"][2:5]).all()
    npz = sorted((tmp_path / "run" / "npz").glob("*.npz"))
    assert len(npz) == 2 and read_npz_episode(npz[1]).meta.seed == 8


def test_bad_arguments():
    with pytest.raises(ValueError, match="robot.port is required"):
        main(["real_recap", "--operator", "none"])
    with pytest.raises(ValueError, match="STEP:KIND"):
        parse_script(("3:dance",))
    assert parse_script(("4:coach:go left", "4:estop"))[4][0].text == "go left"


def test_sim_robot_server_experiment_serves_and_stops(tmp_path):
    out = tmp_path / "s.json"
    assert main(["sim_robot_server", "--port", "0", "--seconds", "0.3", "--image_size", "16", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["address"][0] == "127.0.0.1"
