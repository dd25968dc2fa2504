"""One call on the GPU machine: build the kernel, check it against the oracle, time it.

    python -m kdtree.kernels.devcheck [--out DIR] [--quick] [--splits 1,4,16]

Prints the device, the build time, a correctness table (fresh random inputs, NaN-poisoned
outputs, fp64 oracle) and a timing table (CUDA events, median of many calls, interleaved with
the baselines that are importable) against the roofline measured in the same run. Writes
devcheck.json into --out (default $OUT or .). This is the kernel engineer's inner loop; the
phase-1 gates and `kdtree.kernels.bench` are the formal record.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from kdtree.kernels.cases import call, make_case, oracle

ROW_BYTES = 576 * 2


CORRECTNESS = [
    ("random H8 T16 L1000", 8, [(16, 1000)], "random"),
    ("T=1 L=0 H16", 16, [(1, 0)], "random"),
    ("chain H1 T5 L37", 1, [(5, 37)], "chain"),
    ("mixed H128", 128, [(7, 300), (1, 5), (40, 0)], "star"),
    ("T=1024 H8 L200", 8, [(1024, 200)], "random"),
    ("H64 T64 B2 L4096", 64, [(64, 4096), (64, 4000)], "random"),
    ("H16 T33 L16k splits", 16, [(33, 16384)], "random"),
    ("H8 T4 L32k many splits", 8, [(4, 32768)], "random"),
    ("odd H3", 3, [(17, 77), (3, 1), (2, 0)], "random"),
    ("H128 T256 L2000", 128, [(256, 2000)], "random"),
    ("star H16 T300 L50", 16, [(300, 50)], "star"),
    ("B8 mixed H8", 8, [(t, l) for t, l in zip([1, 4, 9, 16, 33, 64, 2, 100], [0, 5, 100, 999, 3000, 31, 7, 12])], "random"),
]


def check_correctness(fn, trials: int = 2):
    rows = []
    for name, H, reqs, kind in CORRECTNESS:
        for trial in range(trials):
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


def cuda_time(fn, reps: int) -> list[float]:
    """Seconds of GPU time per call: each call is queued behind a GPU busy-wait (the bench's
    `busy_wait`), so the host's enqueue cost stays out of the events, as in the benchmark."""
    from kdtree.kernels.bench import _event_times, busy_wait  # noqa: PLC0415

    return _event_times(fn, reps, lead=busy_wait())


def measure_ceilings():
    x = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    bw = 2 * x.numel() * 2 / statistics.median(cuda_time(lambda: y.copy_(x), 10))
    del x, y
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    fl = 2 * 8192**3 / statistics.median(cuda_time(lambda: a @ b, 10))
    return bw, fl


def floor_s(H, T, B, L, bw, fl):
    bytes_ = B * ((L + T) * ROW_BYTES + T * H * (1152 + 1024))
    flops = B * 2 * H * T * (L + T) * (576 + 512)
    return max(bytes_ / bw, flops / fl), bytes_, flops


TIMING = [(8, 16, 1, 32768), (8, 16, 1, 131072), (64, 16, 8, 32768), (64, 64, 8, 131072),
          (16, 512, 1, 32768), (8, 4, 1, 32768), (16, 4, 8, 32768), (128, 16, 1, 32768),
          (128, 64, 8, 32768), (8, 1024, 1, 32768)]


