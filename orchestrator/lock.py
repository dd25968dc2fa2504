"""The run lock: one orchestrator writes a plan's results at a time; the others wait.

Mutual exclusion is a `filelock.FileLock` (an OS file lock, which the kernel drops when its holder
dies) on a file in the git directory, ``.git/orchestrate/<hash of the results folder>.lock``,
so that nothing of it ever shows in ``git status`` or a commit; outside a git repository (a
copied tree) it is ``<results_dir>/.lock``. Who holds it is written next to it, in
``<lock>.holder`` (pid, host, since, command), for the messages of those who wait. A holder file left behind by a
process that died is therefore stale: its lock is free, and the next command takes it over with
a warning naming the dead pid. The holder removes its holder file when it is done.

``wait``: None waits as long as it takes (saying once who holds the lock; Ctrl-C stops the
wait), a number of seconds waits that long, 0 refuses at once; a refusal names the holder. A
holder that is an ancestor of this process (a gate that runs ``orchestrate run`` or ``plan``)
would never let go while we wait: that is refused at once, naming it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from kdtree.orchestrator.errors import Refusal

LOCK_NAME = ".lock"  # in the plan's results folder
HOLDER_SUFFIX = ".holder"  # the holder file is LOCK_NAME + HOLDER_SUFFIX
POLL_S = 0.2


def lock_path(root: Path, results_dir: Path, is_git: bool) -> Path:
    """Where the run lock of the results folder ``results_dir`` lives (see module docstring)."""
    if is_git:
        import hashlib  # noqa: PLC0415

        from kdtree.orchestrator.git import GitError, git_path  # noqa: PLC0415

        digest = hashlib.sha256(str(results_dir.resolve()).encode()).hexdigest()[:12]
        try:
            return git_path(root, f"orchestrate/{digest}{LOCK_NAME}")
        except GitError:
            pass  # no git here: the results folder then
    return results_dir / LOCK_NAME


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_holder(path: Path) -> Optional[dict]:
    """The pid/host/since a holder file records, or None if it is absent or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe_holder(holder: Optional[dict]) -> str:
    """``pid 123 on host since 2026-...: orchestrate run phase1`` (or "an unknown process")."""
    if not holder:
        return "an unknown process (it recorded no holder yet)"
    text = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')}"
    if holder.get("command"):
        text += f" ({holder['command']})"
    return text


def ancestors(pid: Optional[int] = None) -> list[int]:
    """The pids of ``pid``'s parent, its parent, ... up to init (empty where /proc cannot tell)."""
    out: list[int] = []
    current = os.getpid() if pid is None else pid
    while current > 1 and len(out) < 256:
        try:
            with open(f"/proc/{current}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            if current == os.getpid():
                parent = os.getppid()
            else:
                break
        if parent <= 0 or parent in out:
            break
        out.append(parent)
        current = parent
    return out


def held_by_ancestor(holder: Optional[dict]) -> bool:
    """Whether ``holder`` (a holder file's content) is a process this one descends from."""
    if not holder or holder.get("host") != socket.gethostname():
        return False
    pid = holder.get("pid")
    return isinstance(pid, int) and pid in ancestors()


class RunLock:
    """``with RunLock(path, warn=print, wait=None): ...`` holds the lock, waiting as ``wait`` says."""

    def __init__(self, path: Path, warn: Callable[[str], None] = lambda msg: None,
                 wait: Optional[float] = 0.0):
        self.path = Path(path)
        self.holder_path = self.path.with_name(self.path.name + HOLDER_SUFFIX)
        self.warn = warn
        self.wait = wait
        self._lock = None

    def _refuse(self, waited: float) -> Refusal:
        holder = describe_holder(read_holder(self.holder_path))
        after = f" after waiting {waited:.0f} s" if waited else ""
        return Refusal(f"another orchestrate holds the run lock {self.path}: {holder}; gave up{after}. "
                       "Wait for it to finish (`--wait SECONDS`, or no --no-wait to wait as long as "
                       "it takes)")

    def acquire(self) -> None:
        import filelock  # noqa: PLC0415

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = filelock.FileLock(str(self.path))
            start = time.monotonic()
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                holder = read_holder(self.holder_path)
                if held_by_ancestor(holder):
                    raise Refusal(f"the run lock {self.path} is held by {describe_holder(holder)}, an "
                                  "ancestor of this process: a gate (or a script it started) runs "
                                  "orchestrate while orchestrate runs it, and waiting would never "
                                  "end. Do not run orchestrate from inside a gate") from None
                if self.wait is not None and self.wait <= 0:
                    raise self._refuse(0) from None
                how = "as long as it takes (Ctrl-C stops)" if self.wait is None else f"up to {self.wait:g} s"
                self.warn(f"waiting for the run lock {self.path}, held by "
                          f"{describe_holder(read_holder(self.holder_path))}; waiting {how}")
                try:
                    lock.acquire(timeout=-1 if self.wait is None else self.wait, poll_interval=POLL_S)
                except filelock.Timeout:
                    raise self._refuse(time.monotonic() - start) from None
        except OSError as exc:
            raise Refusal(f"cannot take the run lock {self.path}: {exc.strerror or exc}; the results "
                          "folder must be writable. No gate was run") from None
        self._lock = lock
        try:
            self._take_over()
        except BaseException:
            self.release()
            raise

    def _take_over(self) -> None:
        previous = read_holder(self.holder_path)
        if previous is not None or self.holder_path.exists():
            pid = previous.get("pid") if previous else None
            host = previous.get("host") if previous else None
            if isinstance(pid, int) and host == socket.gethostname() and pid_alive(pid):
                why = f"pid {pid} is alive but no longer holds it"
            else:
                why = f"pid {pid} on {host} is gone" if pid else "it records no holder"
            self.warn(f"warning: taking over a stale lock {self.path} ({why})")
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": " ".join(["orchestrate", *sys.argv[1:]])[:200]}
        from kdtree.fsutil import atomic_write_text  # noqa: PLC0415

        atomic_write_text(self.holder_path, json.dumps(me) + "\n")

    def release(self) -> None:
        if self._lock is None:
            return
        try:
            os.unlink(self.holder_path)
        except FileNotFoundError:
            pass
        self._lock.release()
        self._lock = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
