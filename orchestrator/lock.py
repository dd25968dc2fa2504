"""The run lock: one orchestrator writes a plan's results at a time.

The lock file holds the holder's pid and host, for messages. Mutual exclusion is an exclusive
``flock`` on that file, which the kernel drops when the holder dies; a file left behind by a
dead process is therefore detected (its pid is gone, its flock is free) and taken over with a
warning. The holder removes the file when it is done.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Callable, Optional

from kdtree.orchestrator.errors import Refusal

LOCK_NAME = ".lock"  # in the plan's results folder


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
    """The pid/host/since a lock file records, or None if it is absent or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RunLock:
    """``with RunLock(path, warn=print): ...`` holds the lock or raises a Refusal naming the holder."""

    def __init__(self, path: Path, warn: Callable[[str], None] = lambda msg: None):
        self.path = Path(path)
        self.warn = warn
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = read_holder(self.path) or {}
                raise Refusal(
                    f"another orchestrate run holds {self.path} (pid {holder.get('pid', '?')} on "
                    f"{holder.get('host', '?')} since {holder.get('since', '?')}); wait for it to "
                    "finish") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the previous holder removed the file between our open and flock
                os.close(fd)
                continue
            self._take_over(fd)
            return
        raise Refusal(f"could not take the lock {self.path}; try again")

    def _take_over(self, fd: int) -> None:
        previous = os.read(fd, 4096).decode("utf-8", "replace").strip()
        if previous:
            try:
                holder = json.loads(previous)
            except ValueError:
                holder = {}
            pid = holder.get("pid") if isinstance(holder, dict) else None
            host = holder.get("host") if isinstance(holder, dict) else None
            if isinstance(pid, int) and host == socket.gethostname() and pid_alive(pid):
                why = f"pid {pid} is alive but no longer holds it"
            else:
                why = f"pid {pid} on {host} is gone" if pid else "it records no holder"
            self.warn(f"warning: taking over a stale lock {self.path} ({why})")
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(me) + "\n").encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
