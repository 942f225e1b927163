"""`ray job submit` against a head this test starts on 127.0.0.1 (every port chosen explicitly)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rollout.zarr_reader import ZarrEpisodeReader
from tests.policies.tiny import save_tiny_checkpoints

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_sim_rollout_as_a_ray_job(tmp_path):
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    (gcs, dash, client, node_mgr, obj_mgr, agent_listen, agent_grpc, runtime_env, metrics) = _free_ports(9)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # short: Ray's socket paths must fit
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--ray-client-server-port", str(client),
         "--node-manager-port", str(node_mgr), "--object-manager-port", str(obj_mgr),
         "--dashboard-agent-listen-port", str(agent_listen), "--dashboard-agent-grpc-port", str(agent_grpc),
         "--runtime-env-agent-port", str(runtime_env), "--metrics-export-port", str(metrics),
         "--min-worker-port", "0", "--max-worker-port", "0", "--num-cpus", "2", "--disable-usage-stats",
         "--temp-dir", temp_dir],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash}"
    out = tmp_path / "run"
    try:
        deadline = time.monotonic() + 120
        while True:  # the job server answers once the dashboard is up
            probe = subprocess.run([RAY, "job", "list", "--address", address], env=env, capture_output=True, text=True)
            if probe.returncode == 0:
                break
            assert head.poll() is None, head.stdout.read()
            assert time.monotonic() < deadline, probe.stderr[-2000:]
            time.sleep(1)
        # no cd: the job runs in a Ray session directory; the editable install finds the project
        entry = [sys.executable, "-m", "experiments.run", "sim_rollout", "--episodes", "2",
                 "--actors", "2", "--out", str(out), "--policy", policy, "--critic", critic, "--n_exec", "2",
                 "--no-progress", "--json", f"{out}/summary.json"]
        submit = subprocess.run([RAY, "job", "submit", "--address", address, "--no-wait", "--", *entry],
                                env=env, capture_output=True, text=True, timeout=120)
        assert submit.returncode == 0, submit.stdout + submit.stderr
        job_id = next(w for w in submit.stdout.split() if w.strip("'").startswith("raysubmit_")).strip("'")
        status = ""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = subprocess.run([RAY, "job", "status", "--address", address, job_id], env=env,
                                    capture_output=True, text=True).stdout
            if any(word in status.lower() for word in ("succeeded", "failed", "stopped")):
                break
            time.sleep(2)
        logs = subprocess.run([RAY, "job", "logs", "--address", address, job_id], env=env,
                              capture_output=True, text=True).stdout
        assert "succeeded" in status.lower(), status + logs[-3000:]
        assert (out / "summary.json").exists(), logs[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["episodes"] == 2 and summary["ray"] not in ("local", "existing")  # joined RAY_ADDRESS
        assert len(ZarrEpisodeReader(out / "episodes.zarr")) == 2
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # gcs_server and raylet ignore SIGTERM
        head.wait(30)
        shutil.rmtree(temp_dir, ignore_errors=True)
