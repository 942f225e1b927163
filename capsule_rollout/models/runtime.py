"""`ModelRuntime`: what the policy and the critic runtimes share as capsule components.

A runtime holds a model in eval mode on its device, its static buffers (declared by
the subclass), a fingerprint (kind, weights and config hashes, batch) that binds its
capsules to these weights, the language slot every model reads (`set_language`),
and the `GraphRunner` that runs its buffer-to-buffer function: one CUDA graph on a
GPU, the network traced to TorchScript (or eager) on the CPU.

Batch invariance: a row's result is what a runtime of batch 1 computes for it, whatever the batch, the row's
position and the CPU's kernels. A library's matrix product rounds by the order of its sums, and picks that order by
the number of rows and the instruction set; so the runtime's copy of the model (`invariant_copy`) computes every
linear layer and convolution with exact sums (`models.exact_sums`), where the order cannot matter, pads each row of
an activation to whole vectors (a row in ATen's scalar loop rounds exp apart from one in its vector loop), and
leaves to the library only what never mixes rows (element-wise arithmetic; norms and softmax over one row). A
module with sums of its own (a matrix product outside a layer) says how to make them exact: `exact_sums()`, called
on the copy.
`rows_agree` still checks, where the runtime is made, that one call gives every row what it gets alone (a user's
module may sum in a way the copy does not know), and the rows then run one at a time if not.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from copy import deepcopy
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F

from capsule_rollout.capsules import BufferComponent
from capsule_rollout.capsules.fingerprint import module_sha256
from capsule_rollout.models.exact_sums import ExactWeights, exact_linear
from capsule_rollout.models.graph_runner import GraphRunner, trace_on_cpu
from capsule_rollout.models.inputs import observation_keys, write_language

SUMS = ("exact", "padded")
"""How a batch-invariant runtime sums: `exact` (`models.exact_sums`, in a capsule's fingerprint as `sums`); `padded`:
how runs recorded before exact sums played (linear layers over rows padded to a multiple of 4, convolutions over
images in pairs; no `sums` in the fingerprint), kept so that they replay as they played."""
LINEAR_ROWS, CONV_IMAGES = 4, 2  # `padded`
_invariant: list[tuple[bool, str]] = [(True, "exact")]


@contextmanager
def batch_invariance(on: bool, sums: str = "exact") -> Iterator[None]:
    """Runtimes made inside are batch-invariant (`ModelRuntime`'s `batch_invariant`), summing as `sums`, unless
    told; off: the network over the batch as it is (for benchmarks and checks that compare with it)."""
    if sums not in SUMS:
        raise ValueError(f"sums is one of {SUMS}, got {sums!r}")
    _invariant.append((on, sums))
    try:
        yield
    finally:
        _invariant.pop()


def _linear(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return exact_linear(x, layer.exact_t, layer.exact_bias, layer.exact_bits_in, layer.exact_t32)


def _onednn(layer: torch.nn.Conv2d, x: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and layer.padding_mode == "zeros" and not isinstance(layer.padding, str))


def _conv_per_image(layer: torch.nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)`, each image by one call of a batch of one (the same shapes, the same kernel), output in
    contiguous (N, C, H, W). On the CPU the call is oneDNN's convolution: for some small images torch would
    pick its native kernel at a batch of one, 1.5x slower."""
    if _onednn(layer, x):
        def conv(image: torch.Tensor) -> torch.Tensor:
            return torch.mkldnn_convolution(image, layer.weight, layer.bias, layer.padding, layer.stride,
                                            layer.dilation, layer.groups)
    else:
        def conv(image: torch.Tensor) -> torch.Tensor:
            return layer._conv_forward(image, layer.weight, layer.bias)
    return torch.cat([conv(x[i: i + 1]).contiguous() for i in range(x.shape[0])])


ALIGN = 64
"""Elements a row of an activation is padded to a multiple of (`invariant_copy`): two of AVX-512's widest
vectors (32 16-bit floats each; 16 float32)."""
ACTIVATIONS = (torch.nn.SiLU, torch.nn.Sigmoid, torch.nn.Tanh, torch.nn.GELU, torch.nn.Mish, torch.nn.Softplus,
               torch.nn.ELU, torch.nn.SELU, torch.nn.CELU, torch.nn.LogSigmoid)
"""Activations whose CPU kernels round an element by where it falls: ATen runs a tensor's elements through a
vector loop two vectors at a time and the rest through a scalar loop, and the two compute exp and the sigmoid
apart (SiLU: one element in 25 of a 16-wide row differs by the last bit). A row's place in the loop depends on
the number of rows."""


def _aligned(forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """`forward(x)` with each row (the first dimension) padded with zeros to a multiple of `ALIGN` elements, so
    that every row starts a vector and none falls in the scalar loop, at any number of rows (one torch thread;
    with more, ATen splits tensors of 64k elements and up where the size says)."""
    if x.dim() == 0 or x.shape[0] == 0:
        return forward(x)
    rows = x.reshape(x.shape[0], -1)
    short = -rows.shape[1] % ALIGN
    if not short:
        return forward(x)
    return forward(F.pad(rows, (0, short)))[:, : rows.shape[1]].reshape(x.shape)


def _padded(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, multiple: int) -> torch.Tensor:
    short = -x.shape[0] % multiple
    if not short:
        return fn(x)
    return fn(torch.cat([x, x.new_zeros((short, *x.shape[1:]))]))[: x.shape[0]]


def _linear_padded(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not m % LINEAR_ROWS:
        return F.linear(x, layer.weight, layer.bias)
    rows = _padded(lambda r: F.linear(r, layer.weight, layer.bias), x.reshape(m, x.shape[-1]), LINEAR_ROWS)
    return rows.reshape(*x.shape[:-1], layer.out_features)


def _conv_padded(layer: torch.nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    return _padded(lambda images: layer._conv_forward(images, layer.weight, layer.bias), x, CONV_IMAGES)


def invariant_copy(model: torch.nn.Module, sums: str = "exact") -> torch.nn.Module:
    """A copy of `model` whose linear layers sum exactly (`models.exact_sums`), whose 2-D convolutions take each
    image as a batch of one does, whose activations (`ACTIVATIONS`) see rows aligned to the vector loop, and whose
    modules with an `exact_sums()` method have had it called (`sums` "padded": the layers of runs recorded before,
    see `SUMS`). The same parameters' values, so the same weights hash; the caller's model is left as it is (it may
    go on training)."""
    if getattr(model, "_sums", None) == sums:
        return model
    copy = deepcopy(model)
    for layer in copy.modules():
        if isinstance(layer, torch.nn.Linear) and sums == "exact":
            weights = ExactWeights(layer.weight, layer.bias)
            weights.register(layer)
            layer.exact_bits_in = weights.bits_in
            layer.forward = partial(_linear, layer)
        elif isinstance(layer, torch.nn.Linear):
            layer.forward = partial(_linear_padded, layer)
        elif type(layer) is torch.nn.Conv2d:
            layer.forward = partial(_conv_per_image if sums == "exact" else _conv_padded, layer)
        elif sums == "exact" and isinstance(layer, ACTIVATIONS):
            layer.forward = partial(_aligned, layer.forward)
        elif sums == "exact" and callable(getattr(layer, "exact_sums", None)):
            layer.exact_sums()
    copy._sums = sums
    return copy


def in_rows(fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]], rows: Sequence[torch.Tensor],
            together: bool) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """`fn(*rows)`: in one call (`together`), or one row at a time and put back together (what a runtime of
    batch 1 computes for each row)."""
    if together or rows[0].shape[0] == 1:
        return fn(*rows)
    outs = [fn(*[r[i: i + 1] for r in rows]) for i in range(rows[0].shape[0])]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat([o[i] for o in outs]) for i in range(len(outs[0])))
    return torch.cat(outs)


def rows_agree(fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]], rows: Sequence[torch.Tensor]) -> bool:
    """Whether one call over `rows` gives every row bit for bit what it gets alone, on random contents of
    `rows`' shapes and dtypes (integers drawn from 0-2: the indicators a model reads). Kernels are chosen by
    the batch's shape, so this is a property of the model, the device and the library build: checked where the
    runtime is made."""
    if rows[0].shape[0] <= 1:
        return True
    g = torch.Generator(device=rows[0].device).manual_seed(0)

    def like(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.uint8:
            return torch.randint(0, 256, t.shape, generator=g, device=t.device, dtype=t.dtype)
        if not t.dtype.is_floating_point:
            return torch.randint(0, 3, t.shape, generator=g, device=t.device, dtype=t.dtype)
        return torch.randn(t.shape, generator=g, device=t.device, dtype=t.dtype)

    sample = [like(r) for r in rows]
    with torch.no_grad():
        a, b = in_rows(fn, sample, True), in_rows(fn, sample, False)
    a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
    return all(torch.equal(x, y) for x, y in zip(a, b))


class ModelRuntime(BufferComponent):
    KIND: ClassVar[str] = "model"

    def __init__(self, model: torch.nn.Module, *, name: str, device: str, batch: int, capture: bool | None,
                 trace: bool | None, batch_invariant: bool | None = None, sums: str | None = None,
                 **fingerprint: str) -> None:
        """`trace`: run the network as TorchScript on the CPU (None: yes; see `trace_on_cpu`).
        `batch_invariant`: a row's result the same at any batch size (the model's copy in `invariant_copy`, with
        exact sums; the rows in one call where `rows_agree`, else one at a time); False: the library's kernels over
        the batch as it is, which round by its size. None: True, or what `batch_invariance` sets.
        `fingerprint`: extra entries that decide what capsules fit (e.g. whether guidance runs)."""
        super().__init__()
        self.name = name
        self.device = torch.device(device)
        on, context_sums = _invariant[-1]
        self.batch_invariant = on if batch_invariant is None else bool(batch_invariant)
        self.sums = (sums or context_sums) if self.batch_invariant else None
        if self.sums is not None and self.sums not in SUMS:
            raise ValueError(f"sums is one of {SUMS}, got {self.sums!r}")
        model = model.to(self.device).eval()  # runs under no_grad (GraphRunner)
        self.model = invariant_copy(model, self.sums) if self.batch_invariant else model
        self.config = model.config
        self.batch, self._capture, self._trace = batch, capture, trace
        self._fingerprint = {
            "kind": self.KIND,
            "weights_sha256": module_sha256(self.model),
            "config_sha256": hashlib.sha256(json.dumps(self.config.to_json(), sort_keys=True).encode()).hexdigest()[:16],
            "batch": str(batch),
            **({"sums": "exact"} if self.sums == "exact" else {}),
            **fingerprint,
        }
        self.runner: GraphRunner | None = None

    @property
    def observation_keys(self) -> tuple[str, ...]:
        return observation_keys(self.config.cameras)

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def set_language(self, text: str) -> None:
        """Encode the subtask's language once into the language buffer (read by every later call)."""
        write_language(self.buffers["lang"], self.model, text)

    def rows_together(self, fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
                      rows: Sequence[torch.Tensor]) -> bool:
        """Whether this runtime's rows run in one call (`in_rows`): always where it is not batch-invariant; where it
        sums exactly, where `rows_agree`; never with `sums` "padded" (runs recorded before exact sums), whose rows then
        each get what a batch of one computes: its activations are the library's kernels over the batch as it is,
        which can round a row by the batch's shape (seen with oneDNN held to AVX2, `ONEDNN_MAX_CPU_ISA=AVX2`: row 1 of
        3 differed from the batch of one by 1.2e-7 while `rows_agree`'s random rows agreed)."""
        if not self.batch_invariant:
            return True
        return self.sums == "exact" and rows_agree(fn, rows)

    def _compile(self, core: torch.nn.Module, example: tuple, fn: Callable[[], None],
                 preserve: Sequence[torch.Tensor] = ()) -> torch.nn.Module:
        """Trace `core` on the CPU (restoring `preserve` after the trace ran it once) and make the runner
        of `fn`; returns the module `fn` must call."""
        saved = [t.clone() for t in preserve]
        traced = trace_on_cpu(core, example, self.device, self._trace)
        for tensor, value in zip(preserve, saved):
            tensor.copy_(value)
        self.runner = GraphRunner(fn, self.device, capture=self._capture, preserve=list(preserve))
        return traced
