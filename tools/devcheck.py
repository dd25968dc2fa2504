"""One call on the GPU machine: build the kernel, check every variant against the oracle, time it.

    python -m kdtree.tools.devcheck [--out DIR] [--quick] [--variants base16,base32,ws,wgmma]
                                    [--splits 1,4,16] [--time-variants ws] [--configs 'H,T,B,L;...']
                                    [--compare-variants wgmma,ws,base32]

Prints the device, the build time, a correctness table (fresh random inputs, NaN-poisoned
outputs, fp64 oracle; every variant the device runs forced through its plan, `kdtree.bench.forced`) and a
timing table (the tools' queued timer, interleaved with the baselines that are importable)
against the roofline measured in the same run. Writes devcheck.json into --out (default $OUT or
.). This is the kernel engineer's inner loop (measured by `kdtree.bench.kernel_check`); the phase-1 gates and `kdtree.tools.bench` are the
formal record. ``--profile H,T,B,L`` only runs that config a few times (for ncu), with
``--variant`` / ``--splits`` forcing the launch. ``--compare-variants`` times the named variants
interleaved in one table (each checked against the first) and prints each one's time over the
first's, per config and in the median.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import click
import torch

from kdtree.bench.cases import call, make_case, make_pool, pool_slots_for
from kdtree.bench.forced import forced_kernel
from kdtree.bench.kernel_check import baselines, check_correctness, parse_configs, time_configs
from kdtree.bench.timing import make_timer, measure_ceilings
from kdtree.cli_support import common_options
from kdtree.kernels import cli
from kdtree.kernels.launch_plan import VARIANTS, runnable_variants


TIMING = [(8, 16, 1, 32768), (8, 16, 1, 131072), (64, 16, 8, 32768), (64, 64, 8, 131072),
          (16, 512, 1, 32768), (8, 4, 1, 32768), (16, 4, 8, 32768), (128, 16, 1, 32768),
          (128, 64, 8, 32768), (8, 1024, 1, 32768)]


def kernel(variant: Optional[str] = None, num_splits: Optional[int] = None):
    """The CUDA kernel as an op-contract callable, with its variant / split count forced."""
    return forced_kernel(variant, num_splits)


def parse_splits(text: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16] (whole numbers >= 1)."""
    return [cli.positive_int(s.strip()) for s in text.split(",") if s.strip()]


def parse_variants(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}: expected some of {sorted(VARIANTS)}")
    return names


def _print_row(row: dict) -> None:
    print(fmt_row(row, [k for k in row if isinstance(row[k], (dict, str)) and k != "layout"]), flush=True)


def fmt_row(row, names):
    s = f"H{row['H']:<4}T{row['T']:<5}B{row['B']:<2}L{row['L']:<7}{row['layout'][:4]} floor {row['floor_ms']:.3f}ms"
    for n in names:
        v = row.get(n)
        if isinstance(v, dict) and "ms" in v:
            s += f" | {n} {v['ms']:.3f}ms roof {v['roofline']:.2f} {v['tflops']:.0f}TF {v['gbs']:.0f}GB/s"
        elif v:
            s += f" | {n} {v}"
    return s


def compare_table(rows: list[dict], names: list[str]) -> str:
    """A compact table of `time_configs` rows: ms per variant, ratios to the first, roofline."""
    first = names[0]
    head = f"{'config':<24}{'floor':>8}" + "".join(f"{n:>10}" for n in names)
    head += "".join(f"{n + '/' + first:>14}" for n in names[1:]) + f"{'roof ' + first:>12}"
    lines = [head]
    ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
    for row in rows:
        cfg = f"H{row['H']} T{row['T']} B{row['B']} L{row['L'] // 1024}k"
        ms = {n: row[n]["ms"] for n in names if isinstance(row.get(n), dict) and "ms" in row[n]}
        line = f"{cfg:<24}{row['floor_ms']:>8.3f}" + "".join(f"{ms[n]:>10.3f}" if n in ms else f"{'-':>10}"
                                                           for n in names)
        for n in names[1:]:
            if n in ms and first in ms:
                ratios[n].append(ms[n] / ms[first])
                line += f"{ms[n] / ms[first]:>14.2f}"
            else:
                line += f"{'-':>14}"
        line += f"{row['floor_ms'] / ms[first]:>12.3f}" if first in ms else f"{'-':>12}"
        lines.append(line)
    rels = [row[n]["rel_vs_first"] for row in rows for n in names[1:]
            if isinstance(row.get(n), dict) and "rel_vs_first" in row[n]]
    if rels:
        lines.append(f"outputs vs {first}: rel-L2 max {max(rels):.2e}")
    for n, rs in ratios.items():
        if rs:
            lines.append(f"{n} time / {first} time: median {statistics.median(rs):.2f}, min {min(rs):.2f}, "
                         f"max {max(rs):.2f} over {len(rs)} configs")
    return "\n".join(lines)


@click.command(context_settings=cli.CONTEXT, help=__doc__.split("\n")[0])
@click.option("--out", default=lambda: os.environ.get("OUT", "."), show_default="$OUT or .")
@click.option("--quick", is_flag=True)
@click.option("--splits", type=cli.Parsed(parse_splits, "N,N,..."), default="", help="comma list of forced split counts to time")
@click.option("--impl", multiple=True, type=click.Choice(["cuda", "naive", "triton", "none"]),
              help="what to time besides nothing (repeatable; 'none': correctness only)")
