"""Whether the code a run would import is the repository's own.

One Python environment can serve several checkouts: an editable install made in clone A keeps
serving clone A's folders to a command run in clone B. A run in B would then test A's code and
record B's inputs hash. Before any gate runs, `require_own_sources` checks that

- every package the repository declares in ``pyproject.toml`` (``[tool.setuptools] packages``
  with ``[tool.setuptools.package-dir]``; for kdtree-engine the ``kdtree.*`` packages) imports
  from the folder the repository maps it to, and
- every phase module of the plan was imported from a file inside the repository,

and refuses (exit 2) naming both paths and the fix otherwise. Symlinks are resolved, so a tree
that maps its packages by symlinks into the repository's own folders passes.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Optional

from kdtree.orchestrator.errors import Refusal


def _toml(path: Path) -> dict:
    try:
        import tomllib  # noqa: PLC0415
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]  # noqa: PLC0415
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def folder_of(name: str, package_dir: dict[str, str]) -> Path:
    """The folder (relative to the repo root) setuptools builds package ``name`` from."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in package_dir:
            return Path(package_dir[prefix], *parts[i:])
    return Path(package_dir.get("", ""), *parts)


def declared_packages(root: Path) -> dict[str, Path]:
    """Package name -> absolute folder, for the packages ``root/pyproject.toml`` declares."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    setuptools = _toml(pyproject).get("tool", {}).get("setuptools", {})
    package_dir = setuptools.get("package-dir") or {}
    packages = setuptools.get("packages")
    names = packages if isinstance(packages, list) else [k for k in package_dir if k]
    return {n: root / folder_of(n, package_dir) for n in names if isinstance(n, str)}


def import_locations(name: str) -> Optional[list[Path]]:
    """The folders package ``name`` imports from (None: it cannot be imported here)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None) if module is not None else None
    parent, _, last = name.rpartition(".")
    if spec is None and parent and parent not in sys.modules:
        # a subpackage: look in its parent's folders without importing the parent, whose
        # __init__ may import torch (which `status` must not)
        where = import_locations(parent)
        if where is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(last, [str(p) for p in where])
        if spec is None:
            return None
    elif spec is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return [Path(p) for p in spec.submodule_search_locations]
    if spec.origin and spec.has_location:
        return [Path(spec.origin).parent]
    return None


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def foreign_sources(root: Path, phase_modules: list[str]) -> list[str]:
    """One sentence per package or phase module that would not be imported from ``root``."""
    problems = []
    fix = (f"install this repository into the environment (`pip install -e {root}`), or use an "
           f"environment made for it (e.g. {root / '.venv' / 'bin' / 'orchestrate'})")
    for name, folder in declared_packages(root).items():
        found = import_locations(name)
        if found is None:
            problems.append(f"{name}, which {root / 'pyproject.toml'} declares (folder {folder}), "
                            f"cannot be imported in this environment; {fix}")
            continue
        want = folder.resolve()
        resolved = [p.resolve() for p in found]
        if want not in resolved or any(not _inside(p, root) for p in resolved):
            where = ", ".join(str(p) for p in found)
            problems.append(f"{name} would be imported from {where}, not from this repository's "
                            f"{folder}; {fix}")
    for module in phase_modules:
        loaded = sys.modules.get(module)
        origin = getattr(loaded, "__file__", None) if loaded is not None else None
        if origin and not _inside(Path(origin), root):
            problems.append(f"phase module {module} was imported from {origin}, outside the "
                            f"repository {root}; {fix}")
    return problems


def require_own_sources(root: Path, phase_modules: list[str]) -> None:
    """Refuse (exit 2) unless every declared package and phase module comes from ``root``."""
    problems = foreign_sources(root, phase_modules)
    if problems:
        raise Refusal("this environment would run code from outside the repository being run, so "
                      "the gates would test code the record does not describe:\n  - "
                      + "\n  - ".join(problems))
