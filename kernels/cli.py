"""What the kernel tools share on the command line: click parameter types that refuse bad numbers
with a message instead of a traceback later on, and `program`, which runs a click command as a
program (`kdtree.cli_support.run`: one-line errors, exit 2 for bad input and for what this machine
cannot do) that also ends quietly when its output pipe closes (``python -m kdtree.tools.roofline | head``).

A tool is a click command decorated with `kdtree.cli_support.common_options`; its callback returns
the exit status (None: 0)::

    @click.command(context_settings=cli.CONTEXT)
    @click.option("--reps", type=cli.POSITIVE_INT, default=20)
    @common_options
    def command(reps): ...

    main = cli.program(command, "python -m kdtree.tools.x")  # main(argv) -> exit status

    if __name__ == "__main__":
        sys.exit(main())
"""

from __future__ import annotations

import functools
import math
import os
import sys
from typing import Any, Callable, Optional

import click

from kdtree.cli_support import MachineError, run as run_command

SIGPIPE_EXIT = 141  # what a shell reports for a process ended by SIGPIPE, as `seq 1 99999 | head` does
CONTEXT = {"help_option_names": ["-h", "--help"]}

_argv: list[str] = []  # the arguments of the `program` running now


def _silence_stdout() -> None:
    """Point stdout at /dev/null: Python would report the closed pipe again when it flushes at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def program(command: click.Command, prog_name: str) -> Callable[[Optional[list[str]]], int]:
    """``main(argv=None) -> int``: runs `command` through `kdtree.cli_support.run` and returns its exit
    status instead of exiting: the callback's return value, 2 for usage and machine errors (one
    line on stderr), 141 when stdout's reader went away."""
    callback = command.callback

    @functools.wraps(callback)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            status = callback(*args, **kwargs)
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
            raise SystemExit(SIGPIPE_EXIT) from None
        if status:
            raise SystemExit(int(status))
        return status

    command.callback = guarded

    def main(argv: Optional[list[str]] = None) -> int:
        _argv[:] = sys.argv[1:] if argv is None else list(argv)
        try:
            run_command(command, list(_argv), prog_name=prog_name)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return 0

    main.command = command  # type: ignore[attr-defined]
    return main


def invoked_argv() -> list[str]:
    """The arguments the running `program` was started with (what a report records as its command)."""
    return list(_argv)


def require_cuda(tool: str, why: str = "it runs GPU kernels") -> None:
    """MachineError (exit 2, one line) unless torch sees a CUDA GPU; `why` says what needs it."""
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        raise MachineError(f"{tool} needs a CUDA GPU: no CUDA GPU on this machine (torch.cuda.is_available() "
                           f"is False) and {why}; run it on the GPU machine")


def _number(text: Any, convert: Callable[[Any], float], what: str, ok: Callable[[float], bool],
            requirement: str):
    try:
        value = convert(text)
    except (TypeError, ValueError):
        raise ValueError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise ValueError(f"expected {requirement}, got {text!r}")
    return value


def positive_float(text: Any) -> float:
    """A finite number > 0 (bandwidths, rates, sizes); ValueError says what is wrong."""
    return _number(text, float, "a number", lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def positive_int(text: Any) -> int:
    """A whole number >= 1 (repetitions, iterations, split counts); ValueError says what is wrong."""
    return _number(text, int, "a whole number", lambda v: v >= 1, "a whole number >= 1")


class Parsed(click.ParamType):
    """A click type made of a parse function: ``parse(text)`` returns the value or raises ValueError
    with the message the user sees (``Invalid value for '--x': <message>``)."""

    def __init__(self, parse: Callable[[str], Any], name: str):
        self.parse = parse
        self.name = name

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        if not isinstance(value, str):  # a default that is already parsed
            return value
        try:
            return self.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


POSITIVE_FLOAT = Parsed(positive_float, "number")
POSITIVE_INT = Parsed(positive_int, "integer")
