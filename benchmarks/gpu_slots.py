"""GPU check of env slots: batched policy / critic rows (capture vs eager, row invariance, timing, memory) and
tabletop episodes played by many one-env processes vs fewer processes of several slots each.

Run from the repository's root (`gpu_check` runs it as one of its steps); part (b) needs mujoco, gymnasium and
PyOpenGL. Writes a JSON report to --out after every stage (a kill keeps what was done).

    python -m benchmarks.gpu_slots --out /tmp/gpu_slots.json             # on a GPU machine
    python -m benchmarks.gpu_slots --device cpu --quick --out /tmp/q.json  # the code paths, on a CPU

Part (a): for each N, a `PolicyRuntime(capture=True).batched(N)` and an eager twin (`capture=False, trace=False`)
of the same model; the same seeded observations, language and noise seed per row; `act_rows(all rows)` on both
compared bit for bit (torch.equal); row 0's chunk compared when the other rows' observations change (row
invariance) and against N=1; median ms per call over `--iters` calls (synchronized); the same for
`CriticRows.evaluate_rows`; torch's peak memory per N. On the CPU (`--device cpu`) the "fast" runtime is the
traced one (capture=False, trace=None) and the twin is eager (trace=False).

Part (b): `RunSpec(env="tabletop:pick_place", ...)` episodes in spawned processes: P processes of S slots each
(S=1: `build_host`, else `build_slots`), the same seeds in every configuration; each process plays its seeds
once (warm-up: cold resets, capsules made, graphs captured), then, all processes released together by a
barrier, the same seeds again (restored from the capsules) `--repeats` times; control steps/s over all
processes, per-process torch memory and nvidia-smi's per-process / total memory while they run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

# -- what both parts share: the log, the entry-point shim, nvidia-smi ------------------------------
ROOT = Path(__file__).resolve().parents[1]  # the repository
CKPT = ROOT / "capsule_rollout" / "checkpoints"
T0 = time.monotonic()
TEXTS = ("pick up the red block", "put the green block on the blue pad", "move the yellow block to the left",
         "stack the blue block on top of the red block", "place the purple block next to the orange block")


def log(*parts) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s]", *parts, flush=True)


def elapsed() -> float:
    return time.monotonic() - T0


# -- entry points when the package runs from a checkout that was never installed ---------------------------
def ensure_entry_points() -> str | None:
    """The project's checkpoint loaders and suites are entry points (pyproject.toml). Run from a plain
    checkout (PYTHONPATH, no `pip install -e`), none is registered: write a minimal dist-info for them into a
    temp dir on sys.path (and PYTHONPATH, for spawned processes). Returns that dir, or None if not needed."""
    from importlib.metadata import entry_points

    if any(e.name == "flow_policy" for e in entry_points(group="capsule_rollout.checkpoints")):
        return None
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = []
    for group, items in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in items.items()]
        lines.append("")
    site = Path(tempfile.mkdtemp(prefix="capsule_meta_"))
    info = site / f"capsule_rollout-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("\n".join(lines))
    sys.path.append(str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(site)) if p)
    import importlib

    importlib.invalidate_caches()
    return str(site)


# -- nvidia-smi ----------------------------------------------------------------------------------------------
def smi(*query: str) -> list[list[str]] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10)
    except Exception:
        return None
    if out.returncode != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in out.stdout.strip().splitlines() if line.strip()]


class SmiSampler:
    """Samples per-process and total GPU memory (MiB) and utilization every `period` s in a thread."""

    def __init__(self, period: float = 1.0) -> None:
        self.period, self.stop_flag = period, threading.Event()
        self.per_pid: dict[str, float] = {}
        self.total_max = 0.0
        self.util: list[float] = []
        self.samples = 0
        self.available = shutil.which("nvidia-smi") is not None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop_flag.is_set():
            apps = smi("--query-compute-apps=pid,used_memory")
            for row in apps or []:
                try:
                    self.per_pid[row[0]] = max(self.per_pid.get(row[0], 0.0), float(row[1]))
                except (ValueError, IndexError):
                    pass
            gpu = smi("--query-gpu=memory.used,utilization.gpu")
            if gpu:
                try:
                    self.total_max = max(self.total_max, float(gpu[0][0]))
                    self.util.append(float(gpu[0][1]))
                except (ValueError, IndexError):
                    pass
            self.samples += 1
            self.stop_flag.wait(self.period)

    def __enter__(self):
        if self.available:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_flag.set()
        if self.available:
            self.thread.join(timeout=15)

    def report(self) -> dict:
        return {"available": self.available, "samples": self.samples, "per_pid_max_mib": dict(self.per_pid),
                "gpu_used_max_mib": self.total_max,
                "gpu_util_mean": statistics.fmean(self.util) if self.util else None,
                "gpu_util_max": max(self.util) if self.util else None}


# -- part (a): rows ----------------------------------------------------------------------------------------
def observations(n: int, seed: int, config, changed_from: int | None = None):
    """One observation per row (seeded per row); rows >= `changed_from` use another seed."""
    import numpy as np

    out = []
    for i in range(n):
        s = seed * 1000 + i + (777_777 if changed_from is not None and i >= changed_from else 0)
        rng = np.random.default_rng(s)
        obs = {f"image_{cam}": rng.integers(0, 256, (config.image_size, config.image_size, 3), dtype=np.uint8)
               for cam in config.cameras}
        obs["state"] = (rng.standard_normal(config.state_dim) * 0.5).astype(np.float32)
        out.append(obs)
    return out


def setup_policy_rows(rows, obs, seeds) -> None:
    for i, slot in enumerate(rows.slots):
        slot.reset(seeds[i])
        slot.set_language(TEXTS[i % len(TEXTS)])
        slot.load_observation(obs[i])


def setup_critic_rows(rows, obs) -> None:
    step = 0 if rows.runtime.config.episode_limit else None
    for i, slot in enumerate(rows.slots):
        slot.set_language(TEXTS[i % len(TEXTS)])
        slot.load_observation(obs[i], step=step)


def time_calls(fn, iters: int, sync) -> dict:
    for _ in range(5):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "iters": iters}


def max_abs(a, b) -> float:
    return float((a.double() - b.double()).abs().max().item())


def part_a(args, report: dict, save) -> None:
    import torch

    from capsule_rollout.capsules import Arena
    from capsule_rollout.tabletop.critic_runtime import CriticRuntime
    from capsule_rollout.tabletop.flow_policy import load_policy
    from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
    from capsule_rollout.tabletop.value_critic import load_critic

    dev = args.device
    cuda = dev.startswith("cuda")
    fast_kw = {"capture": True} if cuda else {"capture": False, "trace": None}
    twin_kw = {"capture": False, "trace": False}
    sync = (lambda: torch.cuda.synchronize()) if cuda else (lambda: None)
    policy_model = load_policy(str(CKPT / "policy"), dev)
    critic_model = load_critic(str(CKPT / "critic"), dev)
    sec = report["a"] = {"fast": fast_kw, "twin": twin_kw, "iters": args.iters, "per_n": {},
                         "model_params": {"policy": sum(p.numel() for p in policy_model.parameters()),
                                          "critic": sum(p.numel() for p in critic_model.parameters())}}
    if cuda:
        sec["allocated_after_models_mib"] = torch.cuda.memory_allocated() / 2**20
    row0_at_1: dict[str, torch.Tensor] = {}
    for n in args.ns:
        if elapsed() > args.budget * args.a_share:
            log(f"(a) time share spent: skipping N >= {n}")
            sec.setdefault("skipped", []).append(n)
            continue
        res: dict = {"n": n}
        sec["per_n"][str(n)] = res
        try:
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            seeds = [1000 + 17 * i for i in range(n)]
            obs_a = observations(n, 1, policy_model.config)
            obs_b = observations(n, 1, policy_model.config, changed_from=1)
            # -- policy
            made = {}
            for tag, kw in (("fast", fast_kw), ("twin", twin_kw)):
                template = PolicyRuntime(policy_model, device=dev, **kw)
                Arena([template]).allocate()
                made[tag] = template.batched(n)
            outs = {}
            for tag, rows in made.items():
                setup_policy_rows(rows, obs_a, seeds)
                outs[tag] = rows.act_rows(list(range(n))).clone()
            sync()
            res["policy_chunk_shape"] = list(outs["fast"].shape)
            res["policy_equal"] = bool(torch.equal(outs["fast"], outs["twin"]))
            res["policy_max_abs_diff"] = max_abs(outs["fast"], outs["twin"])
            res["policy_finite"] = bool(torch.isfinite(outs["fast"]).all())
            # a second call (noise counters advanced) must agree too
            again = {tag: rows.act_rows(list(range(n))).clone() for tag, rows in made.items()}
            res["policy_equal_call2"] = bool(torch.equal(again["fast"], again["twin"]))
            # row invariance: row 0 with the other rows' observations changed
            if n > 1:
                for tag, rows in made.items():
                    setup_policy_rows(rows, obs_b, seeds)
                    other = rows.act_rows(list(range(n))).clone()
                    res[f"policy_row0_invariant_{tag}"] = bool(torch.equal(other[0], outs[tag][0]))
                    res[f"policy_rows_changed_{tag}"] = bool(not torch.equal(other[1:], outs[tag][1:]))
            # against a batch of 1 (documented to differ by rounding, ~1e-6)
            if n == 1:
                row0_at_1["policy"] = outs["fast"][0].clone()
            elif "policy" in row0_at_1:
                res["policy_row0_equal_to_n1"] = bool(torch.equal(outs["fast"][0], row0_at_1["policy"]))
                res["policy_row0_max_abs_diff_to_n1"] = max_abs(outs["fast"][0], row0_at_1["policy"])
            for tag, rows in made.items():
                setup_policy_rows(rows, obs_a, seeds)
                res[f"policy_time_{tag}"] = t = time_calls(lambda r=rows, a=list(range(n)): r.act_rows(a), args.iters,
                                                           sync)
                t["per_row_ms"] = t["median_ms"] / n
            # -- critic
            cmade = {}
            for tag, kw in (("fast", fast_kw), ("twin", twin_kw)):
                template = CriticRuntime(critic_model, device=dev, **kw)
                Arena([template]).allocate()
                cmade[tag] = template.batched(n)
            couts = {}
            for tag, rows in cmade.items():
                setup_critic_rows(rows, obs_a)
                couts[tag] = rows.evaluate_rows(list(range(n))).clone()
            sync()
            res["critic_equal"] = bool(torch.equal(couts["fast"], couts["twin"]))
            res["critic_max_abs_diff"] = max_abs(couts["fast"], couts["twin"])
            res["critic_finite"] = bool(torch.isfinite(couts["fast"]).all())
            if n > 1:
                for tag, rows in cmade.items():
                    setup_critic_rows(rows, obs_b)
                    other = rows.evaluate_rows(list(range(n))).clone()
                    res[f"critic_row0_invariant_{tag}"] = bool(torch.equal(other[0], couts[tag][0]))
            if n == 1:
                row0_at_1["critic"] = couts["fast"][0].clone()
            elif "critic" in row0_at_1:
                res["critic_row0_equal_to_n1"] = bool(torch.equal(couts["fast"][0], row0_at_1["critic"]))
                res["critic_row0_max_abs_diff_to_n1"] = max_abs(couts["fast"][0], row0_at_1["critic"])
            for tag, rows in cmade.items():
                setup_critic_rows(rows, obs_a)
                res[f"critic_time_{tag}"] = t = time_calls(lambda r=rows, a=list(range(n)): r.evaluate_rows(a),
                                                           args.iters, sync)
                t["per_row_ms"] = t["median_ms"] / n
            if cuda:
                sync()
                res["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
                res["max_memory_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
                res["rows_allocated_mib"] = (torch.cuda.memory_allocated() - base) / 2**20
            log(f"(a) N={n:3d} policy equal={res['policy_equal']} (diff {res['policy_max_abs_diff']:.2e}) "
                f"row0-inv={res.get('policy_row0_invariant_fast')} "
                f"fast {res['policy_time_fast']['median_ms']:.3f} ms ({res['policy_time_fast']['per_row_ms']:.4f}/row) "
                f"twin {res['policy_time_twin']['median_ms']:.3f} ms | critic equal={res['critic_equal']} "
                f"inv={res.get('critic_row0_invariant_fast')} fast {res['critic_time_fast']['median_ms']:.3f} ms "
                f"twin {res['critic_time_twin']['median_ms']:.3f} ms"
                + (f" | peak {res['max_memory_allocated_mib']:.0f} MiB" if cuda else ""))
            del made, cmade, outs, couts
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {exc}"
            res["traceback"] = traceback.format_exc()
            log(f"(a) N={n} failed: {res['error']}")
        save()
    del policy_model, critic_model
    if cuda:
        torch.cuda.empty_cache()


# -- part (b): processes x slots -----------------------------------------------------------------------
def worker(wid: int, cfg: dict, seeds: list[int], barrier, queue) -> None:
    """One process: a host of `cfg['slots']` slots plays `seeds` once (warm-up), then `repeats` timed passes."""
    out: dict = {"wid": wid, "pid": os.getpid(), "slots": cfg["slots"], "seeds": seeds,
                 "gl": os.environ.get("MUJOCO_GL", "")}
    try:
        t = time.perf_counter()
        import torch

        torch.set_num_threads(1)
        if cfg.get("meta_site") and cfg["meta_site"] not in sys.path:
            sys.path.append(cfg["meta_site"])
        from capsule_rollout.rollout.host_config import HostConfig
        from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots
        from capsule_rollout.rollout.slots.host import episode_job

        out["import_s"] = time.perf_counter() - t
        dev = cfg["device"]
        cuda = dev.startswith("cuda")
        host_cfg = HostConfig(max_steps=cfg["max_steps"], record_images=False,
                              **({"n_exec": cfg["n_exec"]} if cfg.get("n_exec") else {}))
        spec = RunSpec(env="tabletop:pick_place", policy=str(CKPT / "policy"), critic=str(CKPT / "critic"),
                        device=dev, threads=1, slots=cfg["slots"], host=host_cfg,
                        env_threads=cfg.get("env_threads", 1))
        t = time.perf_counter()
        one = cfg["slots"] == 1
        host = build_host(spec) if one else build_slots(spec)
        out["build_s"] = time.perf_counter() - t

        def stats() -> dict:  # torch's memory and the batch's fill so far
            if not one:
                out["batch_fill"] = host.rows_served / max(host.calls, 1) / cfg["slots"]
                out["calls"] = host.calls
            if cuda:
                out["torch_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
                out["torch_max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
            return out

        def play() -> list[dict]:
            if one:
                results = []
                for s in seeds:
                    try:
                        results.append(host.run_episode(s))
                    except Exception as exc:  # noqa: BLE001
                        results.append(exc)
            else:
                results = [r.value if r.error is None else r.error
                           for r in host.run_items([episode_job(s) for s in seeds])]
            rows = []
            for s, r in zip(seeds, results, strict=True):
                if isinstance(r, BaseException) or r.episode is None:
                    rows.append({"seed": s, "error": repr(r) if isinstance(r, BaseException) else r.error, "length": 0})
                else:
                    m = r.episode.meta
                    rows.append({"seed": s, "length": int(m.length), "success": bool(m.success),
                                 "stop": m.stop_reason, "reset": r.reset_kind, "error": r.error})
            return rows

        t = time.perf_counter()
        warm = play()
        out["warmup_s"] = time.perf_counter() - t
        out["warmup_steps"] = sum(r["length"] for r in warm)
        out["warmup_resets"] = sorted({r.get("reset", "") for r in warm})
        passes = out["passes"] = []
        queue.put(dict(stats(), partial=True))  # what is done so far, should the run be cut off
        for _ in range(cfg["repeats"]):
            barrier.wait(timeout=cfg["barrier_timeout"])
            start = time.time()
            rows = play()
            end = time.time()
            passes.append({"start": start, "end": end, "steps": sum(r["length"] for r in rows), "episodes": rows,
                           "resets": sorted({r.get("reset", "") for r in rows})})
            queue.put(dict(stats(), passes=list(passes), partial=True))
        stats()
    except BaseException as exc:  # noqa: BLE001
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
    queue.put(out)


def run_config(ctx, procs: int, slots: int, args, meta_site, limit_s: float, env_threads: int = 1) -> dict:
    seeds = list(range(args.seed0, args.seed0 + args.episodes))
    shares = [seeds[i::procs] for i in range(procs)]
    cfg = {"device": args.device, "slots": slots, "env_threads": env_threads, "max_steps": args.max_steps,
           "n_exec": args.n_exec,
           "repeats": args.repeats, "barrier_timeout": max(limit_s, 10.0), "meta_site": meta_site}
    barrier = ctx.Barrier(procs)
    queue = ctx.Queue()
    workers = [ctx.Process(target=worker, args=(i, cfg, shares[i], barrier, queue), daemon=True)
               for i in range(procs)]
    deadline = time.monotonic() + limit_s
    got: list[dict] = []
    latest: dict[int, dict] = {}  # each worker's last report (a partial one when it was cut off)
    baseline = smi("--query-gpu=memory.used")
    with SmiSampler(1.0) as sampler:
        t = time.perf_counter()
        for w in workers:
            w.start()
        while len(got) < procs and time.monotonic() < deadline:
            try:
                msg = queue.get(timeout=1.0)
                latest[msg["wid"]] = msg
                if not msg.get("partial"):
                    got.append(msg)
            except Exception:  # noqa: BLE001  (queue.Empty)
                if not any(w.is_alive() for w in workers) and queue.empty():
                    break
        wall = time.perf_counter() - t
    timed_out = len(got) < procs
    got = [latest[w] for w in sorted(latest)]  # finished ones, and the partial reports of the others
    for w in workers:  # only the processes this function started
        w.join(timeout=5 if not timed_out else 1)
        if w.is_alive():
            w.terminate()
            w.join(timeout=5)
    res: dict = {"procs": procs, "slots": slots, "env_threads": env_threads, "episodes": args.episodes,
                 "wall_s": wall, "timed_out": timed_out, "smi": sampler.report(), "workers": []}
    errors = [g for g in got if "error" in g]
    res["errors"] = [{"wid": g["wid"], "error": g["error"], "traceback": g.get("traceback", "")[-3000:]}
                     for g in errors]
    ok = [g for g in got if "error" not in g]
    per_pass = []
    complete = min((len(g.get("passes", [])) for g in ok), default=0) if len(ok) == procs else 0
    res["passes_complete"] = complete
    if complete:
        for k in range(complete):
            start = min(g["passes"][k]["start"] for g in ok)
            end = max(g["passes"][k]["end"] for g in ok)
            steps = sum(g["passes"][k]["steps"] for g in ok)
            per_pass.append({"steps": steps, "span_s": end - start, "steps_per_s": steps / max(end - start, 1e-9),
                             "resets": sorted({r for g in ok for r in g["passes"][k]["resets"]}),
                             "slowest_proc_s": max(g["passes"][k]["end"] - g["passes"][k]["start"] for g in ok),
                             "fastest_proc_s": min(g["passes"][k]["end"] - g["passes"][k]["start"] for g in ok)})
        res["passes"] = per_pass
        res["steps_per_s_best"] = max(p["steps_per_s"] for p in per_pass)
        res["steps_per_s_median"] = statistics.median(p["steps_per_s"] for p in per_pass)
        res["episode_results"] = {str(e["seed"]): [e["length"], e.get("success"), e.get("error", "")]
                                  for g in ok for e in g["passes"][-1]["episodes"]}
        res["episode_errors"] = sum(1 for g in ok for e in g["passes"][-1]["episodes"] if e.get("error"))
    for g in got:
        w = {k: g.get(k) for k in ("wid", "pid", "slots", "import_s", "build_s", "warmup_s", "warmup_steps",
                                   "warmup_resets", "batch_fill", "calls", "torch_max_allocated_mib",
                                   "torch_max_reserved_mib", "gl", "error")}
        w["smi_mib"] = res["smi"]["per_pid_max_mib"].get(str(g.get("pid")))
        res["workers"].append(w)
    allocs = [w["torch_max_allocated_mib"] for w in res["workers"] if w.get("torch_max_allocated_mib") is not None]
    smis = [w["smi_mib"] for w in res["workers"] if w.get("smi_mib") is not None]
    res["torch_max_allocated_mib_per_proc"] = max(allocs) if allocs else None
    res["torch_max_allocated_mib_total"] = sum(allocs) if allocs else None
    res["smi_mib_per_proc_max"] = max(smis) if smis else None
    res["smi_mib_total"] = sum(smis) if smis else None
    try:  # when nvidia-smi's pids are not this namespace's: the device's memory use over the parent's baseline
        res["gpu_used_baseline_mib"] = float(baseline[0][0])
        res["gpu_used_over_baseline_per_proc_mib"] = (res["smi"]["gpu_used_max_mib"] - float(baseline[0][0])) / procs
    except (TypeError, ValueError, IndexError):
        pass
    return res


def probe_gl(candidates: list[str], timeout: float) -> dict:
    """Which offscreen GL backend makes a context in a fresh process (mujoco's own EGL / OSMesa contexts)."""
    tried = {}
    code = ("import mujoco, os; b=os.environ['MUJOCO_GL']; "
            "from capsule_rollout.envs.gl_backend import context_class; c=context_class(b)(64,64); c.make_current(); "
            "from OpenGL import GL; print('ok', mujoco.__version__, GL.glGetString(GL.GL_VENDOR), "
            "GL.glGetString(GL.GL_RENDERER)); c.free()")
    for backend in candidates:
        env = dict(os.environ, MUJOCO_GL=backend, PYOPENGL_PLATFORM=backend)
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                                 env=env, cwd=str(ROOT))
            ok = out.returncode == 0 and "ok" in out.stdout
            tried[backend] = out.stdout.strip()[-300:] if ok else (out.stdout + out.stderr)[-1500:]
        except Exception as exc:  # noqa: BLE001
            ok, tried[backend] = False, f"{type(exc).__name__}: {exc}"
        if ok:
            return {"backend": backend, "tried": tried}
    return {"backend": None, "tried": tried}


