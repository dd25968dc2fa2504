"""Benchmark of the tree-verify implementations on a GPU, against the measured roofline.

    python -m kdtree.kernels.bench [--quick] [--impl cuda --impl triton ...] [--layout both]
                                   [--pool-gb 8] [--out plans/results/phase1] [--filter REGEX]
                                   [--flush read|write]

One run measures the copy bandwidth and the bf16 matmul rate, allocates one pool of random bf16
latent rows (8 GB by default), then for every shape of the grid (`roofline.grid`) and layout
(slots scattered over the pool, or one contiguous range) times each implementation on fresh
random trees: CUDA-event timings after warm-up, rotating over a few input sets, candidates
interleaved. Before every timed call the L2 is flushed (by default by reading a buffer twice its
size, so that it holds no dirty lines: `l2_flush`) and a GPU busy-wait of LEAD_S is queued,
so the host enqueues the call while the GPU is still busy: the events measure the call's GPU time
with a cold L2, not its host launch overhead (triton.testing.do_bench's and FlashInfer's practice).
The host time each call took to return (its enqueue cost, behind the busy-wait) is kept per row
as ``host_us``. Outputs are checked against each other (rel-L2 against naive, else cuda) before
their times count. A call that would take over 2 s is left out.
Writes bench.json (rows + machine facts), bench.md and two PNGs into --out (`bench_report`).

`make_case`, `floor_seconds`, `measure_ceilings`, `bench_grid` and `time_interleaved` are the
pieces the phase gate reuses. Nothing here touches CUDA at import time.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import math
import platform
import random
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from kdtree.kernels import pack_tree_masks
from kdtree.kernels.bench_report import write_report
from kdtree.kernels.roofline import Shape, bytes_moved, flops, grid
from kdtree.kernels.roofline import floor_seconds as _shape_floor

IMPLEMENTATIONS = {
    "cuda": "kdtree.kernels:tree_verify_mla",
    "triton": "kdtree.kernels.triton_baseline:tree_verify_mla_triton",
    "naive": "kdtree.kernels.naive:tree_verify_mla_naive",
}
ANCHOR_ORDER = ("naive", "cuda", "triton")  # whose output the others are checked against
LAYOUTS = ("scattered", "contiguous")
AGREE_REL_L2 = 2e-2
SKIP_SECONDS = 2.0
TARGET_SECONDS = 0.3  # timed work per config and implementation
MIN_REPS, MAX_REPS = 5, 200
INPUT_SETS = 3
FLUSH_BYTES = 256 * 2**20  # streamed before every timed call: larger than any GPU's L2
FLUSH_MODES = ("read", "write")
LEAD_S = 200e-6  # GPU busy-wait queued before every timed call: longer than any launch path's host time
SM_SCALE = 1.0 / math.sqrt(192.0)  # DeepSeek-V3's qk_head_dim
ROW_BYTES = 576 * 2
DEFAULT_OUT = "plans/results/phase1"


# ---------------------------------------------------------------- inputs

def bench_grid(quick: bool) -> list[Shape]:
    """The shapes benchmarked: the full grid, or the quick subset the speedup gate uses."""
    return grid(quick)


def make_pool(gb: float, device="cuda", seed: int = 0) -> torch.Tensor:
    """kv_cache [S, 576] bf16 of random normal rows, S = gb GiB / 1152 bytes (never zeros)."""
    slots = int(gb * 2**30) // ROW_BYTES
    gen = torch.Generator(device=device).manual_seed(seed)
    pool = torch.empty(slots, 576, dtype=torch.bfloat16, device=device)
    for start in range(0, slots, 1 << 20):  # chunks keep every kernel under 2^31 elements
        pool[start: start + (1 << 20)].normal_(generator=gen)
    return pool


def random_parents(T: int, rng: random.Random) -> list[int]:
    return [-1] + [rng.randrange(t) for t in range(1, T)]


def make_case(H: int, T: int, B: int, L: int, layout: str, pool: torch.Tensor, seed: int) -> dict:
    """Inputs of one call: B requests, each a random tree of T nodes over L prefix slots.

    ``layout`` "scattered": distinct random slots of the pool; "contiguous": one random range,
    request after request, prefix then tree. Returns the contract's arguments by name plus
    ``shape`` (a `roofline.Shape`), ``layout`` and ``seed``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    device = pool.device
    n = B * (L + T)
    if n > pool.shape[0]:
        raise ValueError(f"pool: {pool.shape[0]} slots cannot hold {n} distinct ones")
    rng = random.Random(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    if layout == "scattered":
        kv_indices = torch.randperm(pool.shape[0], generator=gen, device=device)[:n].to(torch.int32)
    else:
        start = rng.randrange(pool.shape[0] - n + 1)
        kv_indices = torch.arange(start, start + n, dtype=torch.int32, device=device)
    q = torch.randn(B * T, H, 576, dtype=torch.bfloat16, device=device, generator=gen)
    qo_indptr = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=device)
    kv_indptr = torch.arange(0, n + 1, L + T, dtype=torch.int32, device=device)
    tree_mask = pack_tree_masks([random_parents(T, rng) for _ in range(B)], device=device)
    return dict(q=q, kv_cache=pool, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                tree_mask=tree_mask, sm_scale=SM_SCALE, shape=Shape(H, T, B, L), layout=layout, seed=seed)


