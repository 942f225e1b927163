"""GPU check of env slots: batched policy / critic rows (capture vs eager, row invariance, timing, memory) and
tabletop episodes played by many one-env processes vs fewer processes of several slots each.

Self-contained: needs the repository on sys.path (it adds its own checkout) and, for part (b), mujoco,
gymnasium and PyOpenGL. Writes a JSON report to --out after every stage (a kill keeps what was done).

    python3 experiments_gpu/gpu_slots.py --out /tmp/gpu_slots.json             # on a GPU machine
    python3 experiments_gpu/gpu_slots.py --device cpu --quick --out /tmp/q.json  # the code paths, on a CPU

Part (a): for each N, a `PolicyRuntime(capture=True).batched(N)` and an eager twin (`capture=False, trace=False`)
of the same model; the same seeded observations, language and noise seed per row; `act_rows(all rows)` on both
compared bit for bit (torch.equal); row 0's chunk compared when the other rows' observations change (row
invariance) and against N=1; median ms per call over `--iters` calls (synchronized); the same for
`CriticRows.evaluate_rows`; torch's peak memory per N. On the CPU (`--device cpu`) the "fast" runtime is the
traced one (capture=False, trace=None) and the twin is eager (trace=False).

Part (b): `HostSpec(env="tabletop:pick_place", ...)` episodes in spawned processes: P processes of S slots each
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
import statistics
import sys
import time
import traceback
from pathlib import Path

from gpu_common import CKPT, ROOT, T0, TEXTS, SmiSampler, elapsed, ensure_entry_points, log, smi  # noqa: E402,F401
from slot_layouts import part_b  # noqa: E402


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
