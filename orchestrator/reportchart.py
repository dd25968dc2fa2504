"""Line charts as inline SVG, drawn in Python for `orchestrate report` (no JavaScript, no network).

A `Chart` is one figure of one gate across the recorded runs: a `Series` of `Point` per device,
on a shared x axis of run slots (oldest left; each slot labelled with the run's date and commit),
and horizontal `RefLine`\\ s for the gate's threshold (a step line where it changed between
runs) and its targets. Every point carries a ``<title>`` (run, date, commit, device, value),
which browsers show on hover. The y axis is logarithmic when every value is positive and they
span two decades or more.

The markup is deterministic (same chart, same bytes) and its elements carry classes the tests
and the page's style sheet use: ``chart``, ``series``, ``point``, ``miss``, ``threshold``,
``target``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Optional

from kdtree.gates.base import fmt_number

WIDTH, PLOT_HEIGHT = 720, 200
LEFT, RIGHT, BOTTOM = 64, 16, 48
COLORS = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#000000")
THRESHOLD_COLOR, TARGET_COLOR = "#c0392b", "#2e7d32"
MAX_X_LABELS = 12
LEGEND_ROW, LEGEND_CHARS = 14, 90


@dataclass(frozen=True)
class Point:
    """One run's value of the figure."""

    slot: int  # the run's position on the x axis
    value: float
    tooltip: str
    ok: Optional[bool] = None  # against the threshold it was held to (None: none)


@dataclass
class Series:
    """One device's points, in run order."""

    label: str
    points: list[Point] = field(default_factory=list)


@dataclass(frozen=True)
class RefLine:
    """A threshold or target: ``values[i]`` at slot ``i`` (None where it did not apply)."""

    kind: str  # "threshold" or "target"
    label: str
    values: tuple[Optional[float], ...]


@dataclass
class Chart:
    """A figure's history: its series, the x slots' labels and the lines it is held against."""

    title: str
    unit: str
    slots: list[tuple[str, str]]  # (date, commit) per x slot, oldest first
    series: list[Series]
    lines: list[RefLine] = field(default_factory=list)

    @property
    def points(self) -> int:
        return sum(len(s.points) for s in self.series)


def _nice_step(span: float, count: int) -> float:
    raw = span / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * mag:
            return mult * mag
    return 10 * mag


class _Scale:
    """Maps values to y pixels, linear or logarithmic, with the ticks to draw."""

    def __init__(self, values: list[float], top: float, height: float):
        self.top, self.bottom = top, height - BOTTOM
        lo, hi = min(values), max(values)
        self.log = lo > 0 and hi / lo >= 100
        if self.log:
            self.lo, self.hi = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
            if self.hi == self.lo:
                self.hi += 1
            self.ticks = [10.0 ** e for e in range(int(self.lo), int(self.hi) + 1)]
            return
        if hi == lo:
            pad = abs(hi) * 0.1 or 1.0
            lo, hi = (lo - pad if lo != 0 else lo), hi + pad
        step = _nice_step(hi - lo, 5)
        self.lo, self.hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
        if self.lo == lo and lo != 0:
            self.lo -= step
        if self.hi == hi:
            self.hi += step
        if lo >= 0 > self.lo:  # counts and ratios never go below zero
            self.lo = 0.0
        count = int(round((self.hi - self.lo) / step))
        self.ticks = [round(self.lo + i * step, 12) for i in range(count + 1)]

    def y(self, value: float) -> float:
        v = math.log10(value) if self.log else value
        frac = (v - self.lo) / (self.hi - self.lo)
        return self.top + (1.0 - frac) * (self.bottom - self.top)


def _tick_text(tick: float) -> str:
    if tick == int(tick) and abs(tick) < 1e6:
        return str(int(tick))
    return fmt_number(tick)


def _x(slot: int, slots: int) -> float:
    inner = WIDTH - LEFT - RIGHT
    if slots <= 1:
        return LEFT + inner / 2
    return LEFT + 12 + slot * (inner - 24) / (slots - 1)


def _f(x: float) -> str:
    return f"{x:.1f}"


def _line_path(line: RefLine, slots: int, scale: _Scale) -> str:
    """An SVG path through the line's values: flat across each run it applied to, joined by steps."""
    parts: list[str] = []
    half = (_x(1, slots) - _x(0, slots)) / 2 if slots > 1 else (WIDTH - LEFT - RIGHT) / 2
    previous: Optional[float] = None
    for slot, value in enumerate(line.values):
        if value is None or (scale.log and value <= 0):
            previous = None
            continue
        x0 = max(LEFT, _x(slot, slots) - half)
        x1 = min(WIDTH - RIGHT, _x(slot, slots) + half)
        y = scale.y(value)
        parts.append(f"{'L' if previous is not None else 'M'}{_f(x0)},{_f(y)} L{_f(x1)},{_f(y)}")
        previous = value
    return " ".join(parts)


