"""One source of truth across the C++ boundary: the extension publishes its variant table and
launch limits, and `cuda_op` holds `launch_plan`'s copy to them when it loads it. The fake
extensions need nothing; the built one needs nvcc (no GPU: the binding loads without one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from kdtree.kernels import cuda_op
from kdtree.kernels import launch_plan as lp

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc is not installed")

SM90 = (9, 0)


def _ext(**change):
    table = [(name, vid, lp.BLOCK_M[vid], 256, 1000) for name, vid in lp.VARIANTS.items()]
    fields = dict(launch_fields=cuda_op.LaunchParams._fields, variants=tuple(table), block_n=lp.BLOCK_N,
                  max_splits=lp.MAX_SPLITS, max_grid_yz=65535, __file__="/fake/_tree_verify_mla.so")
    fields.update(change)
    return SimpleNamespace(**fields)


def test_an_extension_that_agrees_is_loaded():
    assert cuda_op.extension_mismatch(_ext(), SM90) is None
    cuda_op.check_extension(_ext(), SM90)
    no_wgmma = tuple(row for row in _ext().variants if row[0] != "wgmma")
    assert cuda_op.extension_mismatch(_ext(variants=no_wgmma), (12, 0)) is None  # an sm_120 build has no wgmma


@pytest.mark.parametrize("change,message", [
    (dict(launch_fields=("q",)), "it takes launch fields ('q',)"),
    (dict(block_n=64), "its block_n is 64, kdtree.kernels.launch_plan's is 32"),
    (dict(max_splits=512), "its max_splits is 512, kdtree.kernels.launch_plan's is 1024"),
    (dict(variants=(("base16", 1, 32, 256, 1000),)),
     "its variant 'base16' is id 1 with 32 rows per CTA, kdtree.kernels.launch_plan has id 1 with 16 rows"),
    (dict(variants=(("ws", 4, 32, 256, 1000),)), "its variant 'ws' is id 4"),
    (dict(variants=(("base16", 1, 16, 256, 1000), ("base32", 2, 32, 256, 1000), ("ws", 3, 32, 384, 1000))),
     "it has no variant wgmma"),
])
def test_a_disagreeing_extension_is_refused_naming_what_differs(change, message):
    assert message in cuda_op.extension_mismatch(_ext(**change), SM90)
    with pytest.raises(RuntimeError, match="does not match kdtree.kernels: .*clear the JIT cache"):
        cuda_op.check_extension(_ext(**change), SM90)


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("arch,capability", [("sm_90", (12, 0)), ("sm_90a", SM90)])
def test_the_built_extension_publishes_what_launch_plan_plans_with(arch, capability):
    # its own process: a process loads one extension module of this name
    script = (f"import json; from kdtree.kernels import cuda_op, jit; ext = jit.load_extension([{arch!r}]); "
              f"print(json.dumps(dict(mismatch=cuda_op.extension_mismatch(ext, {capability!r}), "
              "variants=[list(v) for v in ext.variants], block_n=ext.block_n, max_splits=ext.max_splits, "
              "max_grid_yz=ext.max_grid_yz, smem=[ext.shared_bytes(v[1]) for v in ext.variants])))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["mismatch"] is None
    assert [v[0] for v in got["variants"]] == [n for n in lp.VARIANTS if arch == "sm_90a" or n != "wgmma"]
    assert (got["block_n"], got["max_splits"], got["max_grid_yz"]) == (lp.BLOCK_N, lp.MAX_SPLITS, 65535)
    assert got["smem"] == [v[4] for v in got["variants"]] and all(v[3] > 0 and v[4] > 0 for v in got["variants"])
