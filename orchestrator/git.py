"""The one way the orchestrator calls git: the ``git`` program, run through GitPython's command runner.

Every git command the orchestrator runs goes through `run_git` (or `try_git`), from the folder
the plan lives in (a repository root or a subproject of a monorepo). GitPython's `Git.execute`
runs the real ``git`` (so the user's hooks, identity and configuration apply) and hands back
stdout as bytes, untouched, which ``-z`` listings need; its object model is not used (see
docs/design.md section 5). A failing command is a `GitError` carrying git's own message, never a
traceback; `describe_commit_failure` turns the failures a user meets at ``git commit`` (no
identity, a refusing hook) into what to do. GitPython is imported on the first git command, so
importing the orchestrator stays light.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

from kdtree.orchestrator.errors import Refusal


class GitError(Refusal):
    """A git command failed; the message names the command and quotes git. Exit 2."""

    def __init__(self, args: tuple[str, ...], returncode: Optional[int], stderr: str):
        self.args_run, self.returncode, self.stderr = args, returncode, stderr.strip()
        why = f"exited {returncode}" if returncode is not None else "could not be started"
        super().__init__(f"`git {' '.join(args)}` {why}: {self.stderr or '(no message)'}")


def run_git(root: Path, *args: str, stdin: Optional[bytes] = None) -> bytes:
    """``git ARGS`` in ``root``; its stdout, or a `GitError` with git's message."""
    try:
        from git.cmd import Git  # noqa: PLC0415
        from git.exc import GitCommandNotFound  # noqa: PLC0415
    except ImportError as exc:  # a broken GitPython install (e.g. no git found when it loads)
        raise GitError(args, None, f"GitPython could not load: {exc} (is git installed and on PATH?)") from None
    with tempfile.TemporaryFile() as istream:
        if stdin is not None:
            istream.write(stdin)
            istream.seek(0)
        try:
            status, out, err = Git(str(root)).execute(
                ["git", *args], istream=istream, with_extended_output=True, with_exceptions=False,
                stdout_as_string=False, strip_newline_in_stdout=False)
        except (GitCommandNotFound, OSError) as exc:
            raise GitError(args, None, f"{exc} (is git installed and on PATH?)") from None
    if status != 0:
        raise GitError(args, status, err if isinstance(err, str) else err.decode("utf-8", "replace"))
    return out


def try_git(root: Path, *args: str, stdin: Optional[bytes] = None) -> Optional[bytes]:
    """``git ARGS`` in ``root``; its stdout, or None when it fails (for questions, not actions)."""
    try:
        return run_git(root, *args, stdin=stdin)
    except GitError:
        return None


def git_text(root: Path, *args: str) -> str:
    return run_git(root, *args).decode("utf-8", "surrogateescape").strip()


def nul_list(data: bytes) -> list[str]:
    """The entries of a ``-z`` listing."""
    return [p for p in data.decode("utf-8", "surrogateescape").split("\0") if p]


def toplevel(root: Path) -> Optional[Path]:
    """The work tree root of the repository holding ``root`` (None: not in one)."""
    out = try_git(root, "rev-parse", "--show-toplevel")
    return Path(out.decode().strip()) if out else None


def git_dir(root: Path) -> Path:
    """The repository's git directory (``.git``, or a worktree's own)."""
    path = Path(git_text(root, "rev-parse", "--git-dir"))
    return path if path.is_absolute() else (root / path).resolve()


def git_path(root: Path, name: str) -> Path:
    """A file of the git directory, as ``git rev-parse --git-path`` names it (e.g. ``index``)."""
    path = Path(git_text(root, "rev-parse", "--git-path", name))
    return path if path.is_absolute() else (root / path).resolve()


def head_commit(root: Path) -> Optional[str]:
    out = try_git(root, "rev-parse", "--verify", "-q", "HEAD^{commit}")
    return out.decode().strip() if out else None


def branch(root: Path) -> Optional[str]:
    """The checked-out branch; None on a detached HEAD."""
    out = try_git(root, "symbolic-ref", "-q", "--short", "HEAD")
    return out.decode().strip() or None if out else None


