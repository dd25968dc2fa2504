"""`orchestrate report`: the page for a fresh `orchestrate init` project with a few runs, for the
test plan with a failed run and a pending phase, and for this repository; its refusals."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from kdtree.orchestrator import device as device_facts
from kdtree.orchestrator.cli import cli
from kdtree.orchestrator.specs import DeviceInfo
from orch_project import git, init_repo, make_project

REPO = Path(__file__).resolve().parents[2]
H200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability="9.0", driver="580.00", host="gpu1")


class Page(HTMLParser):
    """The elements of a report page: (tag, attrs, the enclosing phase / gate / chart figure)."""

    def __init__(self, html: str):
        super().__init__()
        self.elements: list[tuple[str, dict, dict]] = []
        self._stack: list[tuple[str, dict]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        where = {}
        for _, a in self._stack + [(tag, attrs)]:
            for key in ("data-phase", "data-gate", "data-figure", "data-device"):
                if key in a:
                    where[key[5:]] = a[key]
        self.elements.append((tag, attrs, where))
        if tag not in ("meta", "br", "img", "link", "hr", "input"):  # HTML's void elements
            self._stack.append((tag, attrs))

    def handle_startendtag(self, tag, attrs):
        attrs = dict(attrs)
        where = {k[5:]: v for _, a in self._stack for k, v in a.items() if k.startswith("data-")}
        where.update({k[5:]: v for k, v in attrs.items() if k.startswith("data-")})
        self.elements.append((tag, attrs, where))

    def handle_endtag(self, tag):
        if any(t == tag for t, _ in self._stack):
            while self._stack.pop()[0] != tag:
                pass

    def find(self, tag: str, cls: str | None = None, **where) -> list[tuple[str, dict, dict]]:
        return [e for e in self.elements if e[0] == tag
                and (cls is None or cls in e[1].get("class", "").split())
                and all(e[2].get(k) == v for k, v in where.items())]

    def phases(self) -> list[str]:
        return [a["data-phase"] for _, a, _ in self.find("section", "phase")]


def invoke(*args: str, expect: int = 0):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == expect, f"orchestrate {' '.join(args)} exited {result.exit_code}:\n{result.output}"
    return result


def _init_project(root: Path) -> str:
    """A fresh `orchestrate init` project in a git repository, committed; returns its package."""
    root.mkdir(parents=True)
    init_repo(root)
    pkg = "rp_" + uuid.uuid4().hex[:10]
    invoke("--repo", str(root), "init", "--id", "shop", "--title", "The shop", "--package", pkg)
    (root / ".gitignore").write_text("__pycache__/\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "plan")
    return pkg


def test_report_of_a_fresh_init_project_charts_each_run_per_device(tmp_path, monkeypatch):
    root = tmp_path / "shop"
    pkg = _init_project(root)
    try:
        for _ in range(2):
            invoke("--repo", str(root), "run", "example")
        with monkeypatch.context() as m:  # a third run "on the GPU machine"
            m.setattr(device_facts, "device_info", lambda d: H200)
            invoke("--repo", str(root), "run", "example")
        out = invoke("--repo", str(root), "report").output
    finally:
        import sys
        for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
            del sys.modules[name]
    path = root / "plans" / "results" / "report.html"
    assert f"wrote {path}" in out and "1 phase(s), 2 chart(s)" in out
    page = Page(path.read_text(encoding="utf-8"))
    assert page.phases() == ["example"]
    assert page.find("div", "gate", phase="example", gate="sort")
    assert [a["data-figure"] for _, a, _ in page.find("figure", "chart", gate="sort")] == \
        ["out_of_order", "items_per_s"]
    for figure in ("out_of_order", "items_per_s"):
        assert len(page.find("svg", "chart", figure=figure)) == 1
        devices = [a["data-device"] for _, a, _ in page.find("g", "series", figure=figure)]
        assert devices == ["cpu (" + devices[0].split("(", 1)[1], "NVIDIA H200 (sm_90)"]
        assert len(page.find("circle", "point", figure=figure)) == 3
        assert len(page.find("path", "threshold", figure=figure)) == 1
    # items_per_s has a target (1e9/s, far above the measured rate): a target line, a log axis
    assert len(page.find("path", "target", figure="items_per_s")) == 1
    assert not page.find("path", "target", figure="out_of_order")
    html = path.read_text(encoding="utf-8")
    assert "log scale" in html and "target &gt;= 1e+09/s" in html
    assert "passed" in html and "not met" in html


@pytest.fixture
def failing_project(tmp_path):
    proj = make_project(tmp_path / "repo", targets='Target(figure="speedup", op=">=", value=5.0, unit="x")')
    proj.cli("run", "p1")
    proj.knobs(p1={"speed": "fail"})
    proj.cli("run", "p1", expect=1)
    yield proj
    proj.forget_modules()


def test_report_shows_a_miss_a_target_and_a_pending_phase(failing_project, tmp_path):
    proj = failing_project
    out = tmp_path / "pages" / "r.html"
    result = proj.cli("report", "--out", str(out))
    assert "2 phase(s)" in result.output
    page = Page(out.read_text(encoding="utf-8"))
    assert page.phases() == ["p1", "p2"]
    states = {a["data-phase"]: None for _, a, _ in page.find("tr", "phase-row")}
    assert list(states) == ["p1", "p2"]
    html = out.read_text(encoding="utf-8")
    p1 = html[html.index('id="phase-p1"'):html.index('id="phase-p2"')]
    p2 = html[html.index('id="phase-p2"'):]
    assert '<span class="state failed">failed</span>' in p1
    assert "speedup 1.5x &gt;= 5x: not met" in p1  # the target against the deciding (failed) run
    assert '<span class="state pending">pending</span>' in p2 and "No full run recorded yet" in p2
    assert not page.find("svg", "chart", phase="p2")
    # the speed gate's chart: both runs, the failed one hollow, threshold 3x and target 5x drawn
    assert [a["data-figure"] for _, a, _ in page.find("figure", "chart", gate="speed")] == ["speedup"]
    points = page.find("circle", "point", phase="p1", gate="speed")
    assert len(points) == 2 and ["miss" in a["class"] for _, a, _ in points] == [False, True]
    assert page.find("path", "threshold", gate="speed") and page.find("path", "target", gate="speed")
    assert "threshold &gt;= 3x" in p1 and "target &gt;= 5x" in p1


def test_report_is_self_contained(failing_project, tmp_path):
    out = tmp_path / "r.html"
    failing_project.cli("report", "--out", str(out))
    html = out.read_text(encoding="utf-8")
    assert "<script" not in html.lower()
    urls = set(re.findall(r"(?:https?:)?//[^\s\"'<>)]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert not re.search(r"""(?:src|href)=["'](?!#)""", html)


