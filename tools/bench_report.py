"""The benchmark's report: bench.json, bench.md and two PNG grids of subplots, from rows + facts.

A row is one (shape, layout, implementation) of `kdtree.tools.bench`; facts describe the run
(machine, versions, ceilings, the agreement rule). Needs no GPU, so it is tested on the CPU.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Optional

from kdtree.bench.roofline import Shape


def _in_order(rows: list[dict], key: str) -> list:
    return list(dict.fromkeys(r[key] for r in rows))


def _md(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _cell(row: Optional[dict]) -> tuple[str, str]:
    if row is None:
        return "", ""
    status = row["status"]
    if status == "error":
        return f"error: {_md(row['note'])}", ""
    if status == "skipped":
        return f"skipped ({_md(row['note'])})", ""
    if "median_ms" not in row:
        return status, ""
    text = f"{row['median_ms']:.3g} ({row['min_ms']:.3g}–{row['max_ms']:.3g})"
    if status == "disagree":
        return f"✗ {text} disagrees: {_md(row['note'])}", ""
    return text, f"{100 * row['fraction']:.1f} %"


def _timing(facts: dict) -> str:
    """How each call was timed, from the run's flush and lead (older runs had neither recorded)."""
    flush, lead = facts.get("flush_bytes"), facts.get("lead_s")
    if flush is None and lead is None:
        return "the L2 flushed before each (host launch time included)"
    how = {"read": "read, leaving it clean", "write": "written, leaving it dirty"}.get(
        facts.get("flush_mode", "write"), "streamed")
    wipe = f"the L2 wiped ({flush / 2**20:g} MiB {how}) before each" if flush else "no L2 flush"
    if not lead:
        return wipe + " (no busy-wait lead: host launch time included)"
    return (f"{wipe} and a {lead * 1e6:g} µs GPU busy-wait queued ahead of it, so the host enqueues the call "
            "while the GPU is busy and the events measure GPU time, not launch overhead; host µs (every-row "
            "table) is the median time the Python call took to return, i.e. its enqueue cost (more where an "
            "implementation synchronises, e.g. naive's .tolist())")


def _long_table(rows: list[dict]) -> list[str]:
    lines = ["| shape | layout | impl | status | median ms | min ms | max ms | reps | host µs | GB/s | TFLOP/s "
             "| floor ms | % floor | check | note |", "|" + "---|" * 15]
    for r in rows:
        timed = "median_ms" in r
        num = (lambda k, f: format(r[k], f) if k in r else "")  # noqa: E731
        lines.append("| " + " | ".join([
            r["label"], r["layout"], r["impl"], r["status"], num("median_ms", ".4g"), num("min_ms", ".4g"),
            num("max_ms", ".4g"), str(r.get("reps", "")) if timed else "", num("host_us", ".3g"), num("gbps", ".0f"),
            num("tflops", ".1f"), f"{r['floor_ms']:.4g}", f"{100 * r['fraction']:.1f}" if "fraction" in r else "",
            _md(r.get("check", "")), _md(r.get("note", ""))]) + " |")
    return lines