@click.option("--pool-gb", type=cli.POSITIVE_FLOAT, default=8.0, show_default=True)
@click.option("--variants", type=cli.Parsed(parse_variants, "VARIANT,..."), default=None,
              help="kernel variants to check (default: every variant this device runs)")
@click.option("--time-variants", type=cli.Parsed(parse_variants, "VARIANT,..."), default="",
              help="also time these variants")
@click.option("--compare-variants", type=cli.Parsed(parse_variants, "VARIANT,..."), default="",
              help="time these variants interleaved in one table (ratios to the first)")
@click.option("--variant", type=click.Choice(sorted(VARIANTS)), help="force the variant of every timed cuda call")
@click.option("--time-only", is_flag=True, help="skip the correctness table")
@click.option("--profile", type=cli.Parsed(parse_configs, "H,T,B,L"),
              help="H,T,B,L: only run that config a few times (for ncu)")
@click.option("--configs", type=cli.Parsed(parse_configs, "H,T,B,L;..."),
              help="timing configs 'H,T,B,L;H,T,B,L' (default: built in)")
@common_options
def command(**options) -> int:
    args = SimpleNamespace(**options)
    args.impl = list(args.impl) or None
    cli.require_cuda("kdtree.tools.devcheck", "it builds, checks and times the kernel")
    forced_splits = args.splits[0] if args.profile and args.splits else None
    if args.profile:
        H, T, B, L = args.profile[0]
        case = make_case(H, [(T, L)] * B, "random", 1, pool_slots=max(4 * B * (L + T), 1 << 20))
        for _ in range(3):
            call(kernel(args.variant, forced_splits), case)
        torch.cuda.synchronize()
        return 0
    report = {"device": torch.cuda.get_device_name(), "cap": torch.cuda.get_device_capability(),
              "torch": torch.__version__, "python": platform.python_version(),
              "nvcc_flags": os.environ.get("KDTREE_NVCC_FLAGS", "")}
    try:
        report["git"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    print(report, flush=True)
    t0 = time.time()
    from kdtree.kernels.cuda_op import device_state  # noqa: PLC0415

    device_state(torch.cuda.current_device())
    report["build_s"] = time.time() - t0
    print(f"build {report['build_s']:.1f}s", flush=True)
    rows = []
    variants = args.variants if args.variants is not None else runnable_variants(torch.cuda.get_device_capability())
    for variant in ([] if args.time_only else variants):
        for r in check_correctness(kernel(variant), trials=1 if args.quick else 2):
            rows.append(dict(r, variant=variant))
    report["correctness"] = rows
    for r in rows:
        print(f"{'ok ' if r['ok'] else 'BAD'} {r['variant']:<7}{r['case']:<28} rel {r['rel_l2']:.2e} max {r['max_abs']:.2e} "
              f"lse {r['lse_abs']:.2e} unwritten {r['unwritten']}", flush=True)
    names = args.impl or ["cuda", "naive", "triton"]
    if names != ["none"] or args.compare_variants:
        bw, fl = measure_ceilings()
        report["ceilings"] = dict(copy_bytes_per_s=bw, bf16_flops_per_s=fl)
        print(f"copy {bw / 1e9:.0f} GB/s  matmul {fl / 1e12:.0f} TFLOP/s", flush=True)
        pool = make_pool(pool_slots_for(args.pool_gb))
        timer = make_timer()
        configs = args.configs or (TIMING[:4] if args.quick else TIMING)
        if args.compare_variants:
            print(f"-- variants interleaved: {', '.join(args.compare_variants)}", flush=True)
            rows_cmp = time_configs(configs, pool, bw, fl, {v: kernel(v) for v in args.compare_variants}, timer,
                                    on_row=_print_row)
            report["variant_compare"] = dict(variants=args.compare_variants, rows=rows_cmp)
            print(compare_table(rows_cmp, args.compare_variants), flush=True)
        found = baselines() if names != ["none"] else {}
        fns = {n: kernel(args.variant) if n == "cuda" else found[n] for n in names if n == "cuda" or n in found}
        report["timing"] = time_configs(configs, pool, bw, fl, fns, timer, on_row=_print_row) if fns else []
        report["variant_sweep"] = []
        for v in args.time_variants:
            print(f"-- variant={v}")
            report["variant_sweep"].append(dict(variant=v, rows=time_configs(configs, pool, bw, fl,
                                                                              {"cuda": kernel(v)}, timer,
                                                                              on_row=_print_row)))
        report["split_sweep"] = []
        for s in args.splits:
            print(f"-- splits={s}")
            report["split_sweep"].append(dict(splits=s, rows=time_configs(
                configs, pool, bw, fl, {"cuda": kernel(args.variant, s)}, timer, on_row=_print_row)))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    tmp = Path(args.out) / "devcheck.json.tmp"
    tmp.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp, Path(args.out) / "devcheck.json")
    return 1 if any(not r["ok"] for r in rows) else 0


main = cli.program(command, "python -m kdtree.tools.devcheck")

if __name__ == "__main__":
    sys.exit(main())
