"""`TwoLaneContext`: the policy lane P and the critic lane C of one execution context.

Per chunk both lanes run concurrently and the host joins both. On CUDA each lane
is a stream of the context's device; an event recorded on the host's current
stream orders both lanes after the inputs written there, the host's stream waits
for both lanes' events, and the device is synchronised before `run` returns, so
the host reads outputs only after both lanes finished. Everything runs with the
context's device current (right for `cuda:1` whatever the caller has current).
On the CPU lane C is a worker thread (torch releases the GIL inside its kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch


class TwoLaneContext:
    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda":
            if self.device.index is None:  # "cuda": the device current now
                self.device = torch.device("cuda", torch.cuda.current_device())
            self.streams = (torch.cuda.Stream(self.device), torch.cuda.Stream(self.device))
            self._worker = None
        else:
            self.streams = None
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="critic-lane")

    def run(self, policy: Callable[[], None], critic: Callable[[], None]) -> None:
        """Run both lanes; returns when both are done (results are in their buffers)."""
        if self.streams is None:
            pending = self._worker.submit(critic)
            try:
                policy()
            finally:
                pending.result()
            return
        with torch.cuda.device(self.device):
            host = torch.cuda.current_stream(self.device)
            ready = torch.cuda.Event()
            ready.record(host)  # the inputs the host wrote on its stream
            done = []
            for stream, fn in zip(self.streams, (policy, critic)):
                stream.wait_event(ready)
                with torch.cuda.stream(stream):
                    fn()
                event = torch.cuda.Event()
                event.record(stream)
                done.append(event)
            for event in done:
                host.wait_event(event)
            torch.cuda.synchronize(self.device)

    def serial(self, policy: Callable[[], None], critic: Callable[[], None]) -> None:
        """Both lanes one after the other on the current stream / thread (for comparison)."""
        if self.device.type != "cuda":
            policy()
            critic()
            return
        with torch.cuda.device(self.device):
            policy()
            critic()
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
