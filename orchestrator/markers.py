"""Orchestrator-owned blocks in a markdown file, and replacing them without touching the rest.

A block is the lines between ``<!-- orchestrate:begin NAME -->`` and ``<!-- orchestrate:end NAME -->``
(each marker alone on its line). Inside a fenced code block (```` ``` ```` or ``~~~``, CommonMark
rules) a marker is text: a plan may show how its markers look. Everything outside the blocks, the marker lines included, is
kept byte for byte. A malformed, unknown, duplicated, unmatched or unterminated marker, or a
missing block, is a `MarkerError` naming the line; the file is then never rewritten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from kdtree.orchestrator.errors import Refusal

_MARKER = re.compile(r"^[ \t]*<!--[ \t]*orchestrate:(begin|end)[ \t]+([A-Za-z0-9_.\-]+)[ \t]*-->[ \t]*$")
# A marker damaged at either end: "<!-- orchestrate:..." without "-->", or "orchestrate:end X -->"
# without "<!--". Prose that merely mentions `orchestrate:begin` is not a marker.
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_LOOKS_LIKE = re.compile(r"<!--\s*orchestrate:|orchestrate:(begin|end)[ \t]+[A-Za-z0-9_.\-]+[ \t]*-->")


class MarkerError(Refusal):
    """A damaged marker (with its line number) or a missing block."""


@dataclass(frozen=True)
class Block:
    name: str
    begin: int  # 0-based index of the begin marker line
    end: int  # 0-based index of the end marker line


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split on ``\\n`` only (``\\r\\n`` stays whole, no other break counts)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def find_blocks(text: str, where: str = "plan") -> list[Block]:
    """Every block of ``text`` in order; a `MarkerError` for any damaged marker."""
    blocks: list[Block] = []
    open_name, open_line = None, -1
    seen: dict[str, int] = {}
    fence = ""  # the open code fence ("```", "~~~~", ...), empty outside one
    for i, raw in enumerate(split_lines(text)):
        line = raw.rstrip("\r\n")
        if i == 0:
            line = line.lstrip("\ufeff")  # a byte order mark is not part of the first line's text
        f = _FENCE.match(line)
        if fence:
            if f and f.group(1)[0] == fence[0] and len(f.group(1)) >= len(fence) and not f.group(2).strip():
                fence = ""
            continue
        if f and not (f.group(1)[0] == "`" and "`" in f.group(2)):
            fence = f.group(1)
            continue
        if not _LOOKS_LIKE.search(line):
            continue
        m = _MARKER.match(line)
        n = i + 1
        if m is None:
            raise MarkerError(f"{where}:{n}: malformed orchestrate marker {line.strip()!r}; it must be "
                              "alone on its line as `<!-- orchestrate:begin NAME -->` or "
                              "`<!-- orchestrate:end NAME -->`")
        kind, name = m.groups()
        if kind == "begin":
            if open_name is not None:
                raise MarkerError(f"{where}:{n}: begin of block {name!r} inside block {open_name!r} "
                                  f"(opened at line {open_line + 1}, not ended)")
            if name in seen:
                raise MarkerError(f"{where}:{n}: block {name!r} appears twice (first at line {seen[name]})")
            open_name, open_line = name, i
            seen[name] = n
        else:
            if open_name is None:
                raise MarkerError(f"{where}:{n}: end of block {name!r} without a matching begin")
            if name != open_name:
                raise MarkerError(f"{where}:{n}: end of block {name!r} but block {open_name!r} "
                                  f"(opened at line {open_line + 1}) is the one open")
            blocks.append(Block(name, open_line, i))
            open_name = None
    if open_name is not None:
        raise MarkerError(f"{where}:{open_line + 1}: block {open_name!r} is never ended; add "
                          f"`<!-- orchestrate:end {open_name} -->` after its content")
    return blocks


def check_names(blocks: Iterable[Block], expected: Iterable[str], where: str = "plan") -> None:
    """Every expected block present, no unknown one."""
    blocks = list(blocks)
    expected = list(expected)
    names = {b.name for b in blocks}
    for b in blocks:
        if b.name not in expected:
            raise MarkerError(f"{where}:{b.begin + 1}: unknown block {b.name!r}; the blocks this plan "
                              f"renders are {', '.join(expected)}")
    missing = [e for e in expected if e not in names]
    if missing:
        raise MarkerError(f"{where}: block(s) {', '.join(missing)} missing; add "
                          + " and ".join(f"`<!-- orchestrate:begin {m} -->` / `<!-- orchestrate:end {m} -->`"
                                         for m in missing)
                          + " where they should appear")


def replace_blocks(text: str, contents: dict[str, str], where: str = "plan") -> str:
    """``text`` with each block's lines replaced by ``contents[name]``; all else byte for byte."""
    blocks = find_blocks(text, where)
    check_names(blocks, contents, where)
    lines = split_lines(text)
    out: list[str] = []
    pos = 0
    for b in blocks:
        out.extend(lines[pos:b.begin + 1])
        eol = "\r\n" if lines[b.begin].endswith("\r\n") else "\n"
        if not lines[b.begin].endswith("\n"):  # cannot happen: an end marker follows
            out.append(eol)
        body = contents[b.name]
        if body and not body.endswith("\n"):
            body += "\n"
        if eol != "\n":
            body = body.replace("\n", eol)
        out.append(body)
        pos = b.end
    out.extend(lines[pos:])
    return "".join(out)
