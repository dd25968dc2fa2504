"""Output whose reader went away (``orchestrate ... | head``): no traceback, later output discarded."""

from __future__ import annotations

import os
import sys


def silence_stdout(err: bool = False) -> None:
    """Point stdout (``err``: stderr) at /dev/null, so later writes and the final flush are quiet."""
    stream = sys.stderr if err else sys.stdout
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):  # no real file behind it (a test runner's buffer)
        return
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """``warning: MESSAGE`` on stderr, once per process; a closed stderr is silently skipped."""
    if message in _WARNED:
        return
    _WARNED.add(message)
    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write(f"warning: {message}\n")
        stream.flush()
    except (OSError, ValueError):
        pass