def case_args(case: dict) -> tuple:
    """The contract's positional arguments of a case."""
    return tuple(case[k] for k in ("q", "kv_cache", "qo_indptr", "kv_indptr", "kv_indices", "tree_mask", "sm_scale"))


def floor_seconds(case: dict, bw: float, flops_rate: float) -> float:
    """Roofline floor of a case: max(bytes / bw, FLOPs / matmul rate), DESIGN 3b's counts."""
    return _shape_floor(case["shape"], bw, flops_rate)


# ---------------------------------------------------------------- measuring

def _median(xs):
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def busy_wait(device="cuda", seconds: float = LEAD_S) -> Optional[Callable[[], object]]:
    """A callable that queues a GPU spin of at least ``seconds`` (``torch.cuda._sleep``), or None
    off CUDA. Cycles come from the rated SM clock (the highest: the spin never ends early), or,
    where torch does not report it, from timing a known spin once."""
    if torch.device(device).type != "cuda" or seconds <= 0:
        return None
    khz = int(getattr(torch.cuda.get_device_properties(device), "clock_rate", 0) or 0)
    if khz > 0:
        hz = khz * 1e3
    else:
        n = 1 << 21
        torch.cuda._sleep(n)  # busy while the timed spin is queued
        hz = n / _event_times(lambda: torch.cuda._sleep(n), 1)[0]
    cycles = math.ceil(seconds * hz)
    return lambda: torch.cuda._sleep(cycles)


def _event_times(fn: Callable[[], object], reps: int, before: Optional[Callable[[], object]] = None,
                 lead: Optional[Callable[[], object]] = None) -> list[float]:
    """Seconds per call from CUDA events; ``before`` (a flush) then ``lead`` (a `busy_wait`) run
    ahead of each call, outside the timed span."""
    events = []
    for _ in range(reps):
        if before is not None:
            before()
        if lead is not None:
            lead()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in events]


def measure_ceilings(device="cuda", copy_bytes: int = 2 * 2**30, matmul_n: int = 8192,
                     reps: int = 10) -> tuple[float, float]:
    """(copy bandwidth in bytes/s, bf16 matmul rate in FLOP/s), medians of CUDA-event timings.

    Bandwidth counts bytes read + written by a large device-to-device copy; the rate is an
    n^3 ``torch.matmul`` of random bf16 matrices; each timed call is queued behind a `busy_wait`.
    """
    lead = busy_wait(device)
    src = torch.ones(copy_bytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    _event_times(lambda: dst.copy_(src), 3)
    bw = 2 * copy_bytes / _median(_event_times(lambda: dst.copy_(src), reps, lead=lead))
    del src, dst
    a = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
    b = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device=device)
    _event_times(lambda: torch.matmul(a, b), 3)
    rate = 2 * matmul_n**3 / _median(_event_times(lambda: torch.matmul(a, b), reps, lead=lead))
    return bw, rate


