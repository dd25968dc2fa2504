"""One gate's call, isolated from the orchestrator: its output, working folder, environment and time.

While a check runs (`isolated_call`):

- everything it prints goes to the run's log file, never to the orchestrator's stdout/stderr:
  ``sys.stdout``/``sys.stderr`` are replaced (Python level) and file descriptors 1 and 2 point at
  the log (so child processes and C code write there too). Writing to the log never raises into
  the check: a log that stops taking bytes discards them. A reader closing the terminal's pipe
  therefore cannot change a measurement;
- the working folder is the project root, whatever folder the command was typed in;
- ``os.environ`` is restored afterwards, so a check that sets GIT_DIR, GIT_INDEX_FILE or PATH
  does not change the orchestrator's own git calls;
- a time limit (seconds, None: none) raises `GateTimeout` inside the check when it runs out
  (a SIGALRM timer: Python code, sleeps and waits for child processes are interrupted).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional, TypeVar

T = TypeVar("T")


class GateTimeout(BaseException):
    """A gate ran past its time limit (a BaseException, so a check's ``except Exception`` cannot
    swallow it)."""

    def __init__(self, limit_s: float):
        super().__init__(f"the gate ran past its time limit of {limit_s:g} s")
        self.limit_s = limit_s


class _LogStream(io.TextIOBase):
    """A text stream onto the log's file descriptor that never raises on write."""

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd
        self._broken = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            text = str(text)
        if not self._broken:
            data = text.encode("utf-8", "replace")
            try:
                while data:
                    data = data[os.write(self._fd, data):]
            except OSError:
                self._broken = True  # the log stopped taking bytes: the rest is discarded
        return len(text)

    def flush(self) -> None:
        return None

    @property
    def buffer(self):  # some code writes bytes to sys.stdout.buffer
        stream = self

        class _Bytes:
            def write(self, data: bytes) -> int:
                stream.write(bytes(data).decode("utf-8", "replace"))
                return len(data)

            def flush(self) -> None:
                return None

        return _Bytes()


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


@contextlib.contextmanager
def _output_to(log_fd: int) -> Iterator[None]:
    _flush_std()
    saved: list[tuple[int, int]] = []
    for fd in (1, 2):
        try:
            saved.append((fd, os.dup(fd)))
            os.dup2(log_fd, fd)
        except OSError:
            pass  # that descriptor is closed: Python-level capture still applies
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = _LogStream(log_fd)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = old_out, old_err
        # What the check wrote through the original stream objects (a logging handler made
        # earlier) is still in their buffers: flush it now, while fds 1 and 2 are the log's.
        for stream in {id(s): s for s in (old_out, old_err, sys.__stdout__, sys.__stderr__)}.values():
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


@contextlib.contextmanager
def _time_limit(limit_s: Optional[float]) -> Iterator[None]:
    usable = (limit_s is not None and limit_s > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def _expired(signum, frame):
        raise GateTimeout(limit_s)

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def in_project(root: Path) -> Iterator[None]:
    """Run the body in ``root``; afterwards the working folder and ``os.environ`` are as before."""
    env = dict(os.environ)
    cwd = os.getcwd() if os.path.isdir(".") else None
    try:
        os.chdir(root)
        yield
    finally:
        if os.environ != env:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            try:
                os.chdir(cwd)
            except OSError:
                pass


def isolated_call(func: Callable[[], T], *, log_path: Path, root: Path,
                  time_limit_s: Optional[float] = None) -> T:
    """``func()`` with its output appended to ``log_path``, run in ``root``, its changes to
    ``os.environ`` undone, and at most ``time_limit_s`` seconds (see module docstring)."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        with in_project(root), _output_to(log_fd), _time_limit(time_limit_s):
            return func()
    finally:
        os.close(log_fd)
