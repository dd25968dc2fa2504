"""The report's SVG charts: well-formed, scaled to what they show, lines where thresholds and targets are."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from kdtree.orchestrator.reportchart import Chart, Point, RefLine, Series, render_svg

NS = {"s": "http://www.w3.org/2000/svg"}


def chart(values_by_device: dict[str, list[float]], lines=(), unit="x") -> Chart:
    slots = sum(len(v) for v in values_by_device.values())
    series, slot = [], 0
    for label, values in values_by_device.items():
        points = []
        for v in values:
            points.append(Point(slot, v, f"run {slot}: {v}", ok=v >= 3))
            slot += 1
        series.append(Series(label, points))
    return Chart("speed: speedup", unit, [("12-0" + str(i % 9 + 1), f"abc{i:04d}") for i in range(slots)],
                 series, list(lines))


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML, or this raises


def ys_of(root: ET.Element, cls: str) -> list[float]:
    return [float(c.get("cy")) for c in root.iter("{http://www.w3.org/2000/svg}circle")
            if cls in c.get("class", "").split()]


def test_points_series_and_lines_are_drawn_with_their_classes():
    c = chart({"H200 (sm_90)": [4.2, 1.5, 5.0], "cpu <x86&64>": [3.5]},
              lines=[RefLine("threshold", "threshold >= 3x", (3.0,) * 4),
                     RefLine("target", "target >= 20x", (20.0,) * 4)])
    root = parse(render_svg(c))
    assert root.get("class") == "chart"
    groups = root.findall("s:g[@class='series']", NS)
    assert [g.get("data-device") for g in groups] == ["H200 (sm_90)", "cpu <x86&64>"]
    assert len(ys_of(root, "point")) == 4 and len(ys_of(root, "miss")) == 1
    assert len(root.findall("s:path[@class='threshold']", NS)) == 1
    assert len(root.findall("s:path[@class='target']", NS)) == 1
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert "run 1: 1.5" in titles and "target >= 20x" in titles
    # higher values are drawn higher (smaller y), and the target above every point
    y = ys_of(root, "point")
    assert y[2] < y[0] < y[1]
    target_y = float(re.search(r"M[\d.]+,([\d.]+)", root.find("s:path[@class='target']", NS).get("d")).group(1))
    assert target_y < min(y)


def test_a_threshold_that_changed_is_a_step():
    c = chart({"gpu": [6.0, 7.0, 11.0, 24.0]},
              lines=[RefLine("threshold", "threshold >= 3x", (20.0, 20.0, 3.0, 3.0))])
    d = parse(render_svg(c)).find("s:path[@class='threshold']", NS).get("d")
    assert len(set(re.findall(r"[\d.]+,([\d.]+)", d))) == 2


def test_values_spanning_decades_get_a_log_axis_and_counts_start_at_zero():
    wide = render_svg(chart({"cpu": [8e6, 5e6]}, lines=[RefLine("target", "target >= 1e9/s", (1e9, 1e9))]))
    assert "log scale" in wide
    counts = parse(render_svg(chart({"cpu": [0.0, 0.0, 2.0]}, unit="")))
    ticks = [t.text for t in counts.iter("{http://www.w3.org/2000/svg}text") if t.get("class") == "ytick"]
    assert ticks[0] == "0" and not any(t.startswith("-") for t in ticks)


def test_one_run_and_many_runs():
    one = parse(render_svg(chart({"cpu": [4.0]})))
    assert len(ys_of(one, "point")) == 1
    many = parse(render_svg(chart({"cpu": [float(i % 7 + 1) for i in range(60)]})))
    labels = [t for t in many.iter("{http://www.w3.org/2000/svg}text") if t.get("class") == "xtick"]
    assert len(ys_of(many, "point")) == 60 and 2 <= len(labels) <= 13


def test_the_same_chart_gives_the_same_markup():
    c = chart({"cpu": [4.0, 2.0]}, lines=[RefLine("threshold", "threshold >= 3x", (3.0, 3.0))])
    assert render_svg(c) == render_svg(c)