def time_interleaved(calls: dict, reps: dict, flush: Optional[Callable[[], object]] = None,
                     lead: Optional[Callable[[], object]] = None) -> tuple[dict, dict]:
    """Seconds per call of each ``calls[name](i)`` (i = repetition index), interleaved round-robin.

    Round r runs every implementation with ``reps[name] > r``, so candidates and baselines share
    the same clocks and thermal state; ``flush`` (e.g. an L2 wipe) then ``lead`` (a `busy_wait`)
    run before every timed call, outside its events. Returns ``(gpu, host)``: per name, the
    CUDA-event seconds of each call and the host seconds ``calls[name](i)`` took to return.
    """
    pending = {name: [] for name in calls}
    host = {name: [] for name in calls}
    for r in range(max(reps.values(), default=0)):
        for name, call in calls.items():
            if r < reps[name]:
                if flush is not None:
                    flush()
                if lead is not None:
                    lead()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                call(r)
                host[name].append(time.perf_counter() - t0)
                end.record()
                pending[name].append((start, end))
        if r % 16 == 15:
            torch.cuda.synchronize()  # keep the queue of outstanding events short
    torch.cuda.synchronize()
    return {name: [s.elapsed_time(e) / 1e3 for s, e in evs] for name, evs in pending.items()}, host


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
                 seed: int, model: _CostModel, flush: Callable[[], object],
                 lead: Optional[Callable[[], object]] = None, lead_s: float = LEAD_S) -> list[dict]:
    """Rows for one shape and layout: every implementation checked, then timed interleaved.

    ``lead`` is the busy-wait queued before each timed call (``lead_s`` long); a row notes the
    calls whose host time exceeded it, since their GPU time may include host gaps."""
    cases = [make_case(shape.H, shape.T, shape.B, shape.L, layout, pool, seed + i) for i in range(INPUT_SETS)]
    floor = floor_seconds(cases[0], bw, rate)
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
            t1 = _event_times(lambda: fn(*case_args(cases[1]), out=outs[name][1]), 1, flush, lead)[0]
        except Exception as exc:  # noqa: BLE001 - one failing implementation must not end the run
            outs.pop(name, None)
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
    gpu, host = time_interleaved(calls, reps, flush, lead)
    for name, times in gpu.items():
        med = _median(times)
        rows[name].update(median_ms=med * 1e3, min_ms=min(times) * 1e3, max_ms=max(times) * 1e3,
                          reps=len(times), gbps=bytes_moved(shape) / med / 1e9,
                          tflops=flops(shape) / med / 1e12, fraction=floor / med,
                          host_us=_median(host[name]) * 1e6)
        if lead is not None:
            over = sum(h > lead_s for h in host[name])
            rows[name]["lead_overruns"] = over
            if over:
                rows[name]["note"] = (rows[name]["note"] + f" host time > {lead_s * 1e6:g} µs lead in {over}/"
                                      f"{len(times)} calls: those include host gaps").strip()
        if floor / med > 1.0:
            rows[name]["note"] = (rows[name]["note"] + " faster than the floor: measurement error?").strip()
    return list(rows.values())


# ---------------------------------------------------------------- machine facts

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
    repo = Path(__file__).resolve().parents[1]
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
        command="python -m kdtree.kernels.bench " + shlex.join(argv),
        copy_bytes_per_s=bw, bf16_flops_per_s=rate,
    )


# ---------------------------------------------------------------- driver

def load_impls(names: list[str]) -> dict:
    fns = {}
    for name in names:
        module, attr = IMPLEMENTATIONS[name].split(":")
        fns[name] = getattr(importlib.import_module(module), attr)
    return fns


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def prepare(fns: dict, pool: torch.Tensor, log=print) -> dict:
    """Call each implementation once on a small case (builds / compiles); drop those that fail."""
    case = make_case(8, 16, 1, min(4096, pool.shape[0] - 16), "scattered", pool, seed=1)
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


