"""Reading the text files a plan keeps (its markdown, its changelog) as people keep them.

`read_text` returns the exact text (CRLF and BOM kept) or refuses with what is wrong: a path that
is a directory, a file that is missing or unreadable, or bytes that are not UTF-8 (with the byte
offset and line of the first bad byte). A symlink is read through; writes go through it too
(`kdtree.fsutil`).
"""

from __future__ import annotations

from pathlib import Path

from kdtree.orchestrator.errors import Refusal


def read_text(path: Path, where: str, missing_ok: bool = False) -> str:
    """The file's text, decoded as UTF-8 without newline translation (see module docstring)."""
    if path.is_dir():
        raise Refusal(f"{where} ({path}) is a directory, not a file; point the configuration at the "
                      "markdown file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return ""
        raise Refusal(f"{where} ({path}) does not exist") from None
    except OSError as exc:
        raise Refusal(f"{where} ({path}) cannot be read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise Refusal(f"{where} ({path}) is not valid UTF-8: byte 0x{data[exc.start]:02x} at byte "
                      f"offset {exc.start} (line {line}) {exc.reason}; save the file as UTF-8 and try "
                      "again") from None