def in_progress_operation(root: Path) -> Optional[str]:
    """'a merge' / 'a rebase' / 'a cherry-pick' / 'a revert' when the repository is in one."""
    gitdir = git_dir(root)
    if (gitdir / "MERGE_HEAD").exists():
        return "a merge"
    if (gitdir / "rebase-merge").exists() or (gitdir / "rebase-apply").exists():
        return "a rebase"
    if (gitdir / "CHERRY_PICK_HEAD").exists():
        return "a cherry-pick"
    if (gitdir / "REVERT_HEAD").exists():
        return "a revert"
    return None


class IndexSnapshot:
    """The index file's bytes, to put back exactly when a checkpoint fails after staging."""

    def __init__(self, root: Path):
        self.path = git_path(root, "index")
        self.data = self.path.read_bytes() if self.path.exists() else None

    def restore(self) -> None:
        from kdtree.fsutil import atomic_write_bytes  # noqa: PLC0415

        if self.data is None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        else:
            atomic_write_bytes(self.path, self.data)


class CommitInterrupted(Exception):
    """Ctrl-C while ``git commit`` ran: git was stopped and the index restored, or git had
    already made the commit, which then stays. Exit 130."""

    exit_code = 130


def commit_unit(root: Path, message: str, index: IndexSnapshot) -> None:
    """``git commit -q -F -`` with ``message``, as one unit with restoring ``index``.

    git runs in its own process group, so a Ctrl-C meant for orchestrate is handled here: git
    and its hooks are stopped and waited for before anything else happens, then the index is
    restored if no commit was made (`CommitInterrupted` says which). A failed commit restores
    the index and raises `GitError`. git never goes on alone to commit an index being restored.
    """
    import signal  # noqa: PLC0415

    from git.cmd import Git  # noqa: PLC0415

    before = head_commit(root)
    args = ("commit", "-q", "-F", "-")
    with tempfile.TemporaryFile() as istream:
        istream.write(message.encode("utf-8"))
        istream.seek(0)
        try:
            handle = Git(str(root)).execute(["git", *args], istream=istream, as_process=True,
                                            start_new_session=True)
        except OSError as exc:
            index.restore()
            raise GitError(args, None, f"{exc} (is git installed and on PATH?)") from None
        proc = handle.proc
        try:
            _, err = proc.communicate()
        except KeyboardInterrupt:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                _stop_group(proc)
                after = head_commit(root)
                if after != before:
                    raise CommitInterrupted(
                        f"interrupted (Ctrl-C), but git had already made the commit {after[:12]}; it "
                        "stays, and the index matches it") from None
                index.restore()
            finally:
                signal.signal(signal.SIGINT, previous)
            raise CommitInterrupted("interrupted (Ctrl-C) while git commit ran: git and its hooks "
                                    "were stopped, nothing was committed and the index is as it was "
                                    "before the checkpoint") from None
    if proc.returncode != 0:
        index.restore()
        raise GitError(args, proc.returncode, (err or b"").decode("utf-8", "replace"))


def _stop_group(proc) -> None:
    """Stop ``proc`` and its process group (SIGTERM, then SIGKILL) and wait for it."""
    import signal  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def describe_commit_failure(exc: GitError) -> str:
    """What went wrong at ``git commit`` and what to do, from git's message."""
    err = exc.stderr
    low = err.lower()
    if "author identity unknown" in low or "unable to auto-detect email" in low or \
            "empty ident name" in low or "user.useconfigonly" in low or "please tell me who you are" in low:
        return ("git does not know who you are, so it cannot commit (no user.name / user.email"
                + ("; HOME is not set, so no ~/.gitconfig is read" if not os.environ.get("HOME") else "")
                + "). Set them, e.g. `git config --global user.name \"Your Name\"` and "
                "`git config --global user.email you@example.com` (or GIT_AUTHOR_NAME/EMAIL), then "
                "run the checkpoint again")
    if "hook" in low or exc.returncode == 1:
        return ("the commit was refused (a hook, e.g. pre-commit, failed); git said:\n"
                + "\n".join("  " + line for line in err.splitlines())
                + "\nFix what it names, then run the checkpoint again")
    return f"git could not commit: {err or '(no message)'}"
