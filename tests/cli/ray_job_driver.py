"""Starts a Ray head on 127.0.0.1 (every port chosen), submits `sim_rollout` with `ray job submit`, waits,
records every TCP socket listening in this network namespace, stops the head; prints one JSON line.

With NODES = 2, a second Ray node joins the head (its own raylet, object store and agents, on the same
loopback address, every port chosen), each node offers one CPU and a custom resource naming it
(`rollout_node_<k>`), and the job records into a sharded store (`--shards true`, a file:// URL): its two
actors run one on each node and write shards of one store. The result's "nodes" maps each alive node's
id to the custom resources it offers.

Run by `test_ray_job.py` inside a private network namespace whose only interface is loopback: Ray's
gRPC servers listen on every interface and its agents on the machine's other address whatever
`--node-ip-address` says, so only there does a test head bind nothing but loopback.

argv: OUT_DIR POLICY CRITIC [NODES]
"""

from __future__ import annotations

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

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def listening_addresses() -> list[str]:
    """Local addresses of every listening TCP socket in this network namespace (from /proc/net/tcp{,6})."""
    found = []
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":  # LISTEN
                continue
            raw = bytes.fromhex(local.split(":")[0])
            # /proc prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            family = socket.AF_INET if width == 8 else socket.AF_INET6
            found.append(socket.inet_ntop(family, words))
    return found


def node_ports() -> list[str]:
    """The per-node port flags of `ray start` (raylet, object manager, agents, metrics), each chosen."""
    node_mgr, obj_mgr, agent_listen, agent_grpc, runtime_env, metrics = free_ports(6)
    return ["--node-manager-port", str(node_mgr), "--object-manager-port", str(obj_mgr),
            "--dashboard-agent-listen-port", str(agent_listen), "--dashboard-agent-grpc-port", str(agent_grpc),
            "--runtime-env-agent-port", str(runtime_env), "--metrics-export-port", str(metrics),
            "--min-worker-port", "0", "--max-worker-port", "0"]


def node_resource(k: int) -> str:
    """The custom resource that names node k (the head is node 0)."""
    return f"rollout_node_{k}"


def alive_nodes(address: str, env: dict) -> dict[str, list[str]] | None:
    """Node id -> the custom `rollout_node_*` resources it offers, for every alive node of the cluster, from
    the state API (`ray list nodes`); None while it does not answer."""
    out = subprocess.run([RAY, "list", "nodes", "--address", address, "--format", "json", "--detail",
                          "--filter", "state=ALIVE"], env=env, capture_output=True, text=True)
    if out.returncode:
        return None
    try:
        nodes = json.loads(out.stdout)
    except json.JSONDecodeError:
        return None
    return {n["node_id"]: sorted(r for r in n.get("resources_total", {}) if r.startswith("rollout_node_"))
            for n in nodes}


def main(out: str, policy: str, critic: str, nodes: str = "1") -> dict:
    n_nodes = int(nodes)
    gcs, dash, client = free_ports(3)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # short: Ray's socket paths must fit
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--ray-client-server-port", str(client),
         *node_ports(), "--num-cpus", "2" if n_nodes == 1 else "1", "--resources", json.dumps({node_resource(0): 1}),
         "--disable-usage-stats", "--temp-dir", temp_dir],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    workers: list[subprocess.Popen] = []
    address = f"http://127.0.0.1:{dash}"
    result: dict = {"listening": []}
    try:
        deadline = time.monotonic() + 120
        while True:  # the job server answers once the dashboard is up
            probe = subprocess.run([RAY, "job", "list", "--address", address], env=env, capture_output=True, text=True)
            if probe.returncode == 0:
                break
            if head.poll() is not None or time.monotonic() > deadline:
                result["error"] = "head did not come up: " + (probe.stderr[-2000:] or "")
                return result
            time.sleep(1)
        node_log = Path(temp_dir) / "joining-nodes.log"
        for k in range(1, n_nodes):  # each joins the head's GCS and shares its session directory
            with node_log.open("a") as log:
                workers.append(subprocess.Popen(
                    [RAY, "start", "--block", "--address", f"127.0.0.1:{gcs}", "--node-ip-address", "127.0.0.1",
                     *node_ports(), "--num-cpus", "1", "--resources", json.dumps({node_resource(k): 1}),
                     "--disable-usage-stats"],
                    env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        while len(alive := alive_nodes(address, env) or {}) < n_nodes:
            if any(w.poll() is not None for w in workers) or time.monotonic() > deadline:
                result["error"] = f"{len(alive)} of {n_nodes} nodes came up: " + node_log.read_text()[-2000:]
                return result
            time.sleep(1)
        result["nodes"] = alive
        result["listening"] += listening_addresses()
        # no cd: the job runs in a Ray session directory; the editable install finds the project
        entry = [sys.executable, "-m", "capsule_rollout", "sim_rollout", "--episodes", "2" if n_nodes == 1 else "32",
                 "--actors", "2", "--out", out if n_nodes == 1 else f"file://{out}",
                 "--policy", policy, "--critic", critic, "--n_exec", "2",
                 "--no-progress", "--json", f"{out}/summary.json"]
        if n_nodes > 1:  # one store, a shard per actor; the URL names the path every node mounts
            entry += ["--shards", "true"]
        deadline = time.monotonic() + 90
        while True:  # a node's agent registers with the job server a while after the node: Ray says to try again
            submit = subprocess.run([RAY, "job", "submit", "--address", address, "--no-wait", "--", *entry],
                                    env=env, capture_output=True, text=True, timeout=120)
            if "No available agent" not in submit.stderr + submit.stdout or time.monotonic() > deadline:
                break
            time.sleep(2)
        result["submit"] = {"returncode": submit.returncode, "output": (submit.stdout + submit.stderr)[-2000:]}
        if submit.returncode:
            return result
        job_id = next(w for w in submit.stdout.split() if w.strip("'").startswith("raysubmit_")).strip("'")
        status = ""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = subprocess.run([RAY, "job", "status", "--address", address, job_id], env=env,
                                    capture_output=True, text=True).stdout
            if any(word in status.lower() for word in ("succeeded", "failed", "stopped")):
                break
            time.sleep(2)
        result["listening"] += listening_addresses()  # the workers the job started too
        logs = subprocess.run([RAY, "job", "logs", "--address", address, job_id], env=env,
                              capture_output=True, text=True).stdout
        result.update(status=status, logs=logs[-3000:])
        return result
    finally:
        for process in [*workers, head]:
            os.killpg(process.pid, signal.SIGKILL)  # gcs_server and raylet ignore SIGTERM
            process.wait(30)
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
