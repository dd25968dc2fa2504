"""What every command-line entry point of the package shares: a clean end when its output pipe
closes (``python -m kdtree.tools.roofline | head``) and argparse types that refuse bad numbers
with a message instead of a traceback later on."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Callable, Optional

SIGPIPE_EXIT = 141  # what a shell reports for a process ended by SIGPIPE, as `seq 1 99999 | head` does


def run(main: Callable[[Optional[list[str]]], Optional[int]], argv: Optional[list[str]] = None) -> int:
    """``main(argv)``'s exit status; a closed stdout (the reader went away) ends it quietly with 141."""
    try:
        status = main(argv)
        sys.stdout.flush()
        return int(status or 0)
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit: point stdout elsewhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return SIGPIPE_EXIT


def _number(text: str, convert: Callable[[str], float], what: str, ok: Callable[[float], bool],
            requirement: str):
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {requirement}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (bandwidths, rates, sizes)."""
    return _number(text, float, "a number", lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (repetitions, iterations, split counts)."""
    return _number(text, int, "a whole number", lambda v: v >= 1, "a whole number >= 1")