def markdown_report(rows: list[dict], facts: dict) -> str:
    """bench.md: the machine, then one table per layout, a column pair per implementation."""
    impls = _in_order(rows, "impl")
    anchors = facts.get("anchors", ["naive", "cuda"])
    lines = ["# tree_verify_mla benchmark", "",
             f"{facts.get('gpu')} (sm {facts.get('sm')}), driver {facts.get('driver')}, torch {facts.get('torch')}, "
             f"triton {facts.get('triton')}, nvcc {facts.get('nvcc')}; git {str(facts.get('git_sha'))[:12]}"
             f"{' (dirty)' if facts.get('git_dirty') else ''}; {facts.get('date')}.", "",
             f"`{facts.get('command')}`", "",
             f"Measured ceilings: copy {facts.get('copy_bytes_per_s', 0) / 1e9:.0f} GB/s, bf16 matmul "
             f"{facts.get('bf16_flops_per_s', 0) / 1e12:.0f} TFLOP/s. Floor = max(bytes / copy bw, FLOPs / matmul "
             f"rate); times are median (min–max) ms of CUDA events around each call, {_timing(facts)}; "
             "% = floor / median. "
             f"Outputs are checked against the first of {', '.join(anchors)} that ran "
             f"(rel-L2 ≤ {facts.get('agree_rel_l2', 2e-2)}); ✗ marks disagreement. "
             f"Calls over {facts.get('skip_seconds', 2.0):g} s are left out."]
    for name, err in (facts.get("impl_errors") or {}).items():
        lines += ["", f"**{name} left out**: its first call failed: {_md(err)}"]
    if facts.get("not_run"):
        lines += ["", f"**Not run (time budget spent): {len(facts['not_run'])} configs.**"]
    speedup = "cuda" in impls and "triton" in impls
    for layout in _in_order(rows, "layout"):
        mine = [r for r in rows if r["layout"] == layout]
        header = ["H", "T", "B", "L", "floor ms"]
        for i in impls:
            header += [f"{i} ms", f"{i} %"]
        if speedup:
            header.append("cuda vs triton")
        lines += ["", f"## {layout} slots", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        by_config: dict = {}
        for r in mine:
            by_config.setdefault((r["H"], r["T"], r["B"], r["L"]), {})[r["impl"]] = r
        for (H, T, B, L), by_impl in by_config.items():
            any_row = next(iter(by_impl.values()))
            cells = [str(H), str(T), str(B), Shape(H, T, B, L).label.split(" L")[1], f"{any_row['floor_ms']:.4g}"]
            for i in impls:
                cells += list(_cell(by_impl.get(i)))
            if speedup:
                c, t = by_impl.get("cuda", {}), by_impl.get("triton", {})
                ok = c.get("status") == "ok" and t.get("status") == "ok"
                cells.append(f"{t['median_ms'] / c['median_ms']:.1f}×" if ok else "")
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## every row", "", *_long_table(rows)]
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict], key: str, ylabel: str, path: Path, log_y: bool, with_floor: bool) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, NullLocator

    groups = sorted({(r["H"], r["T"], r["B"]) for r in rows})
    if not groups:
        fig, ax = plt.subplots(figsize=(4, 1))
        ax.axis("off")
        ax.text(0.5, 0.5, "no configs were measured", ha="center", va="center")
        fig.savefig(path, dpi=80)
        plt.close(fig)
        return
    cols = min(8, len(groups))
    nrows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(2.7 * cols, 2.3 * nrows), squeeze=False, sharey=not log_y)
    impls = _in_order(rows, "impl")
    layouts = _in_order(rows, "layout")
    colors = {i: f"C{k}" for k, i in enumerate(impls)}
    labelled: set = set()

    def label(text):
        if text in labelled:
            return None
        labelled.add(text)
        return text

    for ax, (H, T, B) in zip(axes.flat, groups):
        mine = [r for r in rows if (r["H"], r["T"], r["B"]) == (H, T, B)]
        for layout, style in zip(layouts, ("-", ":")):
            for impl in impls:
                pts = sorted((r["L"], r[key]) for r in mine if r["impl"] == impl and r["layout"] == layout
                             and r["status"] == "ok" and key in r)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, color=colors[impl],
                            label=label(f"{impl} ({layout})"))
            if with_floor:
                floor = sorted({(r["L"], r["floor_ms"]) for r in mine if r["layout"] == layout})
                if floor and layout == layouts[0]:
                    ax.plot(*zip(*floor), "--", color="k", lw=1, label=label("floor"))
        ax.set_xscale("log", base=2)
        lengths = sorted({r["L"] for r in mine})
        ax.set_xticks(lengths, [Shape(H, T, B, ell).label.split(" L")[1] for ell in lengths])
        if log_y:
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(bottom=0)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_title(f"H{H} T{T} B{B}", fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.supxlabel("L (prefix slots)")
    fig.supylabel(ylabel)
    fig.legend(loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1 - 1.6 / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_report(rows: list[dict], facts: dict, out_dir) -> list[Path]:
    """Write bench.json, bench.md, bench_time.png and bench_roofline.png into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.json", out / "bench.md", out / "bench_time.png", out / "bench_roofline.png"]
    tmp = paths[0].with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"facts": facts, "rows": rows}, indent=1, default=str))
    os.replace(tmp, paths[0])
    paths[1].write_text(markdown_report(rows, facts))
    _plot(rows, "median_ms", "median ms", paths[2], log_y=True, with_floor=True)
    _plot(rows, "fraction", "fraction of roofline (floor / median)", paths[3], log_y=False, with_floor=False)
    return paths


if __name__ == "__main__":
    raise SystemExit("kdtree.tools.bench_report is the report library of the benchmark, not a program: run "
                     "`python -m kdtree.tools.bench` (it writes bench.json, bench.md and the plots)")
