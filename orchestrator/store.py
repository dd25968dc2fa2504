"""The result store: one JSON file per run under ``<results_dir>/<phase>/<run_id>.json``.

Records are written atomically and never edited (a checkpoint may fill in a record's commit,
see `kdtree.orchestrator.provenance`); history is every file. "Latest" is derived by sorting the
files (run ids begin with a UTC timestamp), so no pointer can go out of sync. Other files in a
phase's folder (plots, tables written by gates) are ignored. A record names its phase and run id,
and they must be its folder and its file name: a record copied into another phase's folder, or
under another name (so that it would count twice), is an error naming the file.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from pydantic import ValidationError

from kdtree.orchestrator.errors import Refusal
from kdtree.orchestrator.fsutil import atomic_write_text
from kdtree.orchestrator.specs import RunRecord, state_of

RUN_ID_RE = re.compile(r"^\d{8}T\d{12}Z-[0-9a-f]{6}$")


def new_run_id(now: Optional[datetime] = None) -> str:
    """``20261202T135501123456Z-1a2b3c``: sortable by time, unique with a random suffix."""
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S%fZ") + "-" + os.urandom(3).hex()


def check_identity(record: RunRecord, path: Path, phase: str) -> None:
    """Refuse a record whose phase or run id is not its folder or its file name."""
    if record.phase != phase:
        raise Refusal(f"run record {path} is a run of {record.phase!r} but lies in the folder of "
                      f"{phase!r}; move it to {path.parent.parent / record.phase / path.name} or delete it")
    if record.run_id != path.stem:
        raise Refusal(f"run record {path} names run {record.run_id!r} but its file is named "
                      f"{path.name!r} (a copy counts twice); rename it to {record.run_id}.json or delete it")


def check_consistent(record: RunRecord, path: Path) -> None:
    """Refuse a record whose state is not what its gates' outcomes amount to (edited by hand)."""
    implied = state_of(record.results)
    if record.state is not implied:
        outcomes = ", ".join(f"{r.gate}={r.outcome.value}" for r in record.results) or "no gates"
        raise Refusal(f"run record {path} is damaged: its state is {record.state.value!r} but its "
                      f"gates ({outcomes}) amount to {implied.value!r}; restore it from git or "
                      "delete it")


class ResultStore:
    """Read and write run records of a plan's phases."""

    def __init__(self, results_dir: Path):
        self.dir = results_dir

    def phase_dir(self, phase: str) -> Path:
        return self.dir / phase

    def path_of(self, record: RunRecord) -> Path:
        return self.phase_dir(record.phase) / f"{record.run_id}.json"

    def write(self, record: RunRecord) -> Path:
        """Store a new record atomically. Refuses to overwrite an existing run id."""
        path = self.path_of(record)
        if path.exists():
            raise Refusal(f"run {record.run_id} of {record.phase} already exists at {path}")
        atomic_write_text(path, record.model_dump_json(indent=2) + "\n")
        return path

    def rewrite(self, record: RunRecord) -> Path:
        """Replace an existing record atomically (a checkpoint filling in its commit)."""
        path = self.path_of(record)
        if not path.exists():
            raise Refusal(f"run {record.run_id} of {record.phase} has no record at {path} to update")
        atomic_write_text(path, record.model_dump_json(indent=2) + "\n")
        return path

    def records(self, phase: str) -> list[RunRecord]:
        """Every run of ``phase``, oldest first. A damaged record is an error naming its file."""
        folder = self.phase_dir(phase)
        if not folder.is_dir():
            return []
        out = []
        for path in sorted(folder.glob("*.json")):
            if not RUN_ID_RE.match(path.stem):
                continue
            try:
                record = RunRecord.model_validate(json.loads(path.read_text(encoding="utf-8")))
            except (ValueError, ValidationError) as exc:
                raise Refusal(f"run record {path} is damaged ({str(exc).splitlines()[0]}); "
                              "restore it from git or delete it") from None
            check_identity(record, path, phase)
            check_consistent(record, path)
            out.append(record)
        out.sort(key=lambda r: (r.started_at, r.run_id))
        return out

    def latest(self, phase: str, *, full: bool = True) -> Optional[RunRecord]:
        """The newest run (``full``: the newest that ran every gate; else any)."""
        recs = [r for r in self.records(phase) if not (full and r.partial)]
        return recs[-1] if recs else None
