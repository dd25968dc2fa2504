"""The benchmark over the roofline grid: every implementation on fresh random trees per shape and
layout (`kdtree.bench.cases`), outputs checked against each other (rel-L2 against naive, else
cuda) before their times count, then timed interleaved (`kdtree.bench.timing.round_robin`),
rotating over a few input sets; a call that would take over `SKIP_SECONDS` is left out (a cost
model fitted as it goes). `run` measures the ceilings and walks the grid; `machine_facts` records
what it ran on. `kdtree.tools.bench` is its command line.
"""

from __future__ import annotations

import datetime
import importlib
import math
import platform
import random
import shlex
import subprocess
import time
from pathlib import Path
from typing import Optional

import torch

from kdtree.bench.cases import case_args, make_pool, pool_slots_for, uniform_case
from kdtree.bench.forced import forced_kernel
from kdtree.bench.roofline import Shape, bytes_moved, floor_seconds, flops, grid
from kdtree.bench.timing import make_timer, measure_ceilings, round_robin


IMPLEMENTATIONS = {
    "cuda": "kdtree.kernels:tree_verify_mla",
    "triton": "kdtree.kernels.triton_baseline:tree_verify_mla_triton",
    "naive": "kdtree.kernels.naive:tree_verify_mla_naive",
}


ANCHOR_ORDER = ("naive", "cuda", "triton")  # whose output the others are checked against


AGREE_REL_L2 = 2e-2


SKIP_SECONDS = 2.0


TARGET_SECONDS = 0.3  # timed work per config and implementation


MIN_REPS, MAX_REPS = 5, 200


INPUT_SETS = 3


def bench_grid(quick: bool) -> list[Shape]:
    """The shapes benchmarked: the full grid, or the quick subset the speedup gate uses."""
    return grid(quick)


def _median(xs):
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


class _CostModel:
    """seconds ≈ c * H*T*(L+T)*B per implementation, c fitted from the configs measured so far.

    c is the smallest ratio seen (the best-utilised config), so the estimate is optimistic and a
    config is only left out unmeasured when even that rate would take over the limit; small
    configs pay launch overhead and padded tree blocks that large ones do not.
    """

    def __init__(self):
        self.ratios: dict = {}

    @staticmethod
    def work(s: Shape) -> float:
        return s.H * s.T * (s.L + s.T) * s.B

    def add(self, impl: str, s: Shape, seconds: float) -> None:
        self.ratios.setdefault(impl, []).append(seconds / self.work(s))

    def predict(self, impl: str, s: Shape) -> Optional[float]:
        ratios = self.ratios.get(impl, [])
        return min(ratios) * self.work(s) if len(ratios) >= 2 else None