def test_report_refusals(failing_project, tmp_path):
    proj = failing_project
    folder = tmp_path / "a-folder"
    folder.mkdir()
    result = proj.cli("report", "--out", str(folder), expect=2)
    assert f"--out {folder} is a folder" in result.output
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = proj.cli("report", "--out", str(blocker / "r.html"), expect=2)
    assert "is not a folder" in result.output
    record = proj.records("p1")[0]
    data = json.loads(record.read_text())
    data["run_id"] = "20200101T000000000000Z-abcdef"
    record.write_text(json.dumps(data))
    result = proj.cli("report", "--out", str(tmp_path / "r.html"), expect=2)
    assert str(record) in result.output and not (tmp_path / "r.html").exists()


def test_report_keeps_the_old_page_when_it_cannot_write(failing_project, tmp_path, monkeypatch):
    out = tmp_path / "r.html"
    out.write_text("the old page")
    from kdtree import fsutil

    def full_disk(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil, "atomic_write_bytes", full_disk)
    result = failing_project.cli("report", "--out", str(out), expect=2)
    assert "could not be written" in result.output and "No space left on device" in result.output
    assert out.read_text() == "the old page"


def test_report_of_this_repository(tmp_path):
    from kdtree.orchestrator.plan import load_plan  # noqa: PLC0415

    out = tmp_path / "report.html"
    invoke("--repo", str(REPO), "report", "--out", str(out))
    plan = load_plan(REPO, True)
    page = Page(out.read_text(encoding="utf-8"))
    assert page.phases() == [p.id for p in plan.phases]
    for phase in plan.phases:
        assert [a["data-gate"] for _, a, _ in page.find("div", "gate", phase=phase.id)] == \
            [g.name for g in phase.spec.gates]
        for g in phase.spec.gates:
            charted = {a["data-figure"] for _, a, _ in page.find("figure", "chart", phase=phase.id, gate=g.name)}
            assert {t.figure for t in g.targets} <= charted
    svgs = page.find("svg", "chart")
    assert len(svgs) >= 10
    assert page.find("path", "threshold") and page.find("path", "target")
    assert len({a["data-device"] for _, a, _ in page.find("g", "series")}) >= 1


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium here (Debian: apt-get install chromium)")
def test_report_renders_in_headless_chromium(failing_project, tmp_path):
    """Chromium parses the page into a DOM with every chart, and a screenshot shows them drawn."""
    out = tmp_path / "report.html"
    failing_project.cli("report", "--out", str(out))
    expected = Page(out.read_text(encoding="utf-8"))
    base = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600"]
    dom = subprocess.run(base + ["--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Page(dom.stdout)
    assert page.phases() == ["p1", "p2"]
    assert len(page.find("svg", "chart")) == len(expected.find("svg", "chart")) >= 1
    assert len(page.find("circle", "point")) == len(expected.find("circle", "point")) == 4
    assert page.find("path", "threshold") and page.find("path", "target")
    shot = tmp_path / "report.png"
    done = subprocess.run(base + [f"--screenshot={shot}", out.as_uri()], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    print(f"screenshot: {shot}")
    image = pytest.importorskip("PIL.Image").open(shot).convert("RGB")
    colors = {rgb for _, rgb in image.getcolors(maxcolors=1 << 20)}
    assert (0x00, 0x72, 0xb2) in colors  # the first device's points and trace
    assert (0xc0, 0x39, 0x2b) in colors  # the threshold line


def test_report_names_a_phase_a_newer_orchestrate_wrote_and_shows_the_others(project, tmp_path):
    project.cli("run", "p1")
    project.cli("run", "p2")
    path = project.records("p2")[0]
    rec = json.loads(path.read_text())
    rec["schema_version"] = 99
    path.write_text(json.dumps(rec))
    out = tmp_path / "r.html"
    project.cli("report", "--out", str(out))
    page = Page(out.read_text(encoding="utf-8"))
    assert page.phases() == ["p1", "p2"]
    html = out.read_text(encoding="utf-8")
    p2 = html[html.index('id="phase-p2"'):]
    assert "unreadable: " in p2 and "schema 99" in p2 and "upgrade" in p2
    assert page.find("svg", "chart", phase="p1") and not page.find("svg", "chart", phase="p2")
