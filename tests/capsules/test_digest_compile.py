"""The Triton digest kernel compiled ahead of time for real GPU targets, on a machine without a GPU.

Under `TRITON_INTERPRET=1` the kernel runs as Python and the compiler never sees it,
so a kernel the compiler refuses still passes the interpreter tests. Here it goes
through Triton's whole pipeline (TTIR, TTGIR, LLVM IR, PTX, and a cubin from the
ptxas bundled with Triton) for sm_80 (A100) and sm_90 (H100) targets. The compile
runs in a fresh process without the interpreter (it patches `triton.language`).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ARCHS = (80, 90)
BLOCK = 1024  # digest_triton.BLOCK_WORDS
CONSTANTS = ("GOLDEN", "SALT", "MIX1", "MIX2", "MASK30", "MASK27", "MASK31")

# Compiles the kernel as the JIT would on a GPU; the signature is read from the kernel
# itself (every tensor argument an int64 buffer, BLOCK its one compile-time argument).
_COMPILE = r"""
import inspect, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from capsule_rollout.capsules import digest_triton

kernel = digest_triton._digest_blocks
params = inspect.signature(kernel.fn).parameters
signature = {n: "constexpr" if "constexpr" in str(p.annotation) else "*i64" for n, p in params.items()}
out = {}
for arch in json.loads(sys.argv[1]):
    try:
        k = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs={"BLOCK": digest_triton.BLOCK_WORDS}),
                           target=GPUTarget("cuda", arch, 32))
    except Exception as exc:
        out[arch] = {"error": f"{type(exc).__name__}: {exc}"}
        continue
    out[arch] = {"stages": sorted(k.asm), "ttir": k.asm["ttir"], "cubin_magic": k.asm["cubin"][:4].hex(),
                 "ptx_target": [l.split()[1] for l in k.asm["ptx"].splitlines() if l.startswith(".target")]}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    # neither the interpreter nor the escape hatch that lets the compiler read plain globals
    dropped = ("TRITON_INTERPRET", "TRITON_ALLOW_NON_CONSTEXPR_GLOBALS")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))  # compile afresh, not from a cache
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(ARCHS)], capture_output=True, text=True,
                          env=env, cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {int(k): v for k, v in json.loads(proc.stdout.splitlines()[-1]).items()}


@pytest.mark.parametrize("arch", ARCHS)
def test_digest_kernel_compiles_to_a_cubin_for_gpu_targets(compiled, arch):
    result = compiled[arch]
    assert "error" not in result, result.get("error")
    assert {"ttir", "ttgir", "llir", "ptx", "cubin"} <= set(result["stages"])
    assert result["ptx_target"] and result["ptx_target"][0].startswith(f"sm_{arch}")
    assert result["cubin_magic"] == b"\x7fELF".hex()  # ptxas made a device binary


def test_compiled_kernel_holds_the_reference_constants(compiled):
    from capsule_rollout.capsules import digest

    ttir = compiled[ARCHS[-1]].get("ttir", "")
    for name in CONSTANTS:  # as full 64-bit values (splat over a block), not truncated
        assert f"dense<{getattr(digest, name)}> : tensor<{BLOCK}xi64>" in ttir, name
