"""A measurement is never lost: check the files a run writes before its gates, rescue after.

`require_writable` runs before any gate: the phase's results folder must take a new file (a
probe of `PROBE_BYTES` is written, synced and removed, so a full disk shows too) and the plan
markdown must be replaceable (its folder takes a new file, the file itself opens for writing,
which an immutable file refuses). Otherwise the run is refused (exit 2) with the reason.

`write_record` stores the record; if that still fails once the gates ran (the disk filled up,
the folder was made read-only meanwhile), the record is written to a fallback folder
(`rescue_dirs`: ``$ORCHESTRATE_RESCUE_DIR``, ``$XDG_STATE_HOME/orchestrate/rescued``,
``~/.local/state/orchestrate/rescued``, the temp folder) and `RecordNotWritten` (exit 4) says
where it is and how to bring it back; if no folder takes it, the record is in the message.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

from kdtree.orchestrator.errors import Refusal
from kdtree.fsutil import atomic_write_text
from kdtree.orchestrator.plan import Plan
from kdtree.orchestrator.specs import RunRecord
from kdtree.orchestrator.store import ResultStore

PROBE_BYTES = 64 * 1024
EXIT_NOT_WRITTEN = 4


class RecordNotWritten(Exception):
    """The gates ran but the record could not be stored in the results folder. Exit 4."""

    exit_code = EXIT_NOT_WRITTEN


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def probe_folder(folder: Path) -> Optional[str]:
    """Why ``folder`` cannot take a new file (None: it can); creates it if missing."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".orchestrate-probe.", suffix=".tmp")
    except OSError as exc:
        return _why(exc)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(b"\0" * PROBE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        return _why(exc)
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return None


def probe_file(path: Path) -> Optional[str]:
    """Why the existing file ``path`` cannot be rewritten in place (None: it can)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        return _why(exc)
    os.close(fd)
    return None


def require_writable(plan: Plan, phase_id: str) -> None:
    """Refuse (exit 2) unless the phase's record and the plan markdown can be written."""
    folder = plan.results_path / phase_id
    why = probe_folder(folder)
    if why:
        raise Refusal(f"the results folder {folder} cannot be written ({why}), so this run's record "
                      "could not be stored; make it writable (or free space), or set `results_dir` "
                      "in [tool.orchestrate]. No gate was run")
    md = Path(os.path.realpath(plan.markdown_path))
    why = probe_folder(md.parent) or probe_file(md)
    if why:
        raise Refusal(f"the plan markdown {md} cannot be rewritten ({why}); make it and its folder "
                      "writable, then run again. No gate was run")


def rescue_dirs() -> list[Path]:
    """Where a record goes when the results folder refuses it, in order of preference."""
    dirs = []
    if os.environ.get("ORCHESTRATE_RESCUE_DIR"):
        dirs.append(Path(os.environ["ORCHESTRATE_RESCUE_DIR"]))
    if os.environ.get("XDG_STATE_HOME"):
        dirs.append(Path(os.environ["XDG_STATE_HOME"]) / "orchestrate" / "rescued")
    if os.environ.get("HOME"):
        dirs.append(Path(os.environ["HOME"]) / ".local" / "state" / "orchestrate" / "rescued")
    dirs.append(Path(tempfile.gettempdir()) / f"orchestrate-rescued-{os.getuid()}")
    return dirs


def write_record(plan: Plan, store: ResultStore, record: RunRecord) -> Path:
    """Store ``record``; on failure rescue it (see module docstring) and raise `RecordNotWritten`."""
    try:
        return store.write(record)
    except OSError as exc:
        error = f"{store.path_of(record)}: {_why(exc)}"
    except Exception as exc:  # noqa: BLE001 - the gates ran: any failure here rescues the record
        error = f"{store.path_of(record)}: {type(exc).__name__}: {exc}"
    text = record.model_dump_json(indent=2) + "\n"
    head = (f"run {record.run_id} of {record.phase} ran its gates ({record.state.value}, "
            f"{record.passed_count}/{len(record.results)} passed) but its record could not be written "
            f"({error}).")
    _rescue(store.phase_dir(record.phase), record.phase, record.run_id, text, head,
            "render the plan with `orchestrate plan`")


def rescue_results(plan: Plan, phase: str, run_id: str, results: list, exc: BaseException) -> None:
    """The gates ran but no record could be built from what they returned: save their results
    (as JSON, anything unknown as text) with the error, and raise `RecordNotWritten`."""
    import json  # noqa: PLC0415

    data = {"phase": phase, "run_id": run_id, "error": f"{type(exc).__name__}: {exc}",
            "results": [r.model_dump(mode="python") for r in results]}
    text = json.dumps(data, indent=2, default=repr) + "\n"
    head = (f"run {run_id} of {phase} ran its gates, but no record could be made of what they "
            f"returned ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}).")
    _rescue(None, phase, run_id, text, head,
            "it is not a run record; fix the check so that it returns JSON-able figures and details, "
            "and run again")


def _rescue(home: Optional[Path], phase: str, run_id: str, text: str, head: str, then: str) -> None:
    for folder in rescue_dirs():
        target = folder / phase / f"{run_id}.json"
        try:
            atomic_write_text(target, text)
        except OSError:
            continue
        if home is not None:
            raise RecordNotWritten(
                f"{head} The record is saved at {target}. Once the results folder is writable, bring "
                f"it back with `mkdir -p {home} && mv {target} {home}/` and {then}")
        raise RecordNotWritten(f"{head} What the gates returned is saved at {target}; {then}")
    where = f" Save it as {home}/{run_id}.json" if home is not None else ""
    raise RecordNotWritten(f"{head} No fallback folder took it either ({', '.join(map(str, rescue_dirs()))}); "
                           f"it follows.{where}:\n{text}")
