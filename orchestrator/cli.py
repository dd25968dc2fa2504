"""``orchestrate``: run a plan's phases through their gates, record runs, render the plan, checkpoint.

Every command works on the git repository holding the current directory (or ``--repo ROOT``).
Exit codes: see `EXIT_CODES` (also in ``orchestrate --help``). A closed output pipe
(``orchestrate ... | head``) never gives a traceback: ``run`` keeps going with its output
discarded (the run is still recorded and the plan rendered; what the gates print goes to the
run's log file, never to this output); a listing that cannot be written ends with 141.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import click

from kdtree.cli_support import common_options
from kdtree.orchestrator.errors import Refusal, RunInterrupted
from kdtree.orchestrator.terminal import silence_stdout

EXIT_NOT_PASSED, EXIT_REFUSED, EXIT_INCOMPLETE, EXIT_NOT_WRITTEN, EXIT_INTERRUPTED, EXIT_PIPE = 1, 2, 3, 4, 130, 141

EXIT_CODES = """\b
Exit codes:
  0    passed / done
  1    a phase ran and did not pass (failed, error), or `plan --check`
       found the plan out of date
  2    refused: usage, plan order, stale run, bad spec, foreign sources, ...
       (the message says what to do); nothing was run
  3    a phase ran and is incomplete (gates skipped, e.g. no GPU here)
  4    a phase ran but its record could not be built or written to the
       results folder (disk full, read-only, a check's figures JSON cannot
       hold); it was saved elsewhere and the message says where
  130  interrupted (Ctrl-C); nothing was recorded or committed
  141  the output pipe was closed (e.g. `orchestrate history phase1 | head`)"""


class Ctx:
    """The repository and plan a command works on, loaded on first use."""

    def __init__(self, repo: Optional[str]):
        self.repo_arg = repo
        self._plan = None

    @property
    def plan(self):
        if self._plan is None:
            from kdtree.orchestrator.plan import load_plan  # noqa: PLC0415
            from kdtree.orchestrator.repo import resolve_root  # noqa: PLC0415

            root = resolve_root(self.repo_arg)
            self._plan = load_plan(root.path, root.is_git)
        return self._plan

    def lock(self, wait: Optional[float] = None):
        from kdtree.orchestrator.lock import RunLock, lock_path  # noqa: PLC0415

        plan = self.plan
        return RunLock(lock_path(plan.root, plan.results_path, plan.is_git), warn=lambda m: say(m, err=True),
                       wait=wait)


def wait_options(func):
    """``--wait SECONDS`` / ``--no-wait``: how long to wait for another orchestrate's run lock."""
    func = click.option("--no-wait", is_flag=True,
                        help="Refuse at once (exit 2) if another orchestrate holds the run lock.")(func)
    return click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
                        help="Wait at most this long for another orchestrate's run lock "
                             "(default: as long as it takes; the holder is named).")(func)


def _wait_of(wait_s: Optional[float], no_wait: bool) -> Optional[float]:
    if no_wait and wait_s is not None:
        raise Refusal("give --wait SECONDS or --no-wait, not both")
    return 0.0 if no_wait else wait_s


def say(message: str = "", err: bool = False) -> None:
    """``click.echo`` that survives a closed pipe: later output goes nowhere, the command goes on."""
    try:
        click.echo(message, err=err)
    except BrokenPipeError:
        silence_stdout(err=err)


