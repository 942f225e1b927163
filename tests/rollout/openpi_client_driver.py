"""Run in openpi-client's own venv (`make openpi-venv`; numpy < 2, nothing of this project): drive a policy server
with `WebsocketClientPolicy.infer` and `ActionChunkBroker` exactly as a robot runtime does.

    python openpi_client_driver.py URL OBS.npz OUT.npz [API_KEY]

OBS.npz holds observations `o<i>/<key>` and a `prompt`; OUT.npz gets `infer<i>` (each observation in turn, one
connection), `broker<i>` (a broker of the chunk's length on a second connection: the rows it hands out one
call at a time for observation i), the metadata as JSON, and the error text a wrong request is answered with.
"""

import json
import sys

import numpy as np
from openpi_client import action_chunk_broker, websocket_client_policy


def main(url: str, obs_path: str, out_path: str, api_key: str = "") -> None:
    data = np.load(obs_path, allow_pickle=False)
    prompt = str(data["prompt"])
    n = len({k.split("/")[0] for k in data.files if k.startswith("o")})
    observations = [{k.split("/", 1)[1]: data[k] for k in data.files if k.startswith(f"o{i}/")} for i in range(n)]
    for obs in observations:
        obs["prompt"] = prompt
    out = {}
    client = websocket_client_policy.WebsocketClientPolicy(host=url, api_key=api_key or None)
    meta = client.get_server_metadata()
    out["metadata"] = np.array(json.dumps(meta))
    for i, obs in enumerate(observations):
        out[f"infer{i}"] = client.infer(obs)["actions"]
    horizon = int(meta["action_horizon"])
    second = websocket_client_policy.WebsocketClientPolicy(host=url, api_key=api_key or None)
    broker = action_chunk_broker.ActionChunkBroker(second, horizon)
    for i, obs in enumerate(observations):
        out[f"broker{i}"] = np.stack([broker.infer(obs)["actions"] for _ in range(horizon)])
    wrong = dict(observations[0])
    key = next(k for k, v in wrong.items() if isinstance(v, np.ndarray) and v.dtype == np.float32)
    wrong[key] = wrong[key].astype(np.float64)  # what a client sends without casting
    try:
        client.infer(wrong)
        out["error"] = np.array("")
    except RuntimeError as exc:
        out["error"] = np.array(str(exc))
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:])
