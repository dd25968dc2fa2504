"""Keep the source checkout's top-level folders from shadowing PyPI packages of the same name.

The repository's folders (kernels/, engine/, tools/, ...) import as ``kdtree.kernels`` and so on,
never as top-level names. But ``python -m ...`` and ``python -m pytest`` put the current directory
first on ``sys.path``, so run from the repository root a bare ``import kernels`` finds our
``kernels/`` folder instead of PyPI's unrelated ``kernels`` package, which transformers >= 5.25
imports (and SGLang's environment carries). :func:`unshadow` drops the checkout root from
``sys.path``; nothing of ours is lost by that, since every ``kdtree.*`` name resolves through the
editable install (or the ``kdtree/`` symlinks ``scripts/device-env.sh`` makes).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_TOP_LEVEL_FOLDERS = ("orchestrator", "phases", "gates", "kernels", "engine", "integrations", "tools", "bench",
                      "constraints")


def checkout_root() -> Path | None:
    """The source checkout this package runs from, or None when it is installed (no checkout)."""
    if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "kernels" / "__init__.py").is_file():
        return _ROOT
    return None


def shadowing_entries(path: list[str] | None = None) -> list[str]:
    """The entries of ``path`` (default ``sys.path``) that make the checkout's folders top-level."""
    root = checkout_root()
    if root is None:
        return []
    entries = sys.path if path is None else path
    found = []
    for entry in entries:
        try:
            resolved = Path(entry or os.curdir).resolve()
        except (OSError, RuntimeError):
            continue
        if resolved == root:
            found.append(entry)
    return found


def unshadow() -> list[str]:
    """Remove the checkout root from ``sys.path``; returns what was removed.

    A top-level module already imported from the checkout (``sys.modules["kernels"]`` pointing at
    our folder) is evicted too, so the next import finds the PyPI package.
    """
    removed = shadowing_entries()
    for entry in removed:
        while entry in sys.path:
            sys.path.remove(entry)
    root = checkout_root()
    if root is not None:
        for name in _TOP_LEVEL_FOLDERS:
            module = sys.modules.get(name)
            origin = getattr(module, "__file__", None) or ""
            if origin and Path(origin).resolve().is_relative_to(root / name):
                del sys.modules[name]
    if removed:
        importlib.invalidate_caches()
    return removed
