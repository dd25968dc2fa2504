"""Terminal output: the status listing, run history and the live progress of a run (rich)."""

from __future__ import annotations

from typing import Optional, Sequence

from kdtree.gates.base import GateResult, Outcome
from kdtree.gates.spec import PhaseSpec
from kdtree.orchestrator.evidence import skipped, why_not_deciding
from kdtree.orchestrator.specs import RunRecord, TargetResult
from kdtree.orchestrator.state import PhaseStatus
from kdtree.orchestrator.targets import target_text
from kdtree.orchestrator.views import key_figure_text, targets_view, when

STYLE = {"passed": "green", "failed": "red", "error": "bold red", "not-implemented": "red",
         "skipped": "yellow", "timeout": "bold red", "incomplete": "yellow", "stale": "magenta", "pending": "dim",
         "met": "green", "not met": "yellow", "not measured": "dim"}


def console(stderr: bool = False, keep_going: bool = False, file=None):
    """A rich console. When its reader goes away (``| head``), later output is discarded and a
    listing ends with BrokenPipeError (the CLI exits 141), or, with ``keep_going`` (a run's live
    display), the command goes on silently. Rich's own default would exit 1 ("not passed").
    ``file``: write there instead of the current stdout/stderr."""
    from rich.console import Console  # noqa: PLC0415

    from kdtree.orchestrator.terminal import silence_stdout  # noqa: PLC0415

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            if file is None:
                silence_stdout(err=stderr)
            self.quiet = True
            if not keep_going:
                raise BrokenPipeError("the output pipe was closed")

    return _Console(stderr=stderr, highlight=False, soft_wrap=True, file=file)


def _own_stdout():
    """A stream on a copy of stdout's file descriptor, made now: a gate's output, which is sent
    to the run's log while it runs (fd 1 included), never reaches it, and the live display
    never reaches the log. The current ``sys.stdout`` when it has no descriptor (a test runner)."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    try:
        fd = os.dup(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        return sys.stdout
    return os.fdopen(fd, "w", encoding=getattr(sys.stdout, "encoding", None) or "utf-8",
                     errors="replace", closefd=True)


def listing_console():
    """The console of the listings: rich's markup without importing rich (it starts fast)."""
    from kdtree.orchestrator.markup import MarkupConsole  # noqa: PLC0415

    return MarkupConsole()


def _styled(word: str, width: int = 0) -> str:
    from kdtree.orchestrator.markup import escape  # noqa: PLC0415 - rich's grammar, without rich

    style = STYLE.get(word, "")
    padded = escape(word.ljust(width))
    return f"[{style}]{padded}[/{style}]" if style else padded


def _esc(text: str) -> str:
    from kdtree.orchestrator.markup import escape  # noqa: PLC0415 - rich's grammar, without rich

    return escape(text)


def gate_row(result: GateResult, width: int) -> str:
    return f"    {_esc(result.gate.ljust(width))}  {_styled(result.outcome.value, 15)}  {_esc(key_figure_text(result))}"


def _target_rows(out, targets: list[TargetResult], gate: str) -> None:
    for t in targets:
        if t.gate == gate:
            style = STYLE[t.status]
            out.print(f"        [{style}]target[/{style}] {_esc(target_text(t))}")


def _gate_rows(out, rec: Optional[RunRecord], spec: PhaseSpec) -> None:
    width = max(len(g.name) for g in spec.gates)
    targets, evaluated_now = targets_view(rec, spec) if rec is not None else ([], False)
    if evaluated_now and targets:
        out.print("    [dim]targets evaluated now on this run's recorded figures (the run predates "
                  "stored targets)[/dim]")
    for g in spec.gates:
        res = rec.result(g.name) if rec else None
        if res is None:
            out.print(f"    {_esc(g.name.ljust(width))}  {_styled('pending', 15)}  [dim]not run[/dim]")
        else:
            out.print(gate_row(res, width))
        _target_rows(out, targets, g.name)


