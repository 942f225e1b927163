"""A fake `torch.cuda` for CPU tests: devices, streams, events and graphs that record every call.

`FakeCuda(monkeypatch)` replaces the parts of `torch.cuda` that `GraphRunner`,
`TwoLaneContext` and the Triton digest use, so their CUDA paths run on a machine
without a GPU while `log` keeps the order of everything they asked CUDA to do.
torch's own `torch.cuda.graph` context manager runs unchanged on top of the fakes.
What is modelled (as CUDA and torch behave):

- a current device, and per device a current stream (its default stream at first);
  `torch.cuda.stream(s)` makes `s` current and its device current, both restored
  on exit; `torch.cuda.device(d)` makes `d` current;
- a kernel (a function wrapped by `kernel(fn, device)`) is launched on the current
  stream of *its tensors'* device, as ATen ops are, not on the current device's;
  on a stream that is capturing it is recorded into that graph and does not run;
  otherwise it runs at once (the tensors live on the CPU);
- `CUDAGraph.replay()` runs the recorded kernels on the current stream of the
  device the graph was captured on.

Log entries are tuples: ("launch", kernel, device, stream, how) with how in
{"run", "captured", "replay"}, ("capture_begin", graph, device, stream),
("capture_end", graph), ("replay", graph, device, stream), ("record", event,
stream), ("wait_event", stream, event), ("wait_stream", stream, other),
("synchronize", device), ("new_stream", stream, device), ("new_graph", graph).
Streams are named `default@D` or `sN@D`; events `eN`; graphs `gN`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch


class FakeCuda:
    def __init__(self, monkeypatch, devices: int = 2) -> None:
        self.log: list[tuple] = []
        self.devices = devices
        self.current_device = 0
        self.current = {d: _Stream(self, d, f"default@{d}") for d in range(devices)}
        self.capturing: dict[str, _Graph] = {}
        self.graphs: list[_Graph] = []
        self._streams = self._events = 0
        cuda = torch.cuda
        fake = self
        monkeypatch.setattr(cuda, "Stream", lambda device=None, priority=0, **_: fake.new_stream(device))
        monkeypatch.setattr(cuda, "Event", lambda *args, **kwargs: _Event(fake))
        monkeypatch.setattr(cuda, "CUDAGraph", lambda *args, **kwargs: _Graph(fake))
        monkeypatch.setattr(cuda, "current_stream", lambda device=None: fake.current[fake.index(device)])
        monkeypatch.setattr(cuda, "current_device", lambda: fake.current_device)
        monkeypatch.setattr(cuda, "device_count", lambda: fake.devices)
        monkeypatch.setattr(cuda, "stream", self.stream)
        monkeypatch.setattr(cuda, "device", self.device)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: fake.log.append(("synchronize",
                                                                                     fake.index(device))))
        monkeypatch.setattr(cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: None, raising=False)
        monkeypatch.setattr(cuda.graph, "default_capture_stream", None)  # torch's shared one, made on first use

    # -- devices and streams ------------------------------------------------------------
    def index(self, device) -> int:
        if device is None:
            return self.current_device
        if isinstance(device, int):
            return device
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"fake CUDA got a {device.type} device")
        return self.current_device if device.index is None else device.index

    def new_stream(self, device=None) -> _Stream:
        d = self.index(device)
        self._streams += 1
        stream = _Stream(self, d, f"s{self._streams}@{d}")
        self.log.append(("new_stream", stream.name, d))
        return stream

    @contextlib.contextmanager
    def stream(self, stream):
        if stream is None:
            yield
            return
        prev_device, prev_stream = self.current_device, self.current[stream.index]
        self.current[stream.index], self.current_device = stream, stream.index
        try:
            yield
        finally:
            self.current[stream.index], self.current_device = prev_stream, prev_device

    @contextlib.contextmanager
    def device(self, device):
        prev = self.current_device
        self.current_device = self.index(device)
        try:
            yield
        finally:
            self.current_device = prev

    # -- kernels ---------------------------------------------------------------------------
    def kernel(self, fn: Callable[[], None], device: int, name: str | None = None) -> Callable[[], None]:
        """`fn` as work on `device`'s tensors: launched on that device's current stream."""
        label = name or getattr(fn, "__name__", "kernel")

        def launch() -> None:
            self.launch(fn, label, device, "run")

        launch.__name__ = label
        return launch

    def launch(self, fn: Callable[[], None], name: str, device: int, how: str) -> None:
        stream = self.current[device]
        graph = self.capturing.get(stream.name)
        if graph is not None:
            graph.kernels.append((fn, name))
            self.log.append(("launch", name, device, stream.name, "captured"))
            return
        self.log.append(("launch", name, device, stream.name, how))
        fn()

    def entries(self, kind: str) -> list[tuple]:
        return [e for e in self.log if e[0] == kind]

    def position(self, entry: tuple) -> int:
        return self.log.index(entry)


class _Stream:
    def __init__(self, cuda: FakeCuda, index: int, name: str) -> None:
        self.cuda, self.index, self.name = cuda, index, name
        self.device = torch.device("cuda", index)

    def wait_event(self, event: _Event) -> None:
        self.cuda.log.append(("wait_event", self.name, event.name))

    def wait_stream(self, stream: _Stream) -> None:
        self.cuda.log.append(("wait_stream", self.name, stream.name))

    def synchronize(self) -> None:
        self.cuda.log.append(("stream_synchronize", self.name))

    def __repr__(self) -> str:
        return f"<fake stream {self.name}>"


class _Event:
    def __init__(self, cuda: FakeCuda) -> None:
        cuda._events += 1
        self.cuda, self.name, self.stream = cuda, f"e{cuda._events}", None

    def record(self, stream: _Stream | None = None) -> None:
        self.stream = stream or self.cuda.current[self.cuda.current_device]
        self.cuda.log.append(("record", self.name, self.stream.name))

    def wait(self, stream: _Stream | None = None) -> None:
        (stream or self.cuda.current[self.cuda.current_device]).wait_event(self)

    def synchronize(self) -> None:
        self.cuda.log.append(("event_synchronize", self.name))

    def query(self) -> bool:
        return True


class _Graph:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.name = cuda, f"g{len(cuda.graphs) + 1}"
        self.kernels: list[tuple[Callable[[], None], str]] = []
        self.device: int | None = None
        cuda.graphs.append(self)
        cuda.log.append(("new_graph", self.name))

    def capture_begin(self, *pool, capture_error_mode: str = "global", **_) -> None:
        if self.device is not None:
            raise RuntimeError(f"graph {self.name} captured twice")
        self.device = self.cuda.current_device
        stream = self.cuda.current[self.device]
        self.cuda.capturing[stream.name] = self
        self.cuda.log.append(("capture_begin", self.name, self.device, stream.name))

    def capture_end(self) -> None:
        for name, graph in list(self.cuda.capturing.items()):
            if graph is self:
                del self.cuda.capturing[name]
        self.cuda.log.append(("capture_end", self.name))

    def replay(self) -> None:
        if self.device is None:
            raise RuntimeError(f"graph {self.name} replayed before it was captured")
        stream = self.cuda.current[self.device]
        self.cuda.log.append(("replay", self.name, self.device, stream.name))
        for fn, name in self.kernels:
            self.cuda.launch(fn, name, self.device, "replay")

    def pool(self) -> tuple:
        return ("pool", self.name)