def part_b(args, report: dict, save) -> None:
    sec = report["b"] = {"configs": [], "episodes": args.episodes, "max_steps": args.max_steps,
                         "n_exec": args.n_exec, "repeats": args.repeats}
    try:
        import mujoco

        sec["mujoco"] = mujoco.__version__
    except Exception as exc:  # noqa: BLE001
        sec["skipped"] = f"import mujoco failed: {type(exc).__name__}: {exc}"
        log("(b) skipped:", sec["skipped"])
        return
    meta_site = ensure_entry_points()
    sec["entry_point_shim"] = bool(meta_site)  # whether a temporary dist-info stood in for an install
    try:
        _part_b(args, sec, save, meta_site)
    finally:
        if meta_site:
            shutil.rmtree(meta_site, ignore_errors=True)


def _part_b(args, sec: dict, save, meta_site) -> None:
    import multiprocessing as mp

    gl = probe_gl(args.gl, 90)
    sec["gl_probe"] = gl
    log("(b) GL probe:", gl["backend"], {k: v[-300:] for k, v in gl["tried"].items()})
    if gl["backend"] is None:
        sec["skipped"] = "no offscreen GL backend works (see gl_probe)"
        save()
        return
    os.environ["MUJOCO_GL"] = gl["backend"]
    os.environ["PYOPENGL_PLATFORM"] = gl["backend"]
    save()
    ctx = mp.get_context("spawn")
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs]  # PROCSxSLOTS[xENV_THREADS]
    for procs, slots, *threads in configs:
        threads = threads[0] if threads else 1
        remaining = args.budget - elapsed() - 10
        if remaining < args.min_config_s:
            log(f"(b) {procs}x{slots}: skipped, {remaining:.0f} s left")
            sec["configs"].append({"procs": procs, "slots": slots, "skipped": f"{remaining:.0f} s left"})
            continue
        log(f"(b) {procs} procs x {slots} slots, {args.episodes} episodes, limit {remaining:.0f} s")
        try:
            res = run_config(ctx, procs, slots, args, meta_site, remaining, threads)
        except Exception as exc:  # noqa: BLE001
            res = {"procs": procs, "slots": slots, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()}
        sec["configs"].append(res)
        log(f"(b) {procs}x{slots}x{threads}: steps/s best {res.get('steps_per_s_best')} (passes "
            f"{[round(p['steps_per_s']) for p in res.get('passes', [])]}), wall {res.get('wall_s', 0):.1f} s, "
            f"torch max/proc {res.get('torch_max_allocated_mib_per_proc')} MiB, smi/proc "
            f"{res.get('smi_mib_per_proc_max')} MiB (total {res.get('smi_mib_total')}), gpu used max "
            f"{res.get('smi', {}).get('gpu_used_max_mib')} MiB (over baseline/proc "
            f"{res.get('gpu_used_over_baseline_per_proc_mib')}), "
            f"resets {[p['resets'] for p in res.get('passes', [])][:1]}, errors {len(res.get('errors', []))}, "
            f"timed_out {res.get('timed_out')}, fill {[w.get('batch_fill') for w in res.get('workers', [])][:4]}")
        for e in res.get("errors", [])[:2]:
            log("   worker error:", e["error"], "\n", e["traceback"][-1200:])
        save()
    # the same seeds in each configuration: how many episodes came out the same (batching rounds differently)
    done = [c for c in sec["configs"] if c.get("episode_results")]
    if len(done) > 1:
        ref = done[0]["episode_results"]
        sec["same_as_first"] = {f"{c['procs']}x{c['slots']}": sum(1 for k, v in c["episode_results"].items()
                                                                    if ref.get(k) == v) for c in done[1:]}


