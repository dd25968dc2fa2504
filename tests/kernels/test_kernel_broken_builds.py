"""Deliberately broken builds of the kernel (knobs.cuh's KD_BREAK) go wrong in the way each
was broken, in every variant: each flag is compiled into a fresh extension in a child process,
every variant the device runs is forced through `cuda_op.launch` (with one KV split and with
three), and the output is held against the fp64 oracle. A correct build must pass the same
check, so the check itself can fail both ways. KD_BREAK 16 breaks the wgmma variant alone (on a
9.0 device). GPU only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import json, torch
from kdtree.bench.cases import call, make_case, oracle
from kdtree.bench.forced import forced_kernel
from kdtree.kernels.launch_plan import runnable_variants
case = make_case(8, [(40, 300), (7, 45)], "random", seed=11)
ref_out, ref_lse = oracle(case)
rows = []
for variant in runnable_variants(torch.cuda.get_device_capability()):
    for splits in (1, 3):
        out = torch.full((47, 8, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((47, 8), float("nan"), dtype=torch.float32, device="cuda")
        call(forced_kernel(variant, splits), case, out=out, lse=lse)
        torch.cuda.synchronize()
        o = out.double()
        written = ~torch.isnan(o)
        rows.append(dict(variant=variant, splits=splits, unwritten=int((~written).sum()),
                         rel=float(((o - ref_out)[written]).norm() / ref_out[written].norm()),
                         rel_hi=float(((o - ref_out)[..., 256:]).norm() / ref_out[..., 256:].norm()),
                         rel_lo=float(((o - ref_out)[..., :256]).norm() / ref_out[..., :256].norm()),
                         lse_abs=float((lse.double() - ref_lse.double()).abs().nan_to_num(0.0).max())))
print(json.dumps(rows))
"""


def _run(flags: str) -> list[dict]:
    env = dict(os.environ, KDTREE_NVCC_FLAGS=flags)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_the_correct_build_passes_the_check_in_every_variant():
    for r in _run(""):
        assert r["unwritten"] == 0 and r["rel"] < 1e-2 and r["lse_abs"] < 1e-2, r


@pytest.mark.gpu
@pytest.mark.parametrize("flag,why", [(1, "wrong mask bits"), (2, "prefix hidden"), (4, "wrong scale")])
def test_broken_numerics_are_wrong_but_fully_written(flag, why):
    for r in _run(f"-DKD_BREAK={flag}"):
        assert r["unwritten"] == 0, (why, r)
        assert r["rel"] > 5e-2, (why, r)  # the error is in the values, far above bf16 noise
    if flag == 4:
        assert all(r["lse_abs"] > 1e-1 for r in _run(f"-DKD_BREAK={flag}")), "a wrong scale moves lse too"


@pytest.mark.gpu
def test_unwritten_rows_stay_poisoned_and_the_rest_is_right():
    for r in _run("-DKD_BREAK=8"):
        if r["splits"] == 1:
            assert r["unwritten"] > 0 and r["unwritten"] % 512 == 0, r  # whole rows stay poisoned
            assert r["rel"] < 1e-2, r  # the rows it did write are right: the failure is the gap
        else:  # the combine pass writes every row, from a partial that was never written
            assert r["rel"] > 5e-2 or r["unwritten"] > 0, r


@pytest.mark.gpu
def test_a_wgmma_only_break_is_wrong_in_wgmma_alone():
    import torch

    from kdtree.kernels.launch_plan import runnable_variants

    if "wgmma" not in runnable_variants(torch.cuda.get_device_capability()):
        pytest.skip("the wgmma variant runs on compute capability 9.0 only")
    rows = _run("-DKD_BREAK=16")
    assert {r["variant"] for r in rows} == set(runnable_variants(torch.cuda.get_device_capability()))
    for r in rows:
        assert r["unwritten"] == 0, r
        if r["variant"] == "wgmma":  # its second warpgroup read V's low half: columns 256.. are wrong
            assert r["rel_hi"] > 5e-2 and r["rel_lo"] < 1e-2, r
        else:
            assert r["rel"] < 1e-2 and r["lse_abs"] < 1e-2, r
