"""Ours (tree mask) against FlashInfer 0.7.2's FA2 and FA3 MLA (causal chain), one process, GPU time.

Per shape: ours on the chain must agree with each peer (rel-L2 <= 1e-2) before any time counts;
then ours on a random tree, ours on the chain, FA2 and FA3 on the chain are timed interleaved,
each call queued behind an L2 wipe and a busy-wait (the benchmark's timer). Writes a JSON and a
markdown table to --out. Run on the GPU machine (scripts/device-peers.sh sets up FlashInfer).

    python3 -m kdtree.tools.peers [--out DIR] [--shapes issue|grid|quick] [--backends fa2,fa3] [--variant wgmma]
                                  [--flashmla]

``--flashmla`` also times FlashMLA's dense decode (`kdtree.bench.flashmla_peer`: the sgl-flash-mla
1.0.0 wheel, causal chain, 64-token pages), held to ours on the chain like the FlashInfer peers.

``--variant`` forces our kernel's variant through its plan (`kdtree.bench.forced`), e.g. ``ws``
on a 9.0 device, where the default dispatch takes the wgmma variant from 64 rows per request.
The measurement is `kdtree.bench.peer_grid`; ``--shapes issue`` is the field's table of shapes
(docs/design.md section 3b).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import click
import torch

from kdtree.bench import flashinfer_peer, flashmla_peer
from kdtree.bench.cases import make_pool, pool_slots_for
from kdtree.bench.forced import forced_kernel
from kdtree.bench.peer_grid import measure
from kdtree.bench.roofline import Shape, grid
from kdtree.bench.timing import make_timer, measure_ceilings
from kdtree.cli_support import common_options
from kdtree.kernels import cli, tree_verify_mla


FIELD_SHAPES = [Shape(16, 16, 1, 32768), Shape(128, 8, 1, 32768), Shape(64, 64, 8, 32768),
                Shape(128, 64, 1, 131072), Shape(8, 1024, 1, 32768), Shape(8, 4, 1, 131072)]


def shapes_for(name: str) -> list[Shape]:
    if name == "issue":
        return FIELD_SHAPES
    if name == "quick":
        return grid(quick=True)
    return [s for s in grid() if s.L >= 32768]


def markdown(rows: list[dict], facts: dict) -> str:
    head = ("| shape | floor ms | ours tree ms | ours chain ms | FA2 chain ms | FA3 chain ms "
            "| FA2/ours | FA3/ours | ours roofline | FA2 roofline |")
    lines = [f"Machine: {facts['device']}, torch {facts['torch']}, flashinfer {facts['flashinfer']}, "
             f"copy {facts['bw']/1e12:.3f} TB/s, bf16 mm {facts['rate']/1e12:.0f} TFLOP/s; {facts['argv']}",
             "", head, "|" + "---|" * 10]
    f = lambda r, k, fmt="{:.3f}": fmt.format(r[k]) if k in r else r.get(k.replace("_ms", "_error"), "-")[:40]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['floor_ms']:.3f} | {f(r,'ours_tree_ms')} | {f(r,'ours_chain_ms')} "
                     f"| {f(r,'fa2_ms')} | {f(r,'fa3_ms')} | {f(r,'fa2_over_ours_tree','{:.2f}')} "
                     f"| {f(r,'fa3_over_ours_tree','{:.2f}')} | {f(r,'ours_tree_roofline','{:.3f}')} "
                     f"| {f(r,'fa2_roofline','{:.3f}')} |")
    ratios = [r["fa2_over_ours_tree"] for r in rows if "fa2_over_ours_tree" in r]
    if ratios:
        lines += ["", f"FA2 time / ours (tree): median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, "
                      f"max {max(ratios):.3f} over {len(ratios)} shapes"]
    ratios3 = [r["fa3_over_ours_tree"] for r in rows if "fa3_over_ours_tree" in r]
    if ratios3:
        lines.append(f"FA3 time / ours (tree): median {statistics.median(ratios3):.3f}, min {min(ratios3):.3f}")
    mla = [r["flashmla_over_ours_tree"] for r in rows if "flashmla_over_ours_tree" in r]
    if mla:
        lines.append(f"FlashMLA dense decode time / ours (tree): median {statistics.median(mla):.3f}, "
                     f"min {min(mla):.3f} (flash_mla {facts.get('flash_mla')})")
    roof = [r["ours_tree_roofline"] for r in rows if "ours_tree_roofline" in r]
    lines.append(f"ours roofline fraction: median {statistics.median(roof):.3f}, min {min(roof):.3f}")
    return "\n".join(lines) + "\n"


@click.command(context_settings=cli.CONTEXT, help=__doc__.splitlines()[0])
@click.option("--out", default=lambda: os.environ.get("OUT", "."), show_default="$OUT or .",
              help="output folder (JSON and markdown table)")
@click.option("--shapes", type=click.Choice(("issue", "grid", "quick")), default="issue", show_default=True)
@click.option("--reps", type=cli.POSITIVE_INT, default=20, show_default=True)
@click.option("--pool-gb", type=cli.POSITIVE_FLOAT, default=8.0, show_default=True)
@click.option("--budget-s", type=cli.POSITIVE_FLOAT, default=300.0, show_default=True)
@click.option("--backends", default=",".join(flashinfer_peer.BACKENDS), show_default=True,
              help="comma-separated FlashInfer backends to time (fa2,fa3)")
@click.option("--tag", default="", help="suffix of the output files (e.g. sm120smem)")
@click.option("--variant", default=None, help="force our kernel's variant (launch_plan.VARIANTS, e.g. wgmma)")
@click.option("--flashmla", is_flag=True, help="also time FlashMLA's dense decode (sgl-flash-mla 1.0.0 on sys.path)")
@common_options
def command(**options) -> int:
    args = SimpleNamespace(**options)
    argv = cli.invoked_argv()
    cli.require_cuda("kdtree.tools.peers", "it times our kernel against FlashInfer's on the GPU")
    ours = tree_verify_mla
    if args.variant:
        ours = forced_kernel(args.variant)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    peers = {}
    for name in [b for b in args.backends.split(",") if b]:
        reason = flashinfer_peer.unavailable_reason(name)
        if reason:
            print(f"{name}: unavailable: {reason}", flush=True)
            continue
        t0 = time.time()
        peers[name] = flashinfer_peer.FlashInferMLA(name)
        print(f"{name}: loaded in {time.time() - t0:.1f}s", flush=True)
    if args.flashmla:
        reason = flashmla_peer.unavailable_reason()
        if reason:
            print(f"flashmla: not loaded: {reason}", flush=True)
        else:
            peers["flashmla"] = flashmla_peer.FlashMLADecode()
            print(f"flashmla: loaded flash_mla {flashmla_peer.version()}", flush=True)
    bw, rate = measure_ceilings()
    pool = make_pool(pool_slots_for(args.pool_gb))
    timer = make_timer()
    facts = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                 flashinfer=(flashinfer_peer.version() or "absent") + (f" ({args.tag})" if args.tag else ""), bw=bw, rate=rate, python=platform.python_version(),
                 variant=args.variant or "dispatch", flash_mla=flashmla_peer.version() if args.flashmla else None,
                 argv=" ".join(["python -m kdtree.tools.peers"] + argv))
    rows, started = [], time.time()
    for i, shape in enumerate(shapes_for(args.shapes)):
        if time.time() - started > args.budget_s:
            print(f"budget of {args.budget_s}s spent: stopping before {shape.label}", flush=True)
            break
        t0 = time.time()
        row = measure(shape, pool, peers, bw, rate, timer, args.reps, seed=1000 + i, ours=ours)
        rows.append(row)
        print(f"{shape.label}: " + ", ".join(f"{k}={row[k]:.3f}" for k in row if k.endswith("_ms"))
              + "".join(f" [{k}: {row[k]}]" for k in row if k.endswith("_error"))
              + f" ({time.time() - t0:.1f}s)", flush=True)
    stem = f"peers_{args.shapes}" + (f"_{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(dict(facts=facts, rows=rows), indent=1))
    (out / f"{stem}.md").write_text(markdown(rows, facts))
    print(markdown(rows, facts))
    return 0


main = cli.program(command, "python -m kdtree.tools.peers")

if __name__ == "__main__":
    sys.exit(main())
