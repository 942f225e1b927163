"""Validation of observations handed to a model runtime: clear errors, nothing copied on failure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

_NUMPY_FLOATS = frozenset({torch.float16, torch.float32, torch.float64})
_NUMPY_TYPES = _NUMPY_FLOATS | {torch.uint8}


def _float_view(t: torch.Tensor) -> np.ndarray | None:
    """The numpy view of a CPU tensor of a float type numpy has (nothing copied), else None."""
    return t.numpy() if t.device.type == "cpu" and t.dtype in _NUMPY_FLOATS and not t.requires_grad else None


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of `t` is finite, through its numpy view where it has one: on the few values of a state,
    `torch.isfinite(t).all()` costs about 20 us of dispatch where numpy's costs about 4, and every slot's
    observation is checked at every step."""
    a = _float_view(t)
    return bool(np.isfinite(a).all()) if a is not None else bool(torch.isfinite(t).all())


def all_counts(t: torch.Tensor) -> bool:
    """Whether every value of a float tensor is a finite count (finite and >= 0), as `all_finite` checks it."""
    a = _float_view(t)
    if a is not None:
        return bool(np.isfinite(a).all() and (a >= 0).all())
    return bool(torch.isfinite(t).all() and (t >= 0).all())


def as_image_tensor(name: str, image, expect: tuple[int, ...]) -> torch.Tensor:
    """Validate one camera image: uint8 of `expect` shape."""
    t = torch.as_tensor(image)
    if t.dtype != torch.uint8:
        raise ValueError(f"{name}: images must be uint8 (B, H, W, 3) in 0..255, got {t.dtype}")
    if tuple(t.shape) != expect:
        raise ValueError(f"{name}: expected shape {expect} (B, H, W, 3), got {tuple(t.shape)}")
    return t


def as_state_tensor(state, expect: tuple[int, ...]) -> torch.Tensor:
    t = torch.as_tensor(state)
    if not t.dtype.is_floating_point:
        raise ValueError(f"state must be float32 {expect}, got {t.dtype}")
    if tuple(t.shape) != expect:
        raise ValueError(f"state: expected shape {expect}, got {tuple(t.shape)}")
    if not all_finite(t):
        raise ValueError(f"state has non-finite values ({t.tolist()}); refusing to act on it")
    return t


def observation_keys(cameras: tuple[str, ...]) -> tuple[str, ...]:
    """The observation keys a model with these cameras reads: `image_<camera>` each, then `state`."""
    return (*(f"image_{cam}" for cam in cameras), "state")


def provides(keys: Iterable[str], key: str) -> bool:
    """Whether observations with `keys` give `key`: the key itself, or the leaves under it (`observation` is the
    dict of an env's `observation.<leaf>` keys)."""
    keys = list(keys)
    return key in keys or any(k.startswith(key + ".") for k in keys)


def gather(obs: Mapping[str, Any], key: str) -> Any:
    """`obs[key]`, or the nested dict of the leaves under `key` (`observation.pixels.top` -> `["pixels"]["top"]`),
    each as a numpy array; KeyError when there is neither."""
    if key in obs:
        return np.asarray(obs[key])
    prefix, out = key + ".", {}
    for k, v in obs.items():
        if k.startswith(prefix):
            node = out
            *parents, leaf = k[len(prefix):].split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = np.asarray(v)
    if not out:
        raise KeyError(key)
    return out


def require_keys(obs: Mapping[str, object], keys: tuple[str, ...], who: str) -> None:
    """Refuse an observation without every one of `keys` (a key or the leaves under it), naming what the `who`
    reads."""
    missing = [key for key in keys if not provides(obs, key)]
    if missing:
        raise ValueError(f"observation lacks {missing}; the {who} reads {list(keys)}")


def load_observation(
    buffers: Mapping[str, torch.Tensor],
    obs: Mapping[str, np.ndarray | torch.Tensor],
    *,
    cameras: tuple[str, ...],
    who: str,
) -> None:
    """Validate an observation (`image_<camera>` per camera and `state`, as an env returns it) and
    copy it into `buffers["image_<cam>"]` and `buffers["state"]`.

    Shapes come from the buffers; the batch dimension may be left out when it is 1.
    Everything is checked before anything is copied.
    """
    require_keys(obs, observation_keys(cameras), who)
    checked = {}
    for cam in cameras:
        key = f"image_{cam}"
        slot, img = buffers[key], obs[key]
        if _plain(img, slot) and img.dtype == np.uint8:
            checked[key] = img  # what as_image_tensor accepts, checked without torch's dispatch
            continue
        img = torch.as_tensor(img)
        if slot.shape[0] == 1 and img.dim() == 3:
            img = img[None]
        checked[key] = as_image_tensor(key, img, tuple(slot.shape))
    st, slot = obs["state"], buffers["state"]
    if _plain(st, slot) and st.dtype.kind == "f" and np.isfinite(st).all():
        checked["state"] = st
    else:
        st = torch.as_tensor(st)
        if slot.shape[0] == 1 and st.dim() == 1:
            st = st[None]
        checked["state"] = as_state_tensor(st, tuple(slot.shape))
    for key, value in checked.items():
        if isinstance(value, np.ndarray):
            np.copyto(buffers[key].numpy().reshape(value.shape), value, casting="unsafe")
        else:
            buffers[key].copy_(value)


def _plain(value: Any, buffer: torch.Tensor) -> bool:
    """A numpy array of a type numpy and torch convert alike and of the buffer's shape (its batch dimension left out
    when it is 1), to be copied into a contiguous CPU buffer through numpy: checked and copied without torch's
    dispatch (about 25 us a slot's step less); anything else goes through torch as before."""
    return (type(value) is np.ndarray and value.dtype.kind in "uf" and value.dtype.itemsize <= 8
            and (value.shape == buffer.shape or (buffer.shape[0] == 1 and value.shape == buffer.shape[1:]))
            and buffer.device.type == "cpu" and buffer.is_contiguous() and buffer.dtype in _NUMPY_TYPES
            and not buffer.requires_grad)


def write_language(buffer: torch.Tensor, model, text: str) -> None:
    """Encode `text` with `model`'s tokenizer and language encoder into `buffer` (B, D), every row."""
    tokens = torch.from_numpy(model.tokenizer.encode(text))[None].to(buffer.device)
    with torch.no_grad():
        buffer.copy_(model.embed_language(tokens).expand(buffer.shape[0], -1))


def key_names(obj: Any) -> dict[str, str]:
    """env key -> the name `obj` reads it under, from its `key_map` ({its name: env key, or `prompt`}: LeRobot's
    `observation.state` from an env's `observation.agent_pos`, openpi's `observation/image` from `image_top`)."""
    key_map = getattr(obj, "key_map", None) or {}
    if not isinstance(key_map, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in key_map.items()):
        raise ValueError(f"{type(obj).__name__}.key_map must map the names it reads to env keys (str -> str), "
                         f"got {key_map!r}")
    return {env: name for name, env in key_map.items()}


def stack_rows(rows: list[Any], like: Any) -> Any:
    """Rows of one key stacked `(N, ...)` (a nested dict leaf by leaf; a missing row: zeros like `like`)."""
    if isinstance(like, dict):
        return {k: stack_rows([r[k] if r is not None else None for r in rows], v) for k, v in like.items()}
    return np.stack([r if r is not None else np.zeros_like(like) for r in rows])
