"""The pip constraint files (``sglang.txt``, ``test.txt``), shipped in the wheel as this package.

``python -m kdtree.constraints sglang`` prints the path of ``sglang.txt`` (a resolution of SGLang
0.5.23 with this package's extras), for ``pip install "kdtree-engine[sglang]" -c "$(python -m
kdtree.constraints sglang)"``; ``test`` gives ``test.txt`` (the CPU test set, what CI passed with).
In a clone they are ``constraints/*.txt``; ``make lock`` and ``make lock-sglang`` write them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["NAMES", "path"]

NAMES = ("sglang", "test")


def path(name: str) -> Path:
    """The installed constraint file `name` (``sglang`` or ``test``); ValueError for another name."""
    if name not in NAMES:
        raise ValueError(f"constraint file {name!r}: expected one of {', '.join(NAMES)}")
    return Path(str(resources.files(__name__) / f"{name}.txt"))
