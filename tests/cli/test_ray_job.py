"""`ray job submit` against a head this test starts on 127.0.0.1, in a network namespace of its own.

Ray's gRPC servers listen on every interface and its agents on the machine's other address whatever
`--node-ip-address` says, so the head runs (with the submitting client, `ray_job_driver.py`) in a
private network namespace whose only interface is loopback, and the test checks that every socket
listening there is a loopback one. Without `unshare -n` (root, or user namespaces) and `ip`, it is skipped.
"""

import ipaddress
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from capsule_rollout.cli.run import main
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import manifest_entries
from capsule_rollout.stores.zarr_reader import ZarrEpisodeReader
from tests.policies.tiny import save_tiny_checkpoints

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests/cli/ray_job_driver.py"
# inside the new namespace: bring loopback up, then run the driver
IN_NAMESPACE = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']


def _private_network_namespace() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = subprocess.run([*IN_NAMESPACE, "true"], capture_output=True)
    return probe.returncode == 0


def _submit(tmp_path, nodes: int) -> tuple[dict, Path]:
    if not _private_network_namespace():
        pytest.skip("needs a private network namespace (unshare -n and ip) so the test head binds only loopback")
    policy, critic = save_tiny_checkpoints(tmp_path / "ckpt")
    out = tmp_path / "run"
    run = subprocess.run([*IN_NAMESPACE, sys.executable, str(DRIVER), str(out), policy, critic, str(nodes)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert "error" not in result and result["submit"]["returncode"] == 0, result
    return result, out


def test_sim_rollout_as_a_ray_job_with_every_socket_on_loopback(tmp_path):
    result, out = _submit(tmp_path, nodes=1)
    assert "succeeded" in result["status"].lower(), result["status"] + result["logs"]
    listening = [ipaddress.ip_address(a) for a in result["listening"]]
    assert len(listening) >= 5  # the head's gcs, raylet, dashboard, agents...
    bound = [getattr(a, "ipv4_mapped", None) or a for a in listening]
    assert all(a.is_loopback for a in bound), sorted(set(map(str, bound)))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["ray"] not in ("local", "existing")  # joined RAY_ADDRESS
    assert len(ZarrEpisodeReader(out / "episodes.zarr")) == 2


def test_a_job_spread_over_two_ray_nodes_records_one_sharded_store(tmp_path):
    """A second node joins the head; each offers one CPU, so the job's two actors run one per node, each
    writing its own shard of one store (a file:// URL); the driver commits every episode once, and an
    episode from each shard replays bit-identically."""
    result, out = _submit(tmp_path, nodes=2)
    nodes = result["nodes"]  # node id -> the custom resource naming it
    assert sorted(nodes.values()) == [["rollout_node_0"], ["rollout_node_1"]], nodes
    assert "succeeded" in result["status"].lower(), result["status"] + result["logs"]
    listening = [ipaddress.ip_address(a) for a in result["listening"]]
    assert all((getattr(a, "ipv4_mapped", None) or a).is_loopback for a in listening)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sharded"] and summary["episodes"] == 32 and summary["duplicates_skipped"] == 0
    by_node = summary["episodes_by_node"]
    assert sorted(by_node) == sorted(nodes) and sum(by_node.values()) == 32, by_node  # both nodes played
    store = out / "episodes.zarr"
    entries = manifest_entries(store)
    assert len(entries) == 32 and len({e.episode_id for e in entries}) == 32  # each episode exactly once
    assert len({e.shard for e in entries}) == 2  # a shard per actor process, one on each node
    reader = open_episode_reader(store)  # readers see one store
    assert len(reader) == 32
    assert sorted(reader.meta(i).seed for i in range(len(reader))) == list(range(1_000_000, 1_000_032))
    per_shard = {e.shard: e.episode_id for e in entries}  # an episode written on each node
    for episode_id in per_shard.values():
        assert main(["replay", "--store", f"file://{store}", "--episode", episode_id]) == 0, episode_id
