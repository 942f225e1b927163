"""Diagnostics of a graph capture (`capsules.graph.state`): every value reachable from the root, by path, as a
short digest (`dump_graph`), and the paths where two such dumps differ (`differing_paths`): what names the
state a restore did not bring back."""

from __future__ import annotations

import hashlib
import types
from typing import Any

import numpy as np

from capsule_rollout.capsules import state_codec
from capsule_rollout.capsules.graph.read import generator_state
from capsule_rollout.capsules.graph.walk import Node, _children, classify, fmt
from capsule_rollout.capsules.state_codec import StateEncodeError


def dump_graph(graph: dict[int, Node], handle_types: tuple[type, ...], structs: Any, aliases: Any) -> dict[str, str]:
    """Every value reachable, by path -> a short digest: arrays (shape, dtype, bytes), scalars, generator
    states, which attributes an object has, aliases (field and offset). Handles' own arrays are left to the
    MjData comparison; opaque objects to their owners. `graph`: `GraphState.nodes()`; `structs`, `aliases`: the
    graph's (`GraphState`)."""
    out: dict[str, str] = {}
    handles = [(i, n.obj) for i, n in enumerate(graph.values()) if n.kind == "handle"]
    names = {i: fmt(n.path) for i, n in enumerate(graph.values())}
    for node in graph.values():
        if node.path is None:
            continue
        p = fmt(node.path)
        if node.kind == "array":
            alias = aliases.find(node.obj, handles)
            if alias is not None:
                out[p] = f"alias of {names[alias[0]]}.{alias[1]} +{alias[2]} B {alias[3]}"
            elif node.obj.dtype == object:
                out[p] = f"array object {node.obj.shape} {node.obj!r}"[:200]
            else:
                digest = hashlib.blake2b(np.ascontiguousarray(node.obj).tobytes(), digest_size=8).hexdigest()
                out[p] = f"array {node.obj.dtype} {node.obj.shape} {digest}"
        elif node.kind == "generator":
            out[p] = f"generator {hashlib.blake2b(repr(generator_state(node.obj)).encode(), digest_size=8).hexdigest()}"
        elif node.kind == "struct":
            state = state_codec.encode(structs.state(node.obj))
            out[p] = f"struct {type(node.obj).__name__} {hashlib.blake2b(state, digest_size=8).hexdigest()}"
        elif node.kind in ("object", "container"):
            if node.kind == "object":
                out[p + " (attributes)"] = ",".join(sorted(getattr(node.obj, "__dict__", {}) or ()))
            elif not isinstance(node.obj, dict):  # a sequence or set: its plain items as one value
                plain = [repr(v) for v in node.obj if classify(v, handle_types, structs.types) == "atomic"]
                if isinstance(node.obj, (set, frozenset)):
                    plain.sort()
                digest = hashlib.blake2b("\n".join(plain).encode(), digest_size=8).hexdigest()
                out[p + " (items)"] = f"{len(node.obj)} items {digest}"
                continue
            else:
                out[p + " (items)"] = str(len(node.obj))
            for step, v in _children(node.obj, node.kind):
                if step is not None and classify(v, handle_types, structs.types) == "atomic" and not isinstance(
                        v, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
                    out[fmt((*node.path, step))] = f"{type(v).__name__} {v!r}"[:200]
        elif node.kind == "value":
            try:
                digest = hashlib.blake2b(state_codec.encode(node.obj), digest_size=8).hexdigest()
                out[p] = f"{type(node.obj).__name__} {digest}"
            except StateEncodeError:  # not comparable by value
                continue
    return out


def unencodable(graph: dict[int, Node], table: dict[int, tuple], exc: Exception) -> str:
    """The error a snapshot raises when a value cannot be saved: the first value that cannot be encoded alone, by
    class and path (`table`: the ids the snapshot writes as references)."""
    for node in graph.values():
        if id(node.obj) in table or node.kind in ("object", "container", "handle"):
            continue
        try:
            state_codec.encode(node.obj, lambda x: table.get(id(x)))
        except StateEncodeError as inner:
            return (f"the env's Python state cannot be captured: {type(node.obj).__module__}."
                    f"{type(node.obj).__qualname__} at {fmt(node.path)} cannot be saved ({inner}); exclude that "
                    "attribute (CaptureSpec.exclude) if it is not state")
    return f"the env's Python state cannot be captured: {exc}"


def differing_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Paths whose value differs between two dumps (or that one lacks), shortest first (causes before the
    arrays inside them)."""
    keys = set(before) | set(after)
    return sorted((k for k in keys if before.get(k) != after.get(k)), key=lambda k: (k.count(".") + k.count("["), k))