def l2_flush(scratch: torch.Tensor, mode: str = "read") -> Callable[[], object]:
    """A callable that wipes the L2 with ``scratch`` (larger than the L2).

    ``read`` streams through it (a max-reduction), so the L2 is left holding clean lines and the
    timed call pays for no one else's write-backs; ``write`` zeroes it, leaving the L2 full of
    dirty lines that the timed call's misses must first write back to HBM.
    """
    if mode == "write":
        return scratch.zero_
    if mode != "read":
        raise ValueError(f"flush mode must be one of {FLUSH_MODES}, got {mode!r}")
    words = scratch.view(torch.int32)
    return lambda: torch.amax(words)


def run(impl_names: list[str], shapes: list[Shape], layouts: list[str], pool_gb: float,
        budget_s: float, argv: list[str], log=print, device="cuda",
        flush_mode: str = "read") -> tuple[list[dict], dict]:
    """Measure the ceilings, then every (shape, layout); stop starting configs after budget_s."""
    started = time.time()
    fns = load_impls(impl_names)
    bw, rate = measure_ceilings(device)
    log(f"ceilings: copy {bw / 1e9:.0f} GB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    pool = make_pool(pool_gb, device)
    log(f"pool: {pool.shape[0]} slots ({pool.numel() * 2 / 2**30:.1f} GiB)")
    scratch = torch.zeros(FLUSH_BYTES, dtype=torch.uint8, device=device)
    flush = l2_flush(scratch, flush_mode)
    lead = busy_wait(device, LEAD_S)
    facts = machine_facts(bw, rate, argv, device)
    impl_errors = prepare(fns, pool, log)
    facts.update(pool_slots=pool.shape[0], layouts=list(layouts), impls=list(fns), impl_errors=impl_errors,
                 not_run=[], agree_rel_l2=AGREE_REL_L2, anchors=list(ANCHOR_ORDER), skip_seconds=SKIP_SECONDS,
                 flush_bytes=FLUSH_BYTES, flush_mode=flush_mode, lead_s=LEAD_S if lead is not None else 0.0)
    model, rows = _CostModel(), []
    todo = [(s, layout) for s in shapes for layout in layouts]
    for i, (shape, layout) in enumerate(todo, 1):
        if time.time() - started > budget_s:
            facts["not_run"].append(f"{shape.label} {layout}")
            continue
        seed = random.SystemRandom().randrange(2**31)
        got = bench_config(shape, layout, fns, pool, bw, rate, seed, model, flush, lead)
        rows += got
        log(_progress(i, len(todo), shape, layout, got, started))
    if facts["not_run"]:
        log(f"time budget of {budget_s:.0f} s spent: {len(facts['not_run'])} configs not run")
    facts["wall_s"] = time.time() - started
    return rows, facts


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m kdtree.kernels.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--impl", action="append", choices=list(IMPLEMENTATIONS),
                        help="implementation to time (repeatable; default: all)")
    parser.add_argument("--quick", action="store_true", help="the small subset (speedup gate, smoke tests)")
    parser.add_argument("--layout", choices=[*LAYOUTS, "both"], default="scattered")
    parser.add_argument("--pool-gb", type=float, default=8.0, help="size of the latent pool in GiB")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--filter", help="regex on the shape label, e.g. 'H64 T16' or 'L128k'")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="start no new config after this many seconds (the device lease is short)")
    parser.add_argument("--flush", choices=FLUSH_MODES, default="read",
                        help="how the L2 is wiped before each timed call (read: leaves it clean)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kdtree.kernels.bench: no CUDA GPU on this machine (torch.cuda.is_available() is False); "
              "the benchmark times GPU kernels, so nothing was measured.", file=sys.stderr)
        return 2
    shapes = bench_grid(args.quick)
    if args.filter:
        shapes = [s for s in shapes if re.search(args.filter, s.label)]
    if not shapes:
        print(f"kdtree.kernels.bench: --filter {args.filter!r} matches no shape", file=sys.stderr)
        return 2
    layouts = list(LAYOUTS) if args.layout == "both" else [args.layout]
    rows, facts = run(args.impl or list(IMPLEMENTATIONS), shapes, layouts, args.pool_gb, args.budget_s, argv,
                      flush_mode=args.flush)
    for path in write_report(rows, facts, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
