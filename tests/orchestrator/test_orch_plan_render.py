"""The plan markdown: blocks rendered from the records, human text kept byte for byte, damage refused."""

from __future__ import annotations

import pytest

from kdtree.orchestrator.markers import MarkerError, find_blocks, replace_blocks
from orch_project import PLAN_MD


def _outside_blocks(text: str) -> list[str]:
    """The text with every block's content removed (markers kept)."""
    out, inside = [], False
    for line in text.split("\n"):
        if "orchestrate:end" in line and line.startswith("<!--"):
            inside = False
        if not inside:
            out.append(line)
        if "orchestrate:begin" in line and line.startswith("<!--"):
            inside = True
    return out


def test_run_renders_blocks_and_keeps_human_text_byte_for_byte(project):
    project.cli("run", "p1", "--device", "cpu")
    text = project.plan_path.read_text(encoding="utf-8")
    assert _outside_blocks(text) == _outside_blocks(PLAN_MD)
    assert text.endswith("Closing words, no newline at the end.")
    assert "trailing spaces   \n" in text and "✓" in text
    assert "stale content that will be replaced" not in text
    assert "| p1 | alpha | **passed** | 2/2 |" in text
    assert "| p2 | beta | **pending** | 0/2 |" in text
    assert "| speed | metric | passed | speedup 4.2x >= 3x |" in text
    assert "_No full run of p2 recorded yet._" in text


def test_rendering_is_deterministic_and_check_detects_drift(project):
    project.cli("run", "p1", "--device", "cpu")
    rendered = project.plan_path.read_bytes()
    project.cli("plan")
    assert project.plan_path.read_bytes() == rendered
    project.cli("plan", "--check", expect=0)
    project.plan_path.write_text(project.plan_path.read_text().replace("2/2", "1/2"))
    res = project.cli("plan", "--check", expect=1)
    assert "out of date" in res.stderr and "status" in res.stderr
    project.cli("plan")
    assert project.plan_path.read_bytes() == rendered


def test_plan_check_fails_when_a_record_arrives_without_rendering(project):
    project.cli("plan")
    project.cli("run", "p1", "--device", "cpu")
    before = project.plan_path.read_bytes()
    project.cli("run", "p1", "--device", "cpu", expect=0)
    assert project.plan_path.read_bytes() != before  # the new run id is rendered
    project.plan_path.write_bytes(before)
    project.cli("plan", "--check", expect=1)


def test_plots_are_linked_relative_to_the_plan(project):
    project.knobs(p1={"speed": "plot"})
    project.cli("run", "p1", "--device", "cpu")
    assert "[speed.png](results/p1/speed.png)" in project.plan_path.read_text()


def test_crlf_file_keeps_its_line_endings():
    text = "a\r\n<!-- orchestrate:begin status -->\r\nold\r\n<!-- orchestrate:end status -->\r\nz\r\n"
    out = replace_blocks(text, {"status": "new\nlines\n"})
    assert out == "a\r\n<!-- orchestrate:begin status -->\r\nnew\r\nlines\r\n<!-- orchestrate:end status -->\r\nz\r\n"


@pytest.mark.parametrize("damage, line, words", [
    (lambda t: t.replace("<!-- orchestrate:end status -->\n", "", 1), 13,
     "begin of block 'results-p1' inside block 'status' (opened at line 6"),
    (lambda t: t.replace("<!-- orchestrate:end results-p2 -->\n", ""), 17, "never ended"),
    (lambda t: t + "\n<!-- orchestrate:begin results-p1 -->\n<!-- orchestrate:end results-p1 -->\n", 21,
     "appears twice (first at line 14)"),
    (lambda t: t.replace("<!-- orchestrate:begin results-p1 -->", "<!-- orchestrate:begin results-p1"), 14,
     "malformed"),
    (lambda t: t.replace("<!-- orchestrate:begin results-p1 -->\n", ""), 14, "without a matching begin"),
    (lambda t: t.replace("end results-p2 -->", "end results-p3 -->"), 18, "end of block 'results-p3' but block 'results-p2'"),
    (lambda t: t.replace("results-p2", "results-p3"), 17, "unknown block 'results-p3'"),
])
def test_damaged_markers_are_errors_with_line_numbers_and_nothing_is_written(project, damage, line, words):
    damaged = damage(PLAN_MD)
    project.plan_path.write_text(damaged, encoding="utf-8")
    res = project.cli("plan", expect=2)
    assert f"plans/plan.md:{line}:" in res.stderr and words in res.stderr
    assert project.plan_path.read_text(encoding="utf-8") == damaged
    res = project.cli("run", "p1", "--device", "cpu", expect=2)
    assert f"plans/plan.md:{line}:" in res.stderr
    assert project.plan_path.read_text(encoding="utf-8") == damaged
    assert project.records("p1") == []  # refused before any gate ran


def test_missing_block_is_an_error(project):
    damaged = PLAN_MD.replace("<!-- orchestrate:begin results-p2 -->\n<!-- orchestrate:end results-p2 -->\n", "")
    project.plan_path.write_text(damaged, encoding="utf-8")
    res = project.cli("plan", expect=2)
    assert "results-p2 missing" in res.stderr


def test_prose_mentioning_markers_is_not_a_marker():
    text = "Blocks sit between `orchestrate:begin` and `orchestrate:end` markers.\n"
    assert find_blocks(text) == []
    with pytest.raises(MarkerError, match="malformed"):
        find_blocks("x\n  <!-- orchestrate:begin status\n")
