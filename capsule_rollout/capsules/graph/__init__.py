"""Graph capture: an object's whole Python object graph as data, with nothing declared. `walk` finds every path
(`names` says which objects are kept by name: classes, functions, modules), `state` takes and puts back a graph's
state (`GraphState`), `dump` / `read` write and read it as data only (no pickle), `apply` sets it in place. The
MuJoCo side (handles into MjData, a renderer's structs) is `envs.object_graph`."""
