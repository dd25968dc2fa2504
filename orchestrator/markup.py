"""A light console for the listings (`status`, `history`): rich's markup, printed without rich.

The listings are written in rich's console markup (``[bold]plan[/bold]``, ``[dim]...[/dim]``,
user text through `escape`), and a run's live display prints the same rows through rich. Only
the listings need to start fast, and importing rich costs more than everything else `status`
does, so `MarkupConsole` reads that markup itself: the styles the listings use become click
styles (ANSI on a terminal, plain text in a pipe or file, as `click.echo` decides), an escaped
``\\[`` is a literal bracket, exactly as rich reads it. A reader that goes away (``| head``)
gives `BrokenPipeError` after stdout is silenced, like the rich console it stands in for.
"""

from __future__ import annotations

import re
from typing import Any

import click

from kdtree.orchestrator.terminal import silence_stdout

# rich's grammar: a tag is ``[`` + a lowercase letter, ``#``, ``/`` or ``@`` + anything up to ``]``,
# preceded by any number of backslashes (an odd number escapes it).
_TAG = re.compile(r"((\\*)\[([a-z#/@][^[]*?)])")
_ESCAPE = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")

_COLORS = {"green", "red", "yellow", "magenta", "blue", "cyan", "white", "black"}


def escape(text: str) -> str:
    """``text`` with anything that reads as a tag escaped (what ``rich.markup.escape`` does)."""
    text = _ESCAPE.sub(lambda m: f"{m.group(1)}{m.group(1)}\\{m.group(2)}", text)
    return text + "\\" if text.endswith("\\") and not text.endswith("\\\\") else text


def _style(words: str) -> dict[str, Any]:
    style: dict[str, Any] = {}
    for word in words.split():
        if word in ("bold", "dim", "italic", "underline"):
            style[word] = True
        elif word in _COLORS:
            style["fg"] = word
    return style


def render(markup: str) -> str:
    """``markup`` as text with click (ANSI) styles; unknown style words are dropped."""
    out: list[str] = []
    stack: list[dict[str, Any]] = []
    position = 0

    def text(chunk: str) -> None:
        if not chunk:
            return
        merged: dict[str, Any] = {}
        for style in stack:
            merged.update(style)
        out.append(click.style(chunk, **merged) if merged else chunk)

    for match in _TAG.finditer(markup):
        full, escapes, tag = match.groups()
        start, end = match.span()
        text(markup[position:start])
        position = end
        backslashes, escaped = divmod(len(escapes), 2)
        text("\\" * backslashes)
        if escaped:
            text(full[len(escapes):])
        elif tag.startswith("/"):
            if stack:
                stack.pop()
        else:
            stack.append(_style(tag))
    text(markup[position:])
    return "".join(out)


class MarkupConsole:
    """``print(markup)`` to stdout (or stderr), the way the listings use a rich console."""

    def __init__(self, stderr: bool = False):
        self.stderr = stderr

    def print(self, markup: str = "") -> None:
        try:
            click.echo(render(markup), err=self.stderr)
        except BrokenPipeError:
            silence_stdout(err=self.stderr)
            raise BrokenPipeError("the output pipe was closed") from None