class _Group(click.Group):
    """Turns refusals, Ctrl-C and a closed output pipe into a message on stderr and an exit code."""

    def invoke(self, ctx: click.Context):
        from kdtree.orchestrator.git import CommitInterrupted  # noqa: PLC0415
        from kdtree.orchestrator.preflight import RecordNotWritten  # noqa: PLC0415

        try:
            return super().invoke(ctx)
        except (Refusal, RunInterrupted, RecordNotWritten, CommitInterrupted) as exc:
            say(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            say("error: interrupted (Ctrl-C)", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            silence_stdout()
            ctx.exit(EXIT_PIPE)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.option("--repo", metavar="FOLDER", default=None,
              help="Work on the project in FOLDER (one whose pyproject.toml has [tool.orchestrate], "
                   "a repository root, or a copied tree outside any repository) instead of the one "
                   "found from the current directory.")
@common_options
@click.pass_context
def cli(ctx: click.Context, repo: Optional[str]) -> None:
    """Plan-driven phases with gated validation (see `orchestrate COMMAND --help`).

    The plan is the one named by [tool.orchestrate] in the nearest pyproject.toml between the
    current folder and the git repository's root (`orchestrate init` scaffolds one).
    """
    ctx.obj = Ctx(repo)


@cli.command()
@click.option("--id", "plan_id", default="", help="The plan's id (default: the folder's name).")
@click.option("--title", default="", help="The plan's title.")
@click.option("--package", default="phases", show_default=True,
              help="The folder (a Python package) that holds the phase modules.")
@click.option("--phase", default="example", show_default=True, help="The first phase's id and module name.")
@click.pass_obj
def init(obj: Ctx, plan_id: str, title: str, package: str, phase: str) -> None:
    """Scaffold a plan in this folder (or --repo FOLDER): [tool.orchestrate], a plan markdown
    with its blocks, and one phase module with a metric gate, ready to `orchestrate run`."""
    from pathlib import Path  # noqa: PLC0415

    from kdtree.orchestrator.scaffold import init_project  # noqa: PLC0415

    folder = Path(obj.repo_arg).expanduser() if obj.repo_arg else Path.cwd()
    if not folder.is_dir():
        raise Refusal(f"--repo {obj.repo_arg}: no such directory")
    from kdtree.orchestrator.repo import find_git_root  # noqa: PLC0415

    done = init_project(folder.resolve(), plan_id, title, package, phase)
    for rel in done.written:
        say(f"wrote {rel}")
    run_here = "`orchestrate run`" if obj.repo_arg is None else f"`orchestrate --repo {obj.repo_arg} run`"
    if find_git_root(folder) is None:
        say(f"plan {done.plan_id} is ready. Next: {run_here} (runs {phase}) and `orchestrate status`. "
            "This folder is not in a git repository: runs record no commit and checkpoints need "
            "one, so `git init`, commit, then `orchestrate checkpoint --commit`; "
            "docs/orchestrator-guide.md explains each part")
        return
    say(f"plan {done.plan_id} is ready. Next: {run_here} (runs {phase}), `orchestrate status`, "
        "then commit and `orchestrate checkpoint --commit`; docs/orchestrator-guide.md explains each part")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the same for machines.")
@click.pass_obj
def status(obj: Ctx, as_json: bool) -> None:
    """The plan's phases in order: state, last run, commit, device and each gate's key figure."""
    from kdtree.orchestrator.state import plan_status  # noqa: PLC0415

    plan = obj.plan
    _warn_foreign_sources(plan)
    statuses = plan_status(plan)
    if as_json:
        from kdtree.orchestrator.evidence import skipped  # noqa: PLC0415
        from kdtree.orchestrator.views import run_json  # noqa: PLC0415

        click.echo(json.dumps({
            "plan": plan.spec.id, "repo": str(plan.root), "markdown": plan.spec.markdown,
            "phases": [{
                "id": st.phase.id, "title": st.phase.spec.title, "state": st.state.value,
                "passed_and_fresh": st.passed_and_fresh, "stale_reasons": st.stale_reasons,
                "spec_hash": st.spec_hash, "inputs_hash": st.inputs_hash,
                "gates": [g.name for g in st.phase.spec.gates],
                "last_run": run_json(st.record, st.phase.spec),
                "newest_full_run": run_json(st.newest, st.phase.spec),
                "latest_by_device": [{"device": r.device.label, "run_id": r.run_id,
                                      "state": r.state.value, "skipped": skipped(r),
                                      "decides": st.record is not None and r.run_id == st.record.run_id}
                                     for r in st.by_device],
                "newer_partial_run": run_json(st.partial, st.phase.spec),
                "not_deciding": st.not_deciding,
                "unreadable": st.unreadable or None,
            } for st in statuses]}, indent=2))
        return
    from kdtree.orchestrator.display import print_status  # noqa: PLC0415

    print_status(statuses, plan.spec.id, plan.spec.markdown)


def _exit_code_of(state) -> int:
    from kdtree.orchestrator.specs import PhaseState  # noqa: PLC0415

    return {PhaseState.PASSED: 0, PhaseState.INCOMPLETE: EXIT_INCOMPLETE}.get(state, EXIT_NOT_PASSED)


def _warn_foreign_sources(plan) -> None:
    from kdtree.orchestrator.sources import foreign_sources  # noqa: PLC0415

    problems = foreign_sources(plan.root, [p.module for p in plan.phases])
    if problems:  # one line: a non-editable install makes every declared package foreign at once
        more = f" (and {len(problems) - 1} more packages like it)" if len(problems) > 1 else ""
        say(f"warning: {problems[0]}{more}; `run` and `checkpoint` refuse until then", err=True)


def _check_plan_markdown(plan) -> None:
    """Refuse before any gate runs if the plan markdown is missing or its blocks are damaged."""
    from kdtree.orchestrator.markers import check_names, find_blocks  # noqa: PLC0415
    from kdtree.orchestrator.render import block_names  # noqa: PLC0415
    from kdtree.orchestrator.textfile import read_text  # noqa: PLC0415

    what = f"the plan markdown {plan.spec.markdown} (`markdown` in [tool.orchestrate] of pyproject.toml)"
    if not plan.markdown_path.exists() and not plan.markdown_path.is_dir():
        blocks = ", ".join(block_names(plan))
        raise Refusal(f"{what} does not exist in {plan.root}; fix the path, or create the file with "
                      f"the blocks {blocks} (`<!-- orchestrate:begin NAME -->` / "
                      "`<!-- orchestrate:end NAME -->`). No gate was run")
    found = find_blocks(read_text(plan.markdown_path, what), plan.spec.markdown)
    check_names(found, block_names(plan), plan.spec.markdown)


def _render_after_run(plan, record) -> None:
    """Re-render the plan after a recorded run; a failure is a warning (the run is recorded)."""
    from kdtree.orchestrator.render import write_plan  # noqa: PLC0415

    later = f"fix it, then render the plan with `orchestrate plan`"
    try:
        changed = write_plan(plan)
    except Refusal as exc:
        say(f"warning: run {record.run_id} was recorded, but the plan was not rendered: {exc}; {later}",
            err=True)
        return
    except OSError as exc:
        say(f"warning: run {record.run_id} was recorded, but the plan {plan.spec.markdown} could not "
            f"be written ({exc.strerror or exc}); {later}", err=True)
        return
    except Exception as exc:  # noqa: BLE001 - the run is recorded; rendering is a separate step
        say(f"warning: run {record.run_id} was recorded, but rendering the plan failed "
            f"({type(exc).__name__}: {exc}); {later}", err=True)
        return
    if changed:
        say(f"rendered {plan.spec.markdown}")


def _print_checkpoint(res) -> None:
    if res.filled_commit:
        say(f"run {res.run_id}: filled in commit {res.filled_commit[:12]}, whose tree holds the "
            "inputs it ran")
    if res.plan_changed:
        say("rendered the plan markdown")
    for line in res.changelog_lines:
        say(f"changelog: {line.rstrip()}")
    if res.nothing_to_commit:
        say("nothing to commit: the working tree matches HEAD")
    elif res.commit_sha:
        say(f"committed {res.commit_sha[:12]}: {res.message.splitlines()[0]}"
            + (" (HEAD is detached: the commit is on no branch)" if res.detached else ""))
        for row in res.files:
            say(f"  {row}")
    if res.left_out:
        say("not committed (untracked): " + ", ".join(res.left_out))
        if any(_is_record(p) for p in res.left_out):
            say("  pass --include-records to add the run records among them, or --include-untracked "
                "to add every untracked file listed")
        else:
            say("  pass --include-untracked to add them")


def _is_record(path: str) -> bool:
    from kdtree.orchestrator.store import RUN_ID_RE  # noqa: PLC0415

    stem, _, ext = path.rpartition("/")[2].rpartition(".")
    return ext in ("json", "log") and bool(RUN_ID_RE.match(stem))


@cli.command()
@click.argument("phase", required=False)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where the gates run; CUDA gates are skipped (phase incomplete) on cpu.")
@click.option("--gate", "gates", multiple=True, metavar="NAME",
              help="Run only this gate (repeatable). The run is recorded as partial and does not decide the phase's state.")
@click.option("--commit", is_flag=True, help="Make a checkpoint commit after the run.")
@click.option("--force", is_flag=True, help="Run even though an earlier phase is not passed-and-fresh (the run records what it overrode).")
@click.option("--gate-timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Stop a gate after this long (recorded as a timeout), unless its spec sets "
                   "time_limit_s; default: gate_timeout_s in [tool.orchestrate], else no limit.")
@wait_options
@click.pass_obj
def run(obj: Ctx, phase: Optional[str], device: str, gates: tuple[str, ...], commit: bool, force: bool,
        gate_timeout: Optional[float], wait_s: Optional[float], no_wait: bool) -> None:
    """Run PHASE's gates, record the run and re-render the plan.

    Without PHASE: run from the first phase that is not passed-and-fresh, in order, stopping at
    the first that does not pass. Gates run in the project root; what they print goes to the
    run's log file (named in the record), not to this command's output.
    """
    from kdtree.orchestrator.display import RichReporter  # noqa: PLC0415
    from kdtree.orchestrator.runner import run_phase  # noqa: PLC0415
    from kdtree.orchestrator.state import plan_status  # noqa: PLC0415

    if phase is None and (gates or force):
        raise Refusal("--gate and --force need a PHASE (e.g. `orchestrate run phase1 --gate build`)")
    if commit and gates:
        raise Refusal("--commit needs a full run: a checkpoint reports the phase's latest full run; "
                      "drop --gate, or run `orchestrate checkpoint --commit` later")
    wait = _wait_of(wait_s, no_wait)
    plan = obj.plan
    _check_plan_markdown(plan)
    with obj.lock(wait):
        if phase is not None:
            plan.phase(phase)
            todo = [phase]
        else:
            statuses = plan_status(plan)
            todo = [st.phase.id for st in statuses]
            first = next((i for i, st in enumerate(statuses) if not st.passed_and_fresh), None)
            if first is None:
                say("every phase is passed and fresh; nothing to run")
                return
            todo = todo[first:]
        code = 0
        for phase_id in todo:
            reporter = RichReporter()
            try:
                record = run_phase(plan, phase_id, device=device, gates=gates, force=force,
                                   reporter=reporter, gate_timeout=gate_timeout,
                                   warn=lambda m: say(f"warning: {m}", err=True))
            finally:
                reporter.close()
            what = "partial run" if record.partial else "run"
            say(f"{phase_id}: {record.state.value} ({record.passed_count}/{len(record.results)} "
                f"gates passed); {what} {record.run_id} recorded"
                + (f", forced past {', '.join(record.forced_over)}" if record.forced else "")
                + (f"; gate output in {record.log}" if record.log else ""))
            if record.inputs_changed_during_run:
                from kdtree.orchestrator.evidence import changed_during_run  # noqa: PLC0415

                say(f"warning: {phase_id}: {changed_during_run(record)}; the run names no commit and "
                    "does not decide the phase's state", err=True)
            _render_after_run(plan, record)
            if commit:
                from kdtree.orchestrator.checkpoint import checkpoint  # noqa: PLC0415

                _print_checkpoint(checkpoint(plan, phase_id, commit=True))
            code = _exit_code_of(record.state)
            if code != 0 and not record.partial:
                if phase is None and phase_id != todo[-1]:
                    say(f"stopping: {phase_id} did not pass")
                break
    sys.exit(code)


@cli.command()
@click.option("--phase", default=None, help="The phase whose latest full run to report (default: the one run last).")
@click.option("--commit", is_flag=True, help="Commit the working tree with the gate summary and trailers.")
@click.option("-m", "--message", default=None, help="A paragraph to add below the generated subject.")
@click.option("--include-untracked", is_flag=True,
              help="Also commit untracked files (listed otherwise; untracked inputs of the run are refused without it).")
@click.option("--include-records", is_flag=True,
              help="Also commit the untracked run records (and gate logs) of other phases, nothing else.")
@click.option("--allow-incomplete", is_flag=True,
              help="Checkpoint a run that skipped gates although a complete run of the same inputs exists.")
@wait_options
@click.pass_obj
def checkpoint(obj: Ctx, phase: Optional[str], commit: bool, message: Optional[str],
               include_untracked: bool, include_records: bool, allow_incomplete: bool,
               wait_s: Optional[float], no_wait: bool) -> None:
    """Re-render the plan, add CHANGELOG entries for newly passed phases, optionally commit.

    The commit holds the plan, the run records, the changelog and the phase's changed input
    files, nothing else: other modified tracked files are refused, untracked files are listed
    and added only with --include-untracked.
    """
    from kdtree.orchestrator.checkpoint import checkpoint as do_checkpoint  # noqa: PLC0415

    wait = _wait_of(wait_s, no_wait)
    plan = obj.plan
    with obj.lock(wait):
        res = do_checkpoint(plan, phase, commit=commit, note=message, include_untracked=include_untracked,
                            allow_incomplete=allow_incomplete, include_records=include_records)
    _print_checkpoint(res)
    if not commit:
        say(f"checkpoint of {res.phase} (run {res.run_id}) prepared; pass --commit to commit it")


@cli.command()
@click.argument("phase")
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
@click.pass_obj
def history(obj: Ctx, phase: str, as_json: bool) -> None:
    """PHASE's runs over time, oldest first, with their figures."""
    from kdtree.orchestrator.store import ResultStore  # noqa: PLC0415

    plan = obj.plan
    spec = plan.phase(phase).spec
    records = ResultStore(plan.results_path).records(phase)
    if as_json:
        from kdtree.orchestrator.views import run_json  # noqa: PLC0415

        click.echo(json.dumps([run_json(r, spec) for r in records], indent=2))
        return
    from kdtree.orchestrator.display import print_history  # noqa: PLC0415

    print_history(phase, records, spec)


@cli.command()
@click.argument("phase")
@click.argument("gate")
@click.option("--run", "run_id", default=None, metavar="RUN_ID",
              help="Take the seeds GATE drew in this recorded run (a unique prefix is enough).")
@click.option("--seed", "seeds", multiple=True, type=int, help="A seed to hand out, in order (repeatable).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the gate's result as JSON.")
@click.pass_obj
def replay(obj: Ctx, phase: str, gate: str, run_id: Optional[str], seeds: tuple[int, ...], device: str,
           as_json: bool) -> None:
    """Run one GATE of PHASE again with a recorded run's seeds (same inputs), recording nothing.

    For telling a defect from bad luck: the gate sees the prompts, trees and tensors of that run's
    trial. A replay never decides a phase's state. Exit 0 when the gate passes, 1 when not.
    """
    from kdtree.orchestrator.replay import recorded_seeds, replay_gate, replay_note  # noqa: PLC0415

    if (run_id is None) == (not seeds):
        raise Refusal("give the seeds with --run RUN_ID (a recorded run's) or with --seed N ..., one of the two")
    plan = obj.plan
    chosen = recorded_seeds(plan, phase, gate, run_id) if run_id else list(seeds)
    say(f"replaying {phase}/{gate} with {len(chosen)} seed(s): {', '.join(map(str, chosen[:8]))}"
        + (" ..." if len(chosen) > 8 else ""), err=True)
    result = replay_gate(plan, phase, gate, chosen, device=device,
                         progress=lambda msg, frac=None: say(f"  {msg}", err=True))
    note = replay_note(result, chosen)
    if note:
        say(f"warning: {note}", err=True)
    if as_json:
        say(result.model_dump_json(indent=2))
    else:
        say(f"{phase}/{gate}: {result.outcome.value} (replay, not recorded): {result.summary}")
        for fig in result.figures:
            say(f"  {fig.render()}")
    sys.exit(0 if result.passed else EXIT_NOT_PASSED)


@cli.command()
@click.option("--check", is_flag=True, help="Exit 1 if the plan markdown is out of date with the recorded runs (CI).")
@wait_options
@click.pass_obj
def plan(obj: Ctx, check: bool, wait_s: Optional[float], no_wait: bool) -> None:
    """Re-render the plan markdown's orchestrator blocks from the recorded runs."""
    from kdtree.orchestrator.markers import find_blocks, split_lines  # noqa: PLC0415
    from kdtree.orchestrator.render import rendered_plan, write_plan  # noqa: PLC0415

    p = obj.plan
    if check:
        current, new = rendered_plan(p)
        if current == new:
            say(f"{p.spec.markdown} is up to date")
            return
        old_lines, new_lines = split_lines(current), split_lines(new)
        old_b = {b.name: old_lines[b.begin:b.end] for b in find_blocks(current)}
        new_b = {b.name: new_lines[b.begin:b.end] for b in find_blocks(new)}
        stale = [n for n in new_b if old_b.get(n) != new_b[n]]
        say(f"{p.spec.markdown} is out of date with the recorded runs (blocks: {', '.join(stale)}); "
            "run `orchestrate plan` to re-render it", err=True)
        sys.exit(EXIT_NOT_PASSED)
    with obj.lock(_wait_of(wait_s, no_wait)):
        changed = write_plan(p)
    say(f"rendered {p.spec.markdown}" if changed else f"{p.spec.markdown} is up to date")


@cli.command()
@click.option("--out", "out", default=None, metavar="FILE",
              help="Write the page here (default: report.html in the results folder).")
@click.pass_obj
def report(obj: Ctx, out: Optional[str]) -> None:
    """Write the plan as one self-contained HTML page: phases, gates, figures against thresholds
    and targets, and a chart of each key figure and target across the recorded runs."""
    from pathlib import Path  # noqa: PLC0415

    from kdtree.orchestrator.report import shown_path, write_report  # noqa: PLC0415

    path, page = write_report(obj.plan, Path(out).expanduser() if out else None)
    say(f"wrote {shown_path(path)}: {len(page.phases)} phase(s), {page.charts} chart(s)")


def _reopen_closed_streams() -> None:
    """A stream closed by the shell (``orchestrate status >&-``) is None in Python: write to
    /dev/null instead, so the command still does its work and exits with its own code."""
    import os  # noqa: PLC0415

    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point (``orchestrate``, ``python -m kdtree.orchestrator``)."""
    _reopen_closed_streams()
    try:
        try:
            cli.main(args=argv, prog_name="orchestrate")
        except KeyboardInterrupt:  # between click's handlers, e.g. while parsing
            say("error: interrupted (Ctrl-C)", err=True)
            sys.exit(EXIT_INTERRUPTED)
        finally:
            sys.stdout.flush()  # here, where a closed pipe can still be caught
    except BrokenPipeError:
        silence_stdout()
        sys.exit(EXIT_PIPE)
