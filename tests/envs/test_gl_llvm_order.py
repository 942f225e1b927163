"""Rendering first and loading Triton afterwards must not crash the process.

Mesa's llvmpipe and Triton each bundle LLVM; loading Triton's native library after
a GL context exists used to end in a segmentation fault (e.g. building an optimizer
after collecting episodes). Runs in a subprocess so a crash fails this test only.
"""

import subprocess
import sys

import pytest

pytest.importorskip("triton")

SCRIPT = """
from capsule_rollout.tabletop.tabletop_env import TabletopEnv
env = TabletopEnv("pick_place", cameras=("front",))
env.reset(seed=0)
import triton._C.libtriton  # what torch loads lazily, e.g. in torch.optim
import torch
torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=1e-3)
print("ok")
"""


def test_render_then_load_triton_does_not_crash():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.strip().endswith("ok")
