"""``python -m kdtree.tools``: the command-line programs of this package, one line each.

Lists every module of `kdtree.tools` that runs as a program (it parses a command line with click
and has a ``__main__`` block) with the
first line of its docstring, read from the source without importing it (most need torch and a
GPU). Exit status 0.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def programs() -> list[tuple[str, str]]:
    """(module name, first docstring line) of each program in this folder, sorted by name."""
    found = []
    for path in sorted(HERE.glob("*.py")):
        if path.name.startswith("_"):
            continue
        source = path.read_text()
        if "if __name__ == \"__main__\":" not in source or "import click" not in source:
            continue
        doc = ast.get_docstring(ast.parse(source)) or ""
        found.append((path.stem, doc.strip().splitlines()[0] if doc.strip() else ""))
    return found


def main() -> int:
    listed = programs()
    width = max(len(name) for name, _ in listed)
    sys.stdout.write("kdtree.tools: python -m kdtree.tools.<name> --help for each\n")
    for name, summary in listed:
        sys.stdout.write(f"  {name.ljust(width)}  {summary}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
