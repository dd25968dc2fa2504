"""What a checkpoint commit may hold: the files it wrote or reports, and the inputs that ran.

A checkpoint commits

- the plan markdown and the changelog (it writes them),
- the reported phase's results folder: the run records in it, the plots the reported run links,
  and changes to files already tracked there (the figures its gates wrote),
- every other run record (and its plots) that the rendered plan and changelog cite, so that
  ``plan --check`` and ``status`` agree at the checkpoint commit (``plots`` lists them all),
- tracked changes to the phase's input files: the checkpoint refuses a stale run, so these are
  exactly the files the recorded inputs hash covers.

A modified tracked file outside those is refused (commit or stash it first): the checkpoint
would otherwise either sweep it in or leave the commit without a file the tree depends on.
Untracked files are never committed silently: untracked inputs of the phase are refused unless
``--include-untracked`` (the commit must hold what the gates ran on), other untracked files are
left out and listed, and ``--include-untracked`` adds them too, ``--include-records`` only the
run records (and gate logs) of other phases. The run lock is never committed.

Every run record the commit cites (``required``) must end up in it or be tracked already: a
record that git ignores (a ``.gitignore`` rule) or that lies behind a symbolic link (git would
commit the link, not the record) is refused with the fix, so a clone never lacks a record its
plan cites (`require_committable`, `require_staged`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kdtree.orchestrator.errors import Refusal
from kdtree.orchestrator.git import git_text, nul_list, run_git, try_git
from kdtree.orchestrator.inputs import matcher
from kdtree.orchestrator.lock import HOLDER_SUFFIX
from kdtree.orchestrator.store import RUN_ID_RE


@dataclass
class CommitSet:
    """The paths a checkpoint stages, and the untracked ones it leaves out."""

    paths: list[str] = field(default_factory=list)  # what the commit will change
    to_add: list[str] = field(default_factory=list)  # of those, the ones not staged as they are now
    left_out: list[str] = field(default_factory=list)  # untracked, not added (no --include-untracked)
    required: list[str] = field(default_factory=list)  # records the commit cites: must be in the tree

    def take(self, xy: str, path: str) -> None:
        self.paths.append(path)
        if xy == "??" or xy[1] != " ":
            self.to_add.append(path)


OUTSIDE = "../"  # how `working_tree_changes` marks a path outside the plan's folder


def working_tree_changes(root: Path) -> list[tuple[str, str]]:
    """(status XY, path) for every changed, staged or untracked (not ignored) file.

    Paths are relative to ``root`` (a subproject's folder in a monorepo); a change outside it is
    listed with its repository path behind `OUTSIDE`.
    """
    out = run_git(root, "status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all")
    prefix = git_text(root, "rev-parse", "--show-prefix")
    rows = []
    for entry in nul_list(out):
        xy, path = entry[:2], entry[3:]
        if prefix:
            path = path[len(prefix):] if path.startswith(prefix) else OUTSIDE + path
        rows.append((xy, path))
    return rows


def _is_run_file(name: str) -> bool:
    """Whether ``name`` (relative to a phase's folder) is a run record or a run's gate log."""
    stem, dot, ext = name.rpartition(".")
    return "/" not in name and dot == "." and ext in ("json", "log") and bool(RUN_ID_RE.match(stem))


def _under(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def select(changes: list[tuple[str, str]], *, plan_md: str, changelog: str, phase_dir: str,
           lock: str, input_globs: list[str], plots: list[str], include_untracked: bool,
           results_dir: str = "", include_records: bool = False) -> CommitSet:
    """Classify ``changes`` (see module docstring); a Refusal naming what is in the way."""
    is_input = matcher(input_globs)
    cited = set(plots)
    chosen = CommitSet()
    foreign_tracked: list[str] = []
    untracked_inputs: list[str] = []
    untracked_other: list[str] = []
    status = dict((path, xy) for xy, path in changes)
    for xy, path in changes:
        if path == lock or path == lock + HOLDER_SUFFIX:
            continue
        untracked = xy == "??"
        if path.startswith(OUTSIDE):
            if not untracked and xy[0] not in " ?":
                foreign_tracked.append(path[len(OUTSIDE):])  # staged: the commit would take it
            continue  # not staged: outside the plan's folder, the commit never touches it
        if path in (plan_md, changelog):
            chosen.take(xy, path)
        elif _under(path, phase_dir):
            name = path[len(phase_dir.rstrip("/")) + 1:]
            if not untracked or _is_run_file(name) or path in plots:
                chosen.take(xy, path)
            else:
                untracked_other.append(path)
        elif path in cited:  # a record (or its plot) of another phase that the plan cites
            chosen.take(xy, path)
        elif untracked and include_records and results_dir and _under(path, results_dir) \
                and _is_run_file(path[len(results_dir.rstrip("/")) + 1:].split("/", 1)[-1]):
            chosen.take(xy, path)  # another phase's run record (or log): --include-records
        elif is_input(path):
            if untracked:
                untracked_inputs.append(path)
            else:
                chosen.take(xy, path)
        elif untracked:
            untracked_other.append(path)
        else:
            foreign_tracked.append(path)
    if foreign_tracked:
        raise Refusal("tracked files outside this checkpoint are modified or staged: "
                      + ", ".join(foreign_tracked) + ". A checkpoint commits the plan, the run "
                      "records, the changelog and the phase's own input files; commit or stash "
                      "these first (`git stash push -- PATH`), then checkpoint again")
    if untracked_inputs and not include_untracked:
        raise Refusal("untracked files are inputs of the run (its gates ran on them): "
                      + ", ".join(untracked_inputs) + ". Pass --include-untracked to add them "
                      "to the checkpoint, or `git add` them yourself first"
                      + (f"; --include-untracked would also add {', '.join(untracked_other)}"
                         if untracked_other else ""))
    if include_untracked:
        for path in untracked_inputs + untracked_other:
            chosen.take(status[path], path)
    else:
        chosen.left_out = untracked_other
    return chosen


def stage(root: Path, paths: list[str]) -> None:
    """``git add -A`` exactly ``paths`` (deletions included), each taken literally."""
    if not paths:
        return
    spec = b"\0".join(p.encode("utf-8", "surrogateescape") for p in paths) + b"\0"
    run_git(root, "--literal-pathspecs", "add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul",
            stdin=spec)


def _symlinked(root: Path, path: str) -> str:
    """The first component of ``path`` (under ``root``) that is a symbolic link ("" if none)."""
    current = root
    for part in path.split("/")[:-1]:
        current = current / part
        if current.is_symlink():
            return str(current.relative_to(root))
    return ""


def require_committable(root: Path, required: list[str], chosen: CommitSet) -> None:
    """Refuse (before anything is written) when a record the commit cites could not be in it."""
    for path in required:
        link = _symlinked(root, path)
        if link:
            raise Refusal(f"{link} is a symbolic link (to {os.path.realpath(root / link)}): git commits "
                          f"the link, not the run records behind it, so the checkpoint would cite "
                          f"{path} without committing it and a clone would lack it. Make {link} a real "
                          f"folder (e.g. `rm {link} && cp -a {os.path.realpath(root / link)} {link}`), "
                          "or set `results_dir` in [tool.orchestrate] to a folder inside the "
                          "repository, then checkpoint again")
    missing = [p for p in required if p not in chosen.paths]
    if not missing:
        return
    tracked = set(nul_list(run_git(root, "ls-files", "-z", "--cached", "--", *missing)))
    missing = [p for p in missing if p not in tracked]
    if not missing:
        return
    rules = []
    for path in missing:
        out = try_git(root, "check-ignore", "-v", "--no-index", "--", path)
        if out:
            source, _, pattern = out.decode("utf-8", "replace").split("\t", 1)[0].rpartition(":")
            file, _, line = source.rpartition(":")
            rules.append(f"{path} (ignored by the rule {pattern!r} in {file} line {line})")
        else:
            rules.append(f"{path} (git does not list it)")
    raise Refusal("the checkpoint would cite run records that it cannot commit: "
                  + ", ".join(rules[:5]) + (f" and {len(rules) - 5} more" if len(rules) > 5 else "")
                  + ". A clone would lack them and show the phase pending. Remove the ignore rule (or "
                  "add `!<results_dir>/` after it in .gitignore) so git can commit the results "
                  "folder, then checkpoint again. Nothing was written or committed")


def require_staged(root: Path, required: list[str]) -> None:
    """After staging: every record the commit cites is in the index (else a Refusal)."""
    if not required:
        return
    staged = set(nul_list(run_git(root, "ls-files", "-z", "--cached", "--", *required)))
    absent = [p for p in required if p not in staged]
    if absent:
        raise Refusal("git did not stage run records the checkpoint cites: " + ", ".join(absent[:5])
                      + ". Check .gitignore and symbolic links in the results folder; nothing was "
                      "committed and the index is as it was")
