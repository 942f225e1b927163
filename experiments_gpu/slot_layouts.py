"""Part (b) of the GPU slot check: tabletop episodes on P processes of S slots (and W env threads) each."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback

from gpu_common import CKPT, ROOT, T0, TEXTS, SmiSampler, elapsed, ensure_entry_points, log, smi  # noqa: E402,F401


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
        from capsule_rollout.rollout.host_factory import HostSpec, build_host, build_slots
        from capsule_rollout.rollout.slot_host import episode_job

        out["import_s"] = time.perf_counter() - t
        dev = cfg["device"]
        cuda = dev.startswith("cuda")
        host_cfg = HostConfig(max_steps=cfg["max_steps"], record_images=False,
                              **({"n_exec": cfg["n_exec"]} if cfg.get("n_exec") else {}))
        spec = HostSpec(env="tabletop:pick_place", policy=str(CKPT / "policy"), critic=str(CKPT / "critic"),
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
