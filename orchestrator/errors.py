"""Errors the CLI turns into messages and exit codes (never a traceback)."""

from __future__ import annotations

from typing import Optional


class Refusal(Exception):
    """The orchestrator will not do what was asked; the message says why and what to do. Exit 2."""

    exit_code = 2


class PlanLoadError(Refusal):
    """The plan or a phase module could not be loaded (bad spec, missing module, ...)."""


class RunInterrupted(Exception):
    """A run stopped by Ctrl-C (or SystemExit) before or inside a gate; nothing was recorded. Exit 130."""

    exit_code = 130

    def __init__(self, phase: str, gate: Optional[str]):
        where = f"during gate {gate!r}" if gate else "before its first gate"
        super().__init__(f"run of {phase} interrupted {where}; nothing was recorded, "
                         "the previous records and the plan are unchanged")
        self.phase, self.gate = phase, gate