def run_summary(rec: RunRecord) -> str:
    """``failed 6/7, run 2026…-ef1881, 2026-12-03 05:21 UTC, commit 84f9b77db2+dirty`` (plain text)."""
    n_skipped = skipped(rec)
    gates = f"{rec.passed_count}/{len(rec.results)}" + (f" ({n_skipped} skipped)" if n_skipped else "")
    return f"{rec.state.value} {gates}, run {rec.run_id}, {when(rec)}, commit {rec.git.short}"


def _device_rows(out, st: PhaseStatus) -> None:
    if not st.by_device or st.record is None:
        return
    out.print("    [dim]latest full run per device:[/dim]")
    width = max(len(r.device.label) for r in st.by_device)
    for r in st.by_device:
        decides = r.run_id == st.record.run_id
        note = ("[bold]decides the state[/bold]" if decides
                else f"[dim]does not decide: {_esc(why_not_deciding(r, st.record))}[/dim]")
        out.print(f"      {_esc(r.device.label.ljust(width))}  {_esc(run_summary(r))}  {note}")


def print_status(statuses: list[PhaseStatus], plan_id: str, markdown: str) -> None:
    """The human `status` listing: one block per phase, one line per gate and target."""
    out = listing_console()
    out.print(f"[bold]plan {_esc(plan_id)}[/bold]  ({_esc(markdown)})")
    for st in statuses:
        spec, rec = st.phase.spec, st.record
        head = f"[bold]{_esc(st.phase.id)}[/bold] {_esc(spec.title)}  {_styled(st.state.value)}"
        if rec is not None:
            head += (f"  deciding run {_esc(when(rec))}  {_esc(rec.git.short)}  {_esc(rec.device.label)}"
                     + ("  [bold]forced[/bold]" if rec.forced else ""))
        out.print(head)
        if st.unreadable:
            out.print(f"    [bold red]unreadable:[/bold red] {_esc(st.unreadable)}")
        for reason in st.stale_reasons:
            out.print(f"    [magenta]stale:[/magenta] {_esc(reason)}")
        for note in st.not_deciding:
            out.print(f"    [yellow]ignored:[/yellow] {_esc(note)}")
        _gate_rows(out, rec, spec)
        _device_rows(out, st)
        if st.partial is not None:
            gates = ", ".join(f"{r.gate}={r.outcome.value}" for r in st.partial.results)
            out.print(f"    [dim]newer partial run {_esc(st.partial.run_id)} ({_esc(when(st.partial))}): "
                      f"{_esc(gates)}; the state above comes from the deciding full run[/dim]")


def print_history(phase: str, records: list[RunRecord], spec: Optional[PhaseSpec] = None) -> None:
    """`history PHASE`: every run, oldest first, with its gates' key figures and targets."""
    out = listing_console()
    if not records:
        out.print(f"{_esc(phase)}: no runs recorded")
        return
    for rec in records:
        flags = [w for w, on in (("partial", rec.partial), ("forced", rec.forced)) if on]
        out.print(f"[bold]{_esc(rec.run_id)}[/bold]  {_esc(when(rec))}  {_styled(rec.state.value)}"
                  f"  {_esc(rec.git.short)}  {_esc(rec.device.label)}"
                  + (f"  ({', '.join(flags)})" if flags else ""))
        width = max(len(r.gate) for r in rec.results) if rec.results else 0
        targets, _ = targets_view(rec, spec)
        for r in rec.results:
            out.print(gate_row(r, width))
            _target_rows(out, targets, r.gate)


class RichReporter:
    """The live display of a run: a spinner per gate, then one line with its outcome."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: PLC0415

        self._out = _own_stdout()
        self.console = console(keep_going=True, file=self._out)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=True,
                                 redirect_stdout=False, redirect_stderr=False)
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
        import sys  # noqa: PLC0415

        if self._out is not sys.stdout:
            try:
                self._out.close()
            except OSError:  # its reader went away: nothing left to say to it
                pass