def restore_env(name: str, value: str | None) -> None:
    """Put an environment variable back as the caller had it (unset if it was)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def parse_configs(text: str) -> list[tuple[int, int, int, int]]:
    """'H,T,B,L;H,T,B,L' -> [(H, T, B, L), ...], with a clear error for anything else."""
    configs = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        fields = part.split(",")
        if len(fields) != 4 or not all(f.strip().isdigit() for f in fields):
            raise SystemExit(f"--configs: {part!r} is not H,T,B,L (four integers)")
        configs.append(tuple(int(f) for f in fields))
    return configs


def impls():
    from kdtree.kernels import tree_verify_mla

    found = {"cuda": tree_verify_mla}
    try:
        from kdtree.kernels.naive import tree_verify_mla_naive

        found["naive"] = tree_verify_mla_naive
    except Exception as exc:  # noqa: BLE001
        print("naive unavailable:", exc)
    try:
        from kdtree.kernels.triton_baseline import tree_verify_mla_triton

        found["triton"] = tree_verify_mla_triton
    except Exception as exc:  # noqa: BLE001
        print("triton baseline unavailable:", exc)
    return found


def time_configs(configs, pool, bw, fl, names, budget_s=2.0, layouts=("scattered",)):
    table = []
    fns = impls()
    for H, T, B, L in configs:
        for layout in layouts:
            case = make_case(H, [(T, L)] * B, "random", int.from_bytes(os.urandom(4), "little"), pool=pool,
                             contiguous=layout == "contiguous")
            floor, nbytes, nflops = floor_s(H, T, B, L, bw, fl)
            ref = call(fns["cuda"], case)
            row = dict(H=H, T=T, B=B, L=L, layout=layout, floor_ms=floor * 1e3)
            for name in names:
                if name not in fns:
                    continue
                fn = fns[name]
                out = call(fn, case)  # warm-up: JIT compile / autotune stay out of the estimate
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = call(fn, case)
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
                if first > budget_s:
                    row[name] = f"skipped (one call {first:.1f}s > {budget_s}s)"
                    continue
                rel = float((out.float() - ref.float()).norm() / ref.float().norm())
                reps = max(5, min(50, int(0.3 / max(first, 1e-5))))
                ts = cuda_time(lambda: call(fn, case), reps)
                med = statistics.median(ts)
                row[name] = dict(ms=med * 1e3, min_ms=min(ts) * 1e3, max_ms=max(ts) * 1e3, rel_vs_cuda=rel,
                                 roofline=floor / med, gbs=nbytes / med / 1e9, tflops=nflops / med / 1e12)
            table.append(row)
            print(fmt_row(row, names), flush=True)
    return table


def fmt_row(row, names):
    s = f"H{row['H']:<4}T{row['T']:<5}B{row['B']:<2}L{row['L']:<7}{row['layout'][:4]} floor {row['floor_ms']:.3f}ms"
    for n in names:
        v = row.get(n)
        if isinstance(v, dict):
            s += f" | {n} {v['ms']:.3f}ms roof {v['roofline']:.2f} {v['tflops']:.0f}TF {v['gbs']:.0f}GB/s"
        elif v:
            s += f" | {n} {v}"
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--splits", default="", help="comma list of forced split counts to sweep")
    ap.add_argument("--impl", action="append", default=None)
    ap.add_argument("--pool-gb", type=float, default=8.0)
    ap.add_argument("--variants", default="base16,base32,ws", help="kernel variants to check")
    ap.add_argument("--time-variants", default="", help="also time these variants (comma list)")
    ap.add_argument("--time-only", action="store_true", help="skip the correctness table")
    ap.add_argument("--profile", default="", help="H,T,B,L: only run that config a few times (for ncu)")
    ap.add_argument("--configs", default="", help="timing configs 'H,T,B,L;H,T,B,L' (default: the built-in list)")
    args = ap.parse_args()
    if args.profile:
        H, T, B, L = (int(x) for x in args.profile.split(","))
        from kdtree.kernels import tree_verify_mla

        case = make_case(H, [(T, L)] * B, "random", 1, pool_slots=max(4 * B * (L + T), 1 << 20))
        for _ in range(3):
            call(tree_verify_mla, case)
        torch.cuda.synchronize()
        return
    report = {"device": torch.cuda.get_device_name(), "cap": torch.cuda.get_device_capability(),
              "torch": torch.__version__, "python": platform.python_version()}
    try:
        report["git"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    print(report, flush=True)
    t0 = time.time()
    from kdtree.kernels.cuda_op import _extension

    _extension(torch.cuda.current_device())
    report["build_s"] = time.time() - t0
    print(f"build {report['build_s']:.1f}s", flush=True)
    from kdtree.kernels import tree_verify_mla

    rows = []
    forced = os.environ.get("KDTREE_VARIANT")  # the caller's choice holds for the timing below
    for variant in ([] if args.time_only else args.variants.split(",")):
        os.environ["KDTREE_VARIANT"] = variant
        for r in check_correctness(tree_verify_mla, trials=1 if args.quick else 2):
            rows.append(dict(r, variant=variant))
    restore_env("KDTREE_VARIANT", forced)
    report["correctness"] = rows
    for r in rows:
        print(f"{'ok ' if r['ok'] else 'BAD'} {r['variant']:<7}{r['case']:<28} rel {r['rel_l2']:.2e} max {r['max_abs']:.2e} "
              f"lse {r['lse_abs']:.2e} unwritten {r['unwritten']}", flush=True)
    if args.impl == ["none"]:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "devcheck.json").write_text(json.dumps(report, indent=1, default=str))
        return
    bw, fl = measure_ceilings()
    report["ceilings"] = dict(copy_bytes_per_s=bw, bf16_flops_per_s=fl)
    print(f"copy {bw / 1e9:.0f} GB/s  matmul {fl / 1e12:.0f} TFLOP/s", flush=True)
    print("nvcc flags:", os.environ.get("KDTREE_NVCC_FLAGS", ""), flush=True)
    slots = int(args.pool_gb * 1e9 / ROW_BYTES)
    pool = torch.empty(slots, 576, dtype=torch.bfloat16, device="cuda").normal_(0, 0.5)
    names = args.impl or ["cuda", "naive", "triton"]
    configs = parse_configs(args.configs) if args.configs else TIMING[:4] if args.quick else TIMING
    report["timing"] = time_configs(configs, pool, bw, fl, names)
    if args.time_variants:
        vs = []
        for v in args.time_variants.split(","):
            os.environ["KDTREE_VARIANT"] = v
            print(f"-- variant={v}")
            vs.append(dict(variant=v, rows=time_configs(configs, pool, bw, fl, ["cuda"])))
        restore_env("KDTREE_VARIANT", forced)
        report["variant_sweep"] = vs
    if args.splits:
        forced_splits = os.environ.get("KDTREE_SPLITS")
        sweep = []
        for s in args.splits.split(","):
            os.environ["KDTREE_SPLITS"] = s
            print(f"-- splits={s}")
            sweep.append(dict(splits=s, rows=time_configs(configs, pool, bw, fl, ["cuda"])))
        restore_env("KDTREE_SPLITS", forced_splits)
        report["split_sweep"] = sweep
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "devcheck.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
