"""CHANGELOG.md entries for phases that newly passed (Keep a Changelog layout).

An entry is one line under ``## [Unreleased]`` / ``### Added`` that names the passing run::

    - phase1 kernel passed (7/7 gates): build spills 0 <= 0, ... — run `2026…-1a2b3c`, NVIDIA H200 (sm_90)

A phase "newly passed" when its latest full run passed, is fresh, and its run id is not yet in
the changelog: re-running and passing again (new code, new figures) adds a new line, running
``checkpoint`` twice does not. Everything else in the file is kept byte for byte.
"""

from __future__ import annotations

import re
from pathlib import Path

from kdtree.orchestrator.errors import Refusal
from kdtree.fsutil import atomic_write_text
from kdtree.orchestrator.markers import split_lines
from kdtree.orchestrator.specs import RunRecord
from kdtree.orchestrator.textfile import read_text
from kdtree.orchestrator.views import key_figure_text

_HEADER = ("# Changelog\n\nAll notable changes to this project are documented here. The format "
           "follows\n[Keep a Changelog](https://keepachangelog.com/en/1.1.0/).\n\n")


def entry_line(title: str, record: RunRecord) -> str:
    """The changelog line for a passing run."""
    figs = ", ".join(f"{r.gate} {key_figure_text(r)}".strip() for r in record.results)
    return (f"- {record.phase} {title} passed ({record.passed_count}/{len(record.results)} gates): "
            f"{figs} — run `{record.run_id}`, {record.device.label}\n")


def recorded(text: str, record: RunRecord) -> bool:
    return f"`{record.run_id}`" in text


def add_entries(text: str, lines: list[str]) -> str:
    """``text`` with ``lines`` appended to ``## [Unreleased]`` / ``### Added`` (created if absent)."""
    if not lines:
        return text
    if not text:
        text = _HEADER
    rows = split_lines(text)
    if rows and not rows[-1].endswith("\n"):
        rows[-1] += "\n"
    unreleased = next((i for i, r in enumerate(rows) if re.match(r"^##\s+\[?Unreleased\]?\s*$", r.strip(), re.I)), None)
    if unreleased is None:
        first_release = next((i for i, r in enumerate(rows) if r.startswith("## ")), len(rows))
        block = ["## [Unreleased]\n", "\n", "### Added\n", *lines, "\n"]
        if first_release == len(rows) and rows and rows[-1].strip():
            block.insert(0, "\n")
        return "".join(rows[:first_release] + block + rows[first_release:])
    section_end = next((i for i in range(unreleased + 1, len(rows)) if rows[i].startswith("## ")), len(rows))
    added = next((i for i in range(unreleased + 1, section_end)
                  if re.match(r"^###\s+Added\s*$", rows[i].strip())), None)
    if added is None:
        insert = unreleased + 1
        new = ["\n", "### Added\n", *lines]
        if insert < len(rows) and rows[insert].strip():
            new.append("\n")
        return "".join(rows[:insert] + new + rows[insert:])
    sub_end = next((i for i in range(added + 1, section_end) if rows[i].startswith("#")), section_end)
    last = sub_end
    while last > added + 1 and not rows[last - 1].strip():
        last -= 1  # insert after the list's last line, before the blank lines that end it
    return "".join(rows[:last] + lines + rows[last:])


def update_changelog(path: Path, entries: list[tuple[str, RunRecord]]) -> list[str]:
    """Add the entries not yet recorded; return the lines added. Atomic; untouched if none."""
    text = read_text(path, "the changelog", missing_ok=True)
    lines = [entry_line(title, rec) for title, rec in entries if not recorded(text, rec)]
    if lines:
        try:
            atomic_write_text(path, add_entries(text, lines))
        except OSError as exc:
            raise Refusal(f"the changelog {path} cannot be written ({exc.strerror or exc}); make it "
                          "and its folder writable (an immutable file: `chattr -i`), then checkpoint "
                          "again") from None
    return lines
