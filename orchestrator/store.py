"""The result store: one JSON file per run under ``<results_dir>/<phase>/<run_id>.json``.

Records are written atomically and never edited (a checkpoint may fill in a record's commit,
see `kdtree.orchestrator.provenance`); history is every file. "Latest" is derived by sorting the
records by `RunRecord.order`: each new record takes the next number of a per-repository sequence
(one more than the highest any phase's record holds), so a clock that ran ahead on some host
cannot make its record outrank later runs; records written before the sequence existed order by
time, before every record that has one. A record whose start time is in the future is loaded
with a warning. No pointer can go out of sync. Other files in a phase's folder (plots, logs,
tables written by gates) are ignored.

A record names its phase and run id, and they must be its folder and its file name: a record
copied into another phase's folder, or under another name (so that it would count twice), is an
error naming the file. A record's state must be what its gates' outcomes amount to, and each
gate's outcome what its figures and thresholds say (`kdtree.orchestrator.verdicts`): a record
edited by hand is damaged. A record written by a newer orchestrate (a higher ``schema_version``)
is `NewerRecord`, which names the upgrade.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Optional

from pydantic import ValidationError

from kdtree.orchestrator.errors import Refusal
from kdtree.fsutil import atomic_write_text
from kdtree.orchestrator.specs import SCHEMA_VERSION, RunRecord, state_of
from kdtree.orchestrator.verdicts import outcome_problem

RUN_ID_RE = re.compile(r"^\d{8}T\d{12}Z-[0-9a-f]{6}$")
FUTURE_SLACK = timedelta(minutes=5)  # clocks of two machines may differ this much unnoticed


class NewerRecord(Refusal):
    """A record written by a newer orchestrate than this one (its schema is unknown here)."""


def _warn_stderr(message: str) -> None:
    from kdtree.orchestrator.terminal import warn_once  # noqa: PLC0415

    warn_once(message)


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
    """Refuse a record whose state is not what its gates' outcomes amount to, or a gate whose
    outcome is not what its figures and thresholds say (edited by hand)."""
    for result in record.results:
        problem = outcome_problem(result, record.spec)
        if problem:
            raise Refusal(f"run record {path} is damaged: {problem}; restore it from git or delete it")
    implied = state_of(record.results)
    if record.state is not implied:
        outcomes = ", ".join(f"{r.gate}={r.outcome.value}" for r in record.results) or "no gates"
        raise Refusal(f"run record {path} is damaged: its state is {record.state.value!r} but its "
                      f"gates ({outcomes}) amount to {implied.value!r}; restore it from git or "
                      "delete it")


class ResultStore:
    """Read and write run records of a plan's phases."""

    def __init__(self, results_dir: Path, warn: Callable[[str], None] = _warn_stderr):
        self.dir = results_dir
        self.warn = warn

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
            record = load_record(path)
            check_identity(record, path, phase)
            check_consistent(record, path)
            if record.started_at > datetime.now(timezone.utc) + FUTURE_SLACK:
                self.warn(f"run record {path} starts in the future ({record.started_at:%Y-%m-%d %H:%M} "
                          "UTC): the clock of the machine that wrote it was ahead. Runs are ordered "
                          "by their sequence number, not by time, so it does not outrank later runs")
            out.append(record)
        out.sort(key=lambda r: r.order)
        return out

    def next_seq(self) -> int:
        """The sequence number of the next record: one more than the highest of any phase's."""
        highest = 0
        if self.dir.is_dir():
            for path in self.dir.glob("*/*.json"):
                if not RUN_ID_RE.match(path.stem):
                    continue
                try:
                    seq = json.loads(path.read_text(encoding="utf-8")).get("seq")
                except (OSError, ValueError, AttributeError):
                    continue
                if isinstance(seq, int) and seq > highest:
                    highest = seq
        return highest + 1

    def latest(self, phase: str, *, full: bool = True) -> Optional[RunRecord]:
        """The newest run (``full``: the newest that ran every gate; else any)."""
        recs = [r for r in self.records(phase) if not (full and r.partial)]
        return recs[-1] if recs else None


def load_record(path: Path) -> RunRecord:
    """One record file; a damaged record, or one written by a newer orchestrate, is a Refusal."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Refusal(f"run record {path} is damaged ({str(exc).splitlines()[0]}); "
                      "restore it from git or delete it") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if isinstance(version, int) and version > SCHEMA_VERSION:
        from kdtree import __version__  # noqa: PLC0415

        raise NewerRecord(f"run record {path} was written by a newer orchestrate (schema {version}; "
                          f"this orchestrate, kdtree-engine {__version__}, reads up to schema "
                          f"{SCHEMA_VERSION}); upgrade orchestrate (`pip install -U kdtree-engine`, "
                          "or pull and reinstall this repository) to use this phase. The other "
                          "phases are unaffected")
    try:
        return RunRecord.model_validate(data)
    except ValidationError as exc:
        raise Refusal(f"run record {path} is damaged ({str(exc).splitlines()[0]}: "
                      f"{_first_error(exc)}); restore it from git or delete it") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err.get('msg', '')}"
