"""Policy servers that misbehave, speaking openpi's protocol up to the point where they do not: each answers a
request with what `answer(request)` returns (bytes: a binary frame; str: a text frame; None: nothing, ever)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import websockets
import websockets.sync.server

from capsule_rollout.policies import openpi_wire as W


class FakePolicyServer:
    def __init__(self, answer: Callable[[dict], bytes | str | None], metadata: Any = None) -> None:
        self.answer, self.requests = answer, []
        self._metadata = W.encode({} if metadata is None else metadata)
        self._stop = threading.Event()
        self._server = websockets.sync.server.serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
        self.port = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, **options) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"chunk_length": 8, "timeout_s": 1, **options}.items())
        return f"ws://127.0.0.1:{self.port}/?{query}"

    def _handle(self, ws) -> None:
        ws.send(self._metadata)
        try:
            while True:
                request = W.decode(ws.recv(), max_bytes=1 << 24)
                self.requests.append(request)
                reply = self.answer(request)
                if reply is None:  # stalled: never answers
                    self._stop.wait()
                    return
                ws.send(reply)
        except websockets.exceptions.ConnectionClosed:
            pass

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()

    def __enter__(self) -> FakePolicyServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def chunk(actions: np.ndarray) -> bytes:
    return W.encode({W.ACTIONS: actions})


def good_then(bad: Callable[[dict], bytes | str | None], good_answers: int = 1, shape=(8, 2)):
    """Answer `good_answers` requests with a zero chunk, then every request with `bad`."""
    count = [0]

    def answer(request: dict):
        count[0] += 1
        return chunk(np.zeros(shape, np.float32)) if count[0] <= good_answers else bad(request)

    return answer
