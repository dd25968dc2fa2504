"""The kernel engineer's inner loop, measured: every accuracy case against the fp64 oracle
(`check_correctness`, NaN-poisoned outputs), and implementations timed against the roofline on
configs given as text (`parse_configs`: 'H,T,B,L;...'), each checked against the first
(`time_configs`). `kdtree.tools.devcheck` and `kdtree.tools.kernel_times` are their command lines.
"""

from __future__ import annotations

import os
import statistics
from typing import Callable

import torch

from kdtree.bench.accuracy_cases import ACCURACY_CASES
from kdtree.bench.cases import call, make_case, oracle
from kdtree.bench.roofline import Shape, bytes_moved, floor_seconds, flops
from kdtree.bench.timing import round_robin


def check_correctness(fn, trials: int = 2) -> list[dict]:
    """Every accuracy case (`kdtree.bench.accuracy_cases`), ``trials`` fresh seeds each, against the fp64 oracle."""
    rows = []
    for name, H, reqs, kind in ACCURACY_CASES:
        for _ in range(trials):
            seed = int.from_bytes(os.urandom(4), "little")
            case = make_case(H, reqs, kind, seed)
            nq = case["q"].shape[0]
            out = torch.full((nq, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
            lse = torch.full((nq, H), float("nan"), dtype=torch.float32, device="cuda")
            call(fn, case, out=out, lse=lse)
            torch.cuda.synchronize()
            ref_out, ref_lse = oracle(case)
            o = out.double()
            unwritten = int(torch.isnan(o).sum())
            rel = float((o - ref_out).norm() / ref_out.norm())
            mx = float((o - ref_out).abs().max())
            lse_err = float((lse.double() - ref_lse.double()).abs().max())
            ok = unwritten == 0 and rel <= 1e-2 and mx <= 5e-2 and lse_err <= 1e-2
            rows.append(dict(case=name, seed=seed, rel_l2=rel, max_abs=mx, lse_abs=lse_err,
                             unwritten=unwritten, ok=ok))
    return rows


def parse_configs(text: str) -> list[tuple[int, int, int, int]]:
    """'H,T,B,L;H,T,B,L' -> [(H, T, B, L), ...], with a clear error for anything else."""
    configs = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        fields = part.split(",")
        if len(fields) != 4 or not all(f.strip().isdigit() for f in fields):
            raise ValueError(f"{part!r} is not H,T,B,L (four whole numbers)")
        configs.append(tuple(int(f) for f in fields))
    if not configs:
        raise ValueError(f"{text!r} names no config (expected 'H,T,B,L;...')")
    return configs


def baselines() -> dict:
    """The importable baselines by name (naive torch, the Triton kernel)."""
    found = {}
    try:
        from kdtree.kernels.naive import tree_verify_mla_naive  # noqa: PLC0415

        found["naive"] = tree_verify_mla_naive
    except Exception as exc:  # noqa: BLE001
        print("naive unavailable:", exc)
    try:
        from kdtree.kernels.triton_baseline import tree_verify_mla_triton  # noqa: PLC0415

        found["triton"] = tree_verify_mla_triton
    except Exception as exc:  # noqa: BLE001
        print("triton baseline unavailable:", exc)
    return found


def time_configs(configs, pool, bw, fl, fns: dict, timer, budget_s: float = 2.0, layouts=("scattered",),
                 on_row: Callable[[dict], None] = lambda row: None):
    """Per config and layout: every implementation of ``fns`` checked against the first one,
    then timed interleaved (median of a few dozen queued calls); ``on_row`` sees each row as it
    is measured."""
    table = []
    anchor = next(iter(fns))
    for H, T, B, L in configs:
        shape = Shape(H, T, B, L)
        floor = floor_seconds(shape, bw, fl)
        for layout in layouts:
            case = make_case(H, [(T, L)] * B, "random", int.from_bytes(os.urandom(4), "little"), pool=pool,
                             contiguous=layout == "contiguous")
            ref = call(fns[anchor], case)
            row = dict(H=H, T=T, B=B, L=L, layout=layout, floor_ms=floor * 1e3)
            calls, reps = {}, {}
            for name, fn in fns.items():
                out = call(fn, case)  # warm-up: JIT compile / autotune stay out of the estimate
                first = timer(lambda: call(fn, case))
                if first > budget_s:
                    row[name] = f"skipped (one call {first:.1f}s > {budget_s}s)"
                    continue
                rel = float((out.float() - ref.float()).norm() / ref.float().norm())
                row[name] = dict(rel_vs_first=rel)
                calls[name] = lambda r, fn=fn: call(fn, case)
                reps[name] = max(5, min(50, int(0.3 / max(first, 1e-5))))
            gpu = round_robin(calls, repeats=reps, timer=timer)
            for name, ts in gpu.items():
                med = statistics.median(ts)
                row[name].update(ms=med * 1e3, min_ms=min(ts) * 1e3, max_ms=max(ts) * 1e3, roofline=floor / med,
                                 gbs=bytes_moved(shape) / med / 1e9, tflops=flops(shape) / med / 1e12)
            table.append(row)
            on_row(row)
    return table
