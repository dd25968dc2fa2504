"""The decode benchmark's record as a table and as a plot (`kdtree.bench.decode.run_decode`).

`decode_table` (plain text, Markdown-compatible): per context and arm, tokens/s (median and
spread max/min over the rounds), the speedup over the baseline of the same mode with its
Hodges-Lehmann interval, accepted tokens per step, wall and GPU time per step; then the step
breakdown. `decode_figure` / `save_plot`: tokens/s against context length, one line per arm
(graphs solid, eager dashed), the range over rounds as error bars; matplotlib's Agg backend, so
no display is needed.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from kdtree.fsutil import atomic_write_bytes

_BREAKDOWN = (("attention_gpu_ms", "attention"), ("rest_gpu_ms", "rest of model"), ("drafting_gpu_ms", "drafting"),
              ("conversion_gpu_ms", "conversion"), ("host_exposed_ms", "host not hidden"))


def _num(value: Any, fmt: str = ".2f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, fmt)


def _label(context: int) -> str:
    return f"{context // 1024}k" if context % 1024 == 0 else str(context)


def speedup_cell(s: dict[str, float] | None) -> str:
    """'2.91x [2.80, 3.02]': the Hodges-Lehmann ratio and its interval."""
    if not s:
        return "-"
    return f"{_num(s['ratio'])}x [{_num(s['low'])}, {_num(s['high'])}]"


def decode_table(record: dict[str, Any]) -> str:
    """The record as text tables (module docstring)."""
    cfg = record["config"]
    lines = [f"decode benchmark on {record['device']}: drafter {cfg['drafter']}, budget {cfg['budget']}, "
             f"{cfg['new_tokens']} new tokens per request, {cfg['rounds']} rounds per arm (interleaved), "
             f"baseline {cfg['baseline']}; speedup = Hodges-Lehmann ratio of tokens/s [Mann-Whitney interval]",
             "",
             "| L | B | arm | tok/s median | spread | speedup vs baseline | accepted/step | step ms | GPU ms/step | same tokens |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for ctx in record["contexts"]:
        for name, arm in ctx["arms"].items():
            base = f"{cfg['baseline']}-{arm['mode']}"
            tps = arm["tokens_per_s"]
            gpu = arm.get("breakdown", {}).get("gpu_ms_per_step")
            lines.append(f"| {_label(ctx['context'])} | {ctx['batch']} | {name} | {_num(tps['median'], '.1f')} | "
                         f"{_num(tps['spread'], '.3f')} | {speedup_cell(ctx['speedups'].get(f'{name}/{base}'))} | "
                         f"{_num(arm['mean_accepted'])} | {_num(arm['step_ms'])} | {_num(gpu)} | "
                         f"{'yes' if arm['same_tokens'] else 'NO'} |")
    graph_gain = [(ctx, k, v) for ctx in record["contexts"] for k, v in ctx["speedups"].items() if "-graph/" in k
                  and k.endswith("-eager")]
    if graph_gain:
        lines += ["", "graphs over eager: " + "; ".join(f"{_label(c['context'])} {k.split('/')[0]}: {speedup_cell(v)}"
                                                      for c, k, v in graph_gain)]
    if any("breakdown" in arm for ctx in record["contexts"] for arm in ctx["arms"].values()):
        lines += ["", "step breakdown (ms per decode step; GPU times queued behind a busy-wait):", "",
                  "| L | arm | " + " | ".join(label for _, label in _BREAKDOWN) + " | GPU total | step |",
                  "|---|---|" + "---|" * (len(_BREAKDOWN) + 2)]
        for ctx in record["contexts"]:
            for name, arm in ctx["arms"].items():
                b = arm.get("breakdown")
                if b:
                    lines.append(f"| {_label(ctx['context'])} | {name} | " + " | ".join(_num(b.get(k)) for k, _ in _BREAKDOWN)
                                 + f" | {_num(b.get('gpu_ms_per_step'))} | {_num(b.get('step_ms'))} |")
    cut = [c for c in record["contexts"] if c.get("cut_by_time_budget")]
    if cut:
        lines += ["", "time budget reached: " + ", ".join(f"{_label(c['context'])} ran {c['rounds_run']} rounds"
                                                          for c in cut)]
    return "\n".join(lines)


def decode_figure(record: dict[str, Any]):
    """A matplotlib Figure: tokens/s (median, min-max bars) against context length per arm."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(7, 4.5), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    names = list(record["contexts"][0]["arms"]) if record["contexts"] else []
    for name in names:
        xs, ys, lo, hi = [], [], [], []
        for ctx in record["contexts"]:
            arm = ctx["arms"].get(name)
            if arm is None:
                continue
            t = arm["tokens_per_s"]
            xs.append(ctx["context"])
            ys.append(t["median"])
            lo.append(t["median"] - t["min"])
            hi.append(t["max"] - t["median"])
        eager = name.endswith("-eager")
        ax.errorbar(xs, ys, yerr=[lo, hi], label=name, marker="o", capsize=3, linestyle="--" if eager else "-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("decode tokens/s (median over rounds)")
    cfg = record["config"]
    ax.set_title(f"{record['device']}: {cfg['drafter']} budget {cfg['budget']}, {cfg['new_tokens']} new tokens")
    ax.set_xticks([c["context"] for c in record["contexts"]], [_label(c["context"]) for c in record["contexts"]])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def save_plot(record: dict[str, Any], path: str | Path) -> list[str]:
    """Write the plot as a PNG to `path` (atomically); returns the labels of the series drawn."""
    fig = decode_figure(record)
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(Path(path), buf.getvalue())
    return labels
