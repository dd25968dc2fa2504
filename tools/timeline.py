"""The kernel's timeline: record one launch per config with the timeline build, or draw a saved dump.

    python -m kdtree.tools.timeline run [--configs "64,64,1,32768;16,512,1,32768"] [--variant wgmma]
                                        [--splits N] --out DIR            # GPU: dumps, pictures, summary
    python -m kdtree.tools.timeline render DUMP.npz [--out PIC.png|.svg] [--cta N] [--tiles 2:8]
    python -m kdtree.tools.timeline summary DUMP.npz [--cta N]            # the figures, as JSON lines

``run`` builds (or finds) the ``-DKD_TIMELINE=1`` extension (the flag is added to
$KDTREE_NVCC_FLAGS, which is in the JIT's cache key), launches each config once after a warm-up,
and writes ``DIR/timeline-H-T-B-L.npz`` (`kdtree.bench.timeline.save`), its picture (where
matplotlib is installed) and ``DIR/summary.jsonl`` (one line per config and SM's first CTA).
``render`` draws one CTA's lanes (what each lane was doing between its stamps) over a range of
tiles, with the intervals in which each lane had MMAs in flight and their union (the tensor pipe
busy, an upper bound, or idle) below; it needs no GPU.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Optional

import click

from kdtree.bench import timeline as tlm
from kdtree.cli_support import UsageError, common_options
from kdtree.fsutil import atomic_write_bytes
from kdtree.kernels import cli

DEFAULT_CONFIGS = "64,64,1,32768;16,512,1,32768"
TIMELINE_FLAG = "-DKD_TIMELINE=1"

# One colour per lane state (kdtree.bench.timeline.STATE_OF's values).
COLORS = {
    "producer work": "#c7c7c7", "wait free stage": "#ff9896", "issue copies": "#8c564b",
    "wait tile": "#d62728", "issue S": "#aec7e8", "wait S": "#1f77b4", "softmax": "#ff7f0e",
    "store P": "#bcbd22", "issue PV": "#98df8a", "wait PV": "#2ca02c", "free stage": "#9edae5",
    "wait barrier": "#9467bd", "other": "#e5e5e5",
}


def parse_tiles(text: str) -> tuple[int, int]:
    """'2:8' -> (2, 8): tiles 2 .. 7 of the CTA."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"expected FIRST:END tiles, e.g. 2:8, got {text!r}") from None
    if not 0 <= a < b:
        raise ValueError(f"expected 0 <= FIRST < END, got {text!r}")
    return a, b


def pick_cta(tl: tlm.Timeline, cta: Optional[int]) -> int:
    """`cta` if it was recorded, else the first CTA of the lowest SM; a UsageError naming the
    recorded ones otherwise."""
    recorded = tl.recorded()
    if not recorded:
        raise UsageError("the dump holds no recorded CTA (was the launch a timeline build? its grid empty?)")
    if cta is None:
        return next(iter(tlm.one_cta_per_sm(tl).values()))
    if cta not in recorded:
        raise UsageError(f"--cta {cta}: not recorded; recorded CTAs are {recorded[0]} .. {recorded[-1]} "
                         f"({len(recorded)} of them)")
    return cta


