"""Terminal output: the status listing, run history and the live progress of a run (rich)."""

from __future__ import annotations

from typing import Optional, Sequence

from kdtree.gates.base import GateResult, Outcome
from kdtree.orchestrator.specs import RunRecord
from kdtree.orchestrator.state import PhaseStatus
from kdtree.orchestrator.views import key_figure_text, when

STYLE = {"passed": "green", "failed": "red", "error": "bold red", "not-implemented": "red",
         "skipped": "yellow", "incomplete": "yellow", "stale": "magenta", "pending": "dim"}


def console(stderr: bool = False):
    from rich.console import Console  # noqa: PLC0415

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _styled(word: str, width: int = 0) -> str:
    from rich.markup import escape  # noqa: PLC0415

    style = STYLE.get(word, "")
    padded = escape(word.ljust(width))
    return f"[{style}]{padded}[/{style}]" if style else padded


def _esc(text: str) -> str:
    from rich.markup import escape  # noqa: PLC0415

    return escape(text)


def gate_row(result: GateResult, width: int) -> str:
    return f"    {_esc(result.gate.ljust(width))}  {_styled(result.outcome.value, 15)}  {_esc(key_figure_text(result))}"


def print_status(statuses: list[PhaseStatus], plan_id: str, markdown: str) -> None:
    """The human `status` listing: one block per phase, one line per gate."""
    out = console()
    out.print(f"[bold]plan {_esc(plan_id)}[/bold]  ({_esc(markdown)})")
    for st in statuses:
        spec, rec = st.phase.spec, st.record
        head = f"[bold]{_esc(st.phase.id)}[/bold] {_esc(spec.title)}  {_styled(st.state.value)}"
        if rec is not None:
            head += (f"  last run {_esc(when(rec))}  {_esc(rec.git.short)}  {_esc(rec.device.label)}"
                     + ("  [bold]forced[/bold]" if rec.forced else ""))
        out.print(head)
        for reason in st.stale_reasons:
            out.print(f"    [magenta]stale:[/magenta] {_esc(reason)}")
        width = max(len(g.name) for g in spec.gates)
        for g in spec.gates:
            res = rec.result(g.name) if rec else None
            if res is None:
                out.print(f"    {_esc(g.name.ljust(width))}  {_styled('pending', 15)}  [dim]not run[/dim]")
            else:
                out.print(gate_row(res, width))
        if st.partial is not None:
            gates = ", ".join(f"{r.gate}={r.outcome.value}" for r in st.partial.results)
            out.print(f"    [dim]newer partial run {_esc(st.partial.run_id)} ({_esc(when(st.partial))}): "
                      f"{_esc(gates)}; the state above comes from the latest full run[/dim]")


def print_history(phase: str, records: list[RunRecord]) -> None:
    """`history PHASE`: every run, oldest first, with its gates' key figures."""
    out = console()
    if not records:
        out.print(f"{_esc(phase)}: no runs recorded")
        return
    for rec in records:
        flags = [w for w, on in (("partial", rec.partial), ("forced", rec.forced)) if on]
        out.print(f"[bold]{_esc(rec.run_id)}[/bold]  {_esc(when(rec))}  {_styled(rec.state.value)}"
                  f"  {_esc(rec.git.short)}  {_esc(rec.device.label)}"
                  + (f"  ({', '.join(flags)})" if flags else ""))
        width = max(len(r.gate) for r in rec.results) if rec.results else 0
        for r in rec.results:
            out.print(gate_row(r, width))


class RichReporter:
    """The live display of a run: a spinner per gate, then one line with its outcome."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: PLC0415

        self.console = console()
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=True)
        self.task: Optional[int] = None
        self.width = 0

    def phase_started(self, phase: str, gates: Sequence[str]) -> None:
        self.width = max((len(g) for g in gates), default=0)
        self.console.print(f"[bold]running {_esc(phase)}[/bold]: {len(gates)} gate(s)")
        self.progress.start()

    def gate_started(self, gate: str) -> None:
        self.task = self.progress.add_task(_esc(gate), total=None)

    def gate_progress(self, gate: str, message: str, fraction: Optional[float]) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=_esc(f"{gate}: {message}"),
                                 total=1.0 if fraction is not None else None,
                                 completed=fraction or 0.0)

    def gate_finished(self, result: GateResult) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None
        self.progress.console.print(gate_row(result, self.width)
                                    + (f"  [dim]({result.duration_s:.1f} s)[/dim]"
                                       if result.outcome is not Outcome.SKIPPED else ""))

    def close(self) -> None:
        self.progress.stop()