# -- main --------------------------------------------------------------------------------------------------
def local_argv() -> list[str]:
    """The command line with the output path cut to its file name."""
    argv = list(sys.argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--out":
            argv[i + 1] = Path(argv[i + 1]).name
    return argv


def environment(args) -> dict:
    info = {"python": sys.version, "platform": platform.platform(), "cpus": os.cpu_count(), "argv": local_argv(),
            "MUJOCO_GL": os.environ.get("MUJOCO_GL")}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda"] = torch.version.cuda
    except Exception as exc:  # noqa: BLE001
        info["torch_error"] = repr(exc)
    info["nvidia_smi"] = smi("--query-gpu=name,memory.total,memory.used,driver_version")
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="small sizes: prove the code paths (a CPU run)")
    p.add_argument("--budget", type=float, default=None, help="overall seconds (default 330; quick 600)")
    p.add_argument("--a_share", type=float, default=0.4, help="fraction of the budget part (a) may use")
    p.add_argument("--ns", type=int, nargs="*", default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--configs", nargs="*", default=None, help="PROCSxSLOTS each, e.g. 16x1 2x8 4x4")
    p.add_argument("--episodes", type=int, default=None)
    p.add_argument("--max_steps", type=int, default=None)
    p.add_argument("--n_exec", type=int, default=None, help="default: HostConfig's")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--seed0", type=int, default=0)
    p.add_argument("--gl", nargs="*", default=None, help="GL backends to try in order (default egl, osmesa)")
    p.add_argument("--min_config_s", type=float, default=None)
    p.add_argument("--skip_a", action="store_true")
    p.add_argument("--skip_b", action="store_true")
    args = p.parse_args()
    q = args.quick
    defaults = {"budget": 600.0 if q else 330.0, "ns": [1, 8] if q else [1, 2, 4, 8, 16, 32, 64],
                "iters": 5 if q else 50, "configs": ["2x1", "1x2"] if q else ["16x1", "2x8", "4x4", "8x2", "1x16"],
                "episodes": 4 if q else 128, "max_steps": 30 if q else 80, "repeats": 1 if q else 3,
                "min_config_s": 30.0 if q else 45.0}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.gl is None:
        env_gl = os.environ.get("MUJOCO_GL")
        args.gl = list(dict.fromkeys([*([env_gl] if env_gl else []), "egl", "osmesa"]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # the report names no directory of the machine it ran on: the output by its file name
    report: dict = {"args": {**vars(args), "out": out.name}, "env": environment(args), "status": "running"}

    def save() -> None:
        report["elapsed_s"] = elapsed()
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1, default=str))
        tmp.replace(out)

    log("env:", {k: report["env"].get(k) for k in ("python", "torch", "gpu", "cpus", "MUJOCO_GL")})
    save()
    for name, part, skip in (("a", part_a, args.skip_a), ("b", part_b, args.skip_b)):
        if skip:
            continue
        try:
            part(args, report, save)
        except Exception as exc:  # noqa: BLE001 - recorded; the other part still runs
            report[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            report[f"{name}_traceback"] = traceback.format_exc()
            log(f"({name}) failed:", report[f"{name}_error"])
        save()
    report["status"] = "done"
    save()
    log("report written to", out)


if __name__ == "__main__":
    main()