def render(tl: tlm.Timeline, out: Path, cta: int, tiles: tuple[int, int] = (2, 8)) -> Path:
    """Draw CTA `cta`'s lanes over tiles [tiles[0], tiles[1]) to `out` (.png or .svg), atomically."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    if out.suffix not in (".png", ".svg"):
        raise UsageError(f"{out}: the picture is .png or .svg")
    spans = tlm.lane_spans(tl, cta)
    mma = tlm.mma_spans(tl, cta)
    last = tl.field(cta, "tiles")
    lo, hi = tiles[0], min(tiles[1], last, tl.tile0 + tl.tiles)
    if lo >= hi:
        raise UsageError(f"--tiles {tiles[0]}:{tiles[1]}: the CTA has tiles {tl.tile0} .. "
                         f"{min(last, tl.tile0 + tl.tiles) - 1} recorded")
    in_range = [s for s in spans if lo <= s.tile < hi]
    if not in_range:
        raise UsageError(f"CTA {cta}: no stamps in tiles {lo} .. {hi - 1}")
    x0 = min(s.start for s in in_range)
    x1 = max(s.end for s in in_range)
    names = tl.lane_names()
    lanes = len(names)
    fig, ax = plt.subplots(figsize=(16, 1.2 + 0.9 * (lanes + 1)))
    rows = {}
    y = 0.0
    for lane in reversed(range(lanes)):
        rows[lane] = y
        y += 1.0
    pipe_y = -1.0
    for s in spans:
        if s.end < x0 or s.start > x1:
            continue
        ax.broken_barh([(s.start, s.end - s.start)], (rows[s.lane] + 0.3, 0.6), facecolors=COLORS.get(s.state, "#e5e5e5"),
                       edgecolor="none")
    for s in mma:
        if s.end < x0 or s.start > x1:
            continue
        ax.broken_barh([(s.start, s.end - s.start)], (rows[s.lane] + 0.05, 0.18), facecolors="#393b79")
    busy = tlm.merge([(s.start, s.end) for s in mma])
    ax.broken_barh([(x0, x1 - x0)], (pipe_y + 0.2, 0.6), facecolors="#fde0dd", edgecolor="none")
    ax.broken_barh([(a, b - a) for a, b in busy if b > x0 and a < x1], (pipe_y + 0.2, 0.6), facecolors="#393b79")
    for tile in range(lo, hi):
        marks = [t for lane in range(lanes) if (t := tl.clock(cta, lane, tile, "tile_ready")) is not None]
        if marks:
            ax.axvline(min(marks), color="#555555", lw=0.6, ls=":")
            ax.text(min(marks), y + 0.05, f"tile {tile}", fontsize=7, va="bottom")
    ax.set_yticks([rows[lane] + 0.6 for lane in range(lanes)] + [pipe_y + 0.5])
    ax.set_yticklabels(list(names) + ["MMAs in flight (any lane)"])
    ax.set_ylim(pipe_y, y + 0.5)
    ax.set_xlim(x0, x1)
    ax.set_xlabel("SM clocks from the CTA's start")
    summ = tlm.summarize(tl, cta)
    meta = tl.meta
    cfg = meta.get("config")
    bits = [f"{tl.variant}", f"config {cfg}" if cfg else "", str(meta.get("device", "")),
            f"CTA {cta} on SM {tl.field(cta, 'smid')}", str(meta.get("revision", ""))]
    ax.set_title(" | ".join(b for b in bits if b), fontsize=9)
    figs = [f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in summ.items()
            if k in ("clocks_per_tile", "pipe_fraction", "softmax_clocks", "mma_in_flight_fraction",
                     "idle_gaps_per_tile", "wait_tile_clocks", "wait_barrier_clocks") and v is not None]
    fig.text(0.01, 0.01, "; ".join(figs), fontsize=7)
    used = sorted({s.state for s in spans if s.end >= x0 and s.start <= x1})
    handles = [Patch(color=COLORS.get(k, "#e5e5e5"), label=k) for k in used] + [Patch(color="#393b79", label="MMA in flight")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=130, format=out.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())
    return out


@click.group(context_settings=cli.CONTEXT, help=__doc__.split("\n\n")[0])
def command() -> None:
    pass


@command.command("render", help="Draw one CTA of a saved dump (.npz or .json) as a PNG or SVG (no GPU needed).")
@click.argument("dump", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="picture (.png/.svg); default DUMP.png")
@click.option("--cta", type=int, help="CTA index (default: the first CTA of the lowest SM)")
@click.option("--tiles", type=cli.Parsed(parse_tiles, "FIRST:END"), default="2:8", show_default=True)
@common_options
def render_command(dump: Path, out: Optional[Path], cta: Optional[int], tiles: tuple[int, int]) -> int:
    tl = _load(dump)
    out = out or dump.with_suffix(".png")
    click.echo(render(tl, out, pick_cta(tl, cta), tiles))
    return 0


@command.command("summary", help="The figures of each SM's first CTA (or --cta) of a saved dump, one JSON line each, then their medians.")
@click.argument("dump", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--cta", type=int, help="only this CTA")
@common_options
def summary_command(dump: Path, cta: Optional[int]) -> int:
    tl = _load(dump)
    ctas = [pick_cta(tl, cta)] if cta is not None else list(tlm.one_cta_per_sm(tl).values())
    rows = [tlm.summarize(tl, c) for c in ctas]
    for r in rows:
        click.echo(json.dumps(r))
    if len(rows) > 1:
        click.echo(json.dumps({"median_over_sms": len(rows), **_medians(rows)}))
    return 0


@command.command("run", help="Record one launch per config with the timeline build (GPU): dumps, pictures, summary.")
@click.option("--configs", default=DEFAULT_CONFIGS, show_default=True,
              type=cli.Parsed(lambda s: _parse_configs(s), "H,T,B,L;..."))
@click.option("--variant", help="force the kernel variant (a kdtree.kernels.launch_plan.VARIANTS name)")
@click.option("--splits", type=cli.POSITIVE_INT, help="force the split count")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--tiles", type=cli.Parsed(parse_tiles, "FIRST:END"), default="2:8", show_default=True)
@click.option("--revision", default="", help="a name for the build, recorded in the dump (e.g. a git revision)")
@click.option("--seed", type=int, default=0, show_default=True)
@common_options
def run_command(configs, variant, splits, out_dir: Path, tiles, revision: str, seed: int) -> int:
    cli.require_cuda("kdtree.tools.timeline run", "it records a kernel launch")
    flags = os.environ.get("KDTREE_NVCC_FLAGS", "")
    if TIMELINE_FLAG not in flags.split():
        os.environ["KDTREE_NVCC_FLAGS"] = f"{flags} {TIMELINE_FLAG}".strip()
    from kdtree.bench.cases import make_case  # noqa: PLC0415
    from kdtree.kernels.launch_plan import VARIANTS  # noqa: PLC0415

    if variant is not None and variant not in VARIANTS:
        raise UsageError(f"--variant {variant}: expected one of {', '.join(VARIANTS)}")
    try:
        import matplotlib  # noqa: F401, PLC0415
        draw = True
    except ImportError:
        draw = False
        click.echo("matplotlib is not installed here: dumps only (render them with `render` elsewhere)", err=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for H, T, B, L in configs:
        case = make_case(H, [(T, L)] * B, "random", seed, pool_slots=4 * B * (L + T))
        tl = tlm.collect(case, variant=variant, num_splits=splits,
                         meta={"config": f"{H},{T},{B},{L}", "revision": revision})
        dump = tlm.save(tl, out_dir / f"timeline-{H}-{T}-{B}-{L}.npz")
        per_sm = tlm.one_cta_per_sm(tl)
        for c in per_sm.values():
            lines.append(json.dumps({"config": f"{H},{T},{B},{L}", "variant": tl.variant, "revision": revision,
                                     **tlm.summarize(tl, c)}))
        first = next(iter(per_sm.values()), None)
        if draw and first is not None:
            render(tl, dump.with_suffix(".png"), first, tiles)
        med = _medians([tlm.summarize(tl, c) for c in per_sm.values()])
        click.echo(f"H{H} T{T} B{B} L{L} {tl.variant} splits={tl.meta.get('num_splits')}: {len(per_sm)} SMs recorded; "
                   "medians over their first CTAs: " + ", ".join(f"{k}={v:.3g}" for k, v in med.items()))
    (out_dir / "summary.jsonl").write_text("\n".join(lines) + "\n")
    return 0


def _medians(rows: list[dict]) -> dict:
    """Each numeric figure's median over `rows` (summaries), CTA and SM ids left out."""
    if not rows:
        return {}
    return {k: float(statistics.median(vs)) for k in rows[0] if k not in ("cta", "smid")
            if (vs := [r[k] for r in rows if isinstance(r.get(k), (int, float))])}


def _parse_configs(text: str) -> list[tuple[int, int, int, int]]:
    from kdtree.tools.devcheck import parse_configs  # noqa: PLC0415

    return parse_configs(text)


def _load(dump: Path) -> tlm.Timeline:
    try:
        return tlm.load(dump)
    except tlm.TimelineError as exc:
        raise UsageError(str(exc)) from None


main = cli.program(command, "python -m kdtree.tools.timeline")

if __name__ == "__main__":
    sys.exit(main())
