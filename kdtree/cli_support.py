"""What every kdtree command-line program shares: ``--version``, ``--log-level`` and one-line errors.

Each program is a click command decorated with :func:`common_options` and started through
:func:`run`::

    @click.command()
    @common_options
    def main(...): ...

    if __name__ == "__main__":
        run(main)

Errors a user can fix (bad input, a machine that lacks what the program needs) are raised as
:class:`UsageError` or :class:`MachineError` and end the program with one line on stderr and
exit status 2; click's own usage errors also exit 2. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from kdtree import __version__

__all__ = ["LOG_LEVELS", "MachineError", "UsageError", "common_options", "configure_logging", "run"]

LOG_LEVELS = ("debug", "info", "warning", "error")

F = TypeVar("F", bound=Callable[..., Any])


class UsageError(click.ClickException):
    """The user asked for something that cannot work as given (exit 2, one line)."""

    exit_code = 2


class MachineError(click.ClickException):
    """This machine lacks what the command needs, e.g. a CUDA GPU or nvcc (exit 2, one line)."""

    exit_code = 2


def configure_logging(level: str) -> None:
    """Send the ``kdtree`` logger's records at ``level`` and above to stderr, one line each."""
    logger = logging.getLogger("kdtree")
    logger.setLevel(level.upper())
    if not any(getattr(h, "_kdtree_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._kdtree_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def _set_log_level(ctx: click.Context, param: click.Parameter, value: str) -> str:
    configure_logging(value)
    return value


def common_options(func: F) -> F:
    """Add ``--version`` and ``--log-level`` (default ``info``) to a click command."""
    func = click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="info",
        show_default=True,
        expose_value=False,
        is_eager=True,
        callback=_set_log_level,
        help="Messages of the kdtree library at this level and above go to stderr.",
    )(func)
    return click.version_option(__version__, "--version", package_name="kdtree-engine",
                                message="%(prog)s (kdtree-engine) %(version)s")(func)


def run(command: click.Command, args: list[str] | None = None, prog_name: str | None = None) -> None:
    """Run a click command as a program: exit 2 with one line for user and machine errors."""
    command.main(args=args, prog_name=prog_name, standalone_mode=True)