def _legend(chart: Chart) -> tuple[list[str], int]:
    """The legend's markup above the plot, wrapped to the chart's width, and the rows it took."""
    out, x, y = [], LEFT, 14
    entries = [(s.label, COLORS[i % len(COLORS)], "series") for i, s in enumerate(chart.series)]
    entries += [(line.label, THRESHOLD_COLOR if line.kind == "threshold" else TARGET_COLOR, line.kind)
                for line in chart.lines]
    for label, color, kind in entries:
        label = label if len(label) <= LEGEND_CHARS else label[:LEGEND_CHARS - 1] + "…"
        width = 32 + 6.1 * len(label)
        if x + width > WIDTH - RIGHT and x > LEFT:
            x, y = LEFT, y + LEGEND_ROW
        dash = {"threshold": ' stroke-dasharray="6 3"', "target": ' stroke-dasharray="2 3"'}.get(kind, "")
        out.append(f'<g class="legend legend-{kind}"><line x1="{_f(x)}" y1="{y - 4}" x2="{_f(x + 18)}" y2="{y - 4}" '
                   f'stroke="{color}" stroke-width="2"{dash}/>'
                   f'<text x="{_f(x + 22)}" y="{y}">{escape(label)}</text></g>')
        x += width
    return out, (y - 14) // LEGEND_ROW + 1


def render_svg(chart: Chart) -> str:
    """The chart as an ``<svg>`` element (a string of markup, safe to inline in HTML)."""
    values = [p.value for s in chart.series for p in s.points]
    refs = [v for line in chart.lines for v in line.values if v is not None]
    legend, rows = _legend(chart)
    top = 14 + rows * LEGEND_ROW
    height = top + PLOT_HEIGHT + BOTTOM
    scale = _Scale(values + [v for v in refs if not (values and min(values) > 0 and v <= 0)], top, height)
    n = len(chart.slots)
    title = f"{chart.title}" + (f" ({chart.unit})" if chart.unit else "")
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
           f'width="{WIDTH}" height="{height}" role="img" aria-label="{escape(title)}">',
           f"<title>{escape(title)}</title>",
           f'<rect class="plot" x="{LEFT}" y="{top}" width="{WIDTH - LEFT - RIGHT}" '
           f'height="{PLOT_HEIGHT}" fill="none" stroke="#bbb"/>']
    for tick in scale.ticks:
        y = scale.y(tick)
        out.append(f'<line class="grid" x1="{LEFT}" y1="{_f(y)}" x2="{WIDTH - RIGHT}" y2="{_f(y)}" stroke="#eee"/>'
                   f'<text class="ytick" x="{LEFT - 6}" y="{_f(y + 4)}" text-anchor="end">'
                   f"{escape(_tick_text(tick))}</text>")
    every = max(1, math.ceil(n / MAX_X_LABELS))
    for slot, (date, commit) in enumerate(chart.slots):
        if slot != n - 1 and (slot % every or n - 1 - slot < every):
            continue
        x = _x(slot, n)
        out.append(f'<text class="xtick" x="{_f(x)}" y="{height - BOTTOM + 16}" text-anchor="middle">'
                   f'{escape(date)}<tspan x="{_f(x)}" dy="13">{escape(commit)}</tspan></text>')
    placed = [(COLORS[i % len(COLORS)], series,
               [(_x(p.slot, n), scale.y(p.value), p) for p in series.points if not (scale.log and p.value <= 0)])
              for i, series in enumerate(chart.series)]
    for color, _, pts in placed:  # traces under the lines, points above them
        if len(pts) > 1:
            d = " ".join(f"{'M' if j == 0 else 'L'}{_f(x)},{_f(y)}" for j, (x, y, _) in enumerate(pts))
            out.append(f'<path class="trace" d="{d}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    for line in chart.lines:
        path = _line_path(line, n, scale)
        if not path:
            continue
        color = THRESHOLD_COLOR if line.kind == "threshold" else TARGET_COLOR
        dash = "6 3" if line.kind == "threshold" else "2 3"
        out.append(f'<path class="{line.kind}" d="{path}" fill="none" stroke="{color}" stroke-width="1.5" '
                   f'stroke-dasharray="{dash}"><title>{escape(line.label)}</title></path>')
    for color, series, pts in placed:
        out.append(f'<g class="series" data-device="{escape(series.label)}">')
        for x, y, p in pts:
            miss = p.ok is False
            out.append(f'<circle class="point{" miss" if miss else ""}" cx="{_f(x)}" cy="{_f(y)}" r="4" '
                       f'fill="{"#fff" if miss else color}" stroke="{color}" stroke-width="2">'
                       f"<title>{escape(p.tooltip)}</title></circle>")
        out.append("</g>")
    out.extend(legend)
    if scale.log:
        out.append(f"<text class=\"note\" x=\"4\" y=\"{top - 4}\">log scale</text>")
    out.append("</svg>")
    return "".join(out)