def bench_config(shape: Shape, layout: str, fns: dict, pool: torch.Tensor, bw: float, rate: float,
                 seed: int, model: _CostModel, timer) -> list[dict]:
    """Rows for one shape and layout: every implementation checked, then timed interleaved by
    ``timer`` (`kdtree.bench.timing.make_timer`); a row notes the calls whose host time exceeded
    the timer's lead, since their GPU time may include host gaps."""
    cases = [uniform_case(shape.H, shape.T, shape.B, shape.L, layout, pool, seed + i) for i in range(INPUT_SETS)]
    floor = floor_seconds(shape, bw, rate)
    rows, outs, first = {}, {}, {}
    for name, fn in fns.items():
        row = dict(H=shape.H, T=shape.T, B=shape.B, L=shape.L, layout=layout, impl=name, label=shape.label,
                   floor_ms=floor * 1e3, bytes=bytes_moved(shape), flops=flops(shape), status="ok", note="")
        rows[name] = row
        guess = model.predict(name, shape)
        if guess is not None and guess > SKIP_SECONDS:
            row.update(status="skipped", note=f"est. {guess:.3g} s/call > {SKIP_SECONDS:g} s (cost model)")
            continue
        try:
            outs[name] = [torch.empty(c["q"].shape[0], c["q"].shape[1], 512, dtype=torch.bfloat16,
                                      device=pool.device) for c in cases]
            fn(*case_args(cases[0]), out=outs[name][0])  # warm-up (compiles) and the output checked
            t1 = timer(lambda: fn(*case_args(cases[1]), out=outs[name][1]))
        except Exception as exc:  # noqa: BLE001 - one failing implementation must not end the run
            outs.pop(name, None)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            row.update(status="error", note=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        model.add(name, shape, t1)
        first[name] = t1
        if t1 > SKIP_SECONDS:
            row.update(status="skipped", note=f"one call took {t1:.3g} s > {SKIP_SECONDS:g} s",
                       median_ms=t1 * 1e3, min_ms=t1 * 1e3, max_ms=t1 * 1e3, reps=1)
            del outs[name]
    anchor = next((a for a in ANCHOR_ORDER if a in outs), None)
    for name in outs:
        if name == anchor:
            rows[name]["check"] = "anchor"
            continue
        if anchor is None:
            continue
        err = _rel_l2(outs[name][0], outs[anchor][0])
        rows[name].update(rel_l2=err, check=f"vs {anchor}")
        if not err <= AGREE_REL_L2:
            rows[name].update(status="disagree", note=f"rel-L2 {err:.2g} vs {anchor} > {AGREE_REL_L2}")
    if anchor is not None and len(outs) == 1:
        rows[anchor].update(check="unchecked (no other implementation ran)")
    reps = {n: min(MAX_REPS, max(MIN_REPS, math.ceil(TARGET_SECONDS / max(first[n], 1e-6)))) for n in outs}
    calls = {n: (lambda r, n=n: fns[n](*case_args(cases[r % INPUT_SETS]), out=outs[n][r % INPUT_SETS]))
             for n in outs}
    host = {name: [] for name in calls}
    gpu = round_robin(calls, repeats=reps, timer=timer, host=host)
    lead_s = getattr(timer, "lead_s", 0.0)
    for name, times in gpu.items():
        med = _median(times)
        rows[name].update(median_ms=med * 1e3, min_ms=min(times) * 1e3, max_ms=max(times) * 1e3,
                          reps=len(times), gbps=bytes_moved(shape) / med / 1e9,
                          tflops=flops(shape) / med / 1e12, fraction=floor / med,
                          host_us=_median(host[name]) * 1e6)
        if lead_s:
            over = sum(h > lead_s for h in host[name])
            rows[name]["lead_overruns"] = over
            if over:
                rows[name]["note"] = (rows[name]["note"] + f" host time > {lead_s * 1e6:g} µs lead in {over}/"
                                      f"{len(times)} calls: those include host gaps").strip()
        if floor / med > 1.0:
            rows[name]["note"] = (rows[name]["note"] + " faster than the floor: measurement error?").strip()
    return list(rows.values())


def _run(cmd: list[str]) -> Optional[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip() or None
    except Exception:  # noqa: BLE001 - a missing tool is reported as None
        return None


def machine_facts(bw: float, rate: float, argv: list[str], device="cuda") -> dict:
    """GPU, versions, git state, date and command line of this run."""
    props = torch.cuda.get_device_properties(device) if torch.device(device).type == "cuda" else None
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None
    nvcc = _run(["nvcc", "--version"])
    repo = Path(__file__).resolve().parents[1]  # the checkout holding tools/
    return dict(
        gpu=props.name if props else None, sm=f"{props.major}.{props.minor}" if props else None,
        sms=props.multi_processor_count if props else None,
        memory_gb=props.total_memory / 2**30 if props else None,
        driver=_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        torch=torch.__version__, cuda=torch.version.cuda, triton=triton_version,
        nvcc=next((line for line in nvcc.splitlines() if "release" in line), nvcc) if nvcc else None,
        python=platform.python_version(),
        git_sha=_run(["git", "-C", str(repo), "rev-parse", "HEAD"]),
        git_dirty=bool(_run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"])),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command="python -m kdtree.tools.bench " + shlex.join(argv),
        copy_bytes_per_s=bw, bf16_flops_per_s=rate,
    )


def load_impls(names: list[str], variant: Optional[str] = None, num_splits: Optional[int] = None) -> dict:
    """The implementations by name; the CUDA kernel with ``variant`` / ``num_splits`` forced."""
    fns = {}
    for name in names:
        module, attr = IMPLEMENTATIONS[name].split(":")
        fns[name] = getattr(importlib.import_module(module), attr)
        if name == "cuda" and (variant is not None or num_splits is not None):
            fns[name] = forced_kernel(variant, num_splits)
    return fns


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def prepare(fns: dict, pool: torch.Tensor, log=print) -> dict:
    """Call each implementation once on a small case (builds / compiles); drop those that fail."""
    case = uniform_case(8, 16, 1, min(4096, pool.shape[0] - 16), "scattered", pool, seed=1)
    errors = {}
    for name in list(fns):
        t0 = time.time()
        try:
            fns[name](*case_args(case))
            _sync(pool.device)
            log(f"{name}: ready in {time.time() - t0:.1f} s")
        except Exception as exc:  # noqa: BLE001 - reported, the others still run
            errors[name] = f"{type(exc).__name__}: {exc}"[:500]
            log(f"{name}: left out, first call failed: {errors[name]}")
            del fns[name]
    return errors


def _progress(i: int, n: int, shape: Shape, layout: str, rows: list[dict], started: float) -> str:
    parts = []
    for r in rows:
        if "median_ms" in r and r["status"] == "ok":
            parts.append(f"{r['impl']} {r['median_ms']:.3f} ms ({100 * r['fraction']:.0f} %)")
        else:
            parts.append(f"{r['impl']} {r['status']}")
    return f"[{i}/{n} {time.time() - started:5.0f} s] {shape.label} {layout}: " + " | ".join(parts)


def run(impl_names: list[str], shapes: list[Shape], layouts: list[str], pool_gb: float,
        budget_s: float, argv: list[str], log=print, device="cuda", flush_mode: str = "read",
        variant: Optional[str] = None, num_splits: Optional[int] = None) -> tuple[list[dict], dict]:
    """Measure the ceilings, then every (shape, layout); stop starting configs after budget_s."""
    started = time.time()
    fns = load_impls(impl_names, variant, num_splits)
    bw, rate = measure_ceilings(device)
    log(f"ceilings: copy {bw / 1e9:.0f} GB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    pool = make_pool(pool_slots_for(pool_gb), device)
    log(f"pool: {pool.shape[0]} slots ({pool.numel() * 2 / 2**30:.1f} GiB)")
    timer = make_timer(device, flush_mode=flush_mode)
    facts = machine_facts(bw, rate, argv, device)
    impl_errors = prepare(fns, pool, log)
    facts.update(pool_slots=pool.shape[0], layouts=list(layouts), impls=list(fns), impl_errors=impl_errors,
                 not_run=[], agree_rel_l2=AGREE_REL_L2, anchors=list(ANCHOR_ORDER), skip_seconds=SKIP_SECONDS,
                 flush_bytes=getattr(timer, "flush_bytes", 0), flush_mode=flush_mode,
                 lead_s=getattr(timer, "lead_s", 0.0), timer=timer.label, variant=variant, num_splits=num_splits)
    model, rows = _CostModel(), []
    todo = [(s, layout) for s in shapes for layout in layouts]
    for i, (shape, layout) in enumerate(todo, 1):
        if time.time() - started > budget_s:
            facts["not_run"].append(f"{shape.label} {layout}")
            continue
        seed = random.SystemRandom().randrange(2**31)
        got = bench_config(shape, layout, fns, pool, bw, rate, seed, model, timer)
        rows += got
        log(_progress(i, len(todo), shape, layout, got, started))
    if facts["not_run"]:
        log(f"time budget of {budget_s:.0f} s spent: {len(facts['not_run'])} configs not run")
    facts["wall_s"] = time.time() - started
    return rows, facts
