"""Finding the repository a command works on, the way git does: from the cwd upward.

This module does not import gitpython (``orchestrate status`` must stay fast); `kdtree.orchestrator.gitinfo`
does, for the commands that need commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from kdtree.orchestrator.errors import Refusal


@dataclass(frozen=True)
class RepoRoot:
    """The folder every plan path is relative to; ``is_git`` False for a bare copy of a tree."""

    path: Path
    is_git: bool


def find_git_root(start: Path) -> Optional[Path]:
    """The nearest folder at or above ``start`` holding ``.git`` (a directory or a worktree file)."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def resolve_root(repo: Optional[str], cwd: Optional[Path] = None) -> RepoRoot:
    """The repository for a command: ``--repo PATH`` (searched upward like ``git -C``) or the cwd's.

    ``--repo`` may name a folder that is not inside a git repository (a copied working tree on a
    GPU host): commands that need git then refuse; runs record no commit.
    """
    if repo is not None:
        path = Path(repo).expanduser()
        if not path.is_dir():
            raise Refusal(f"--repo {repo}: no such directory")
        root = find_git_root(path)
        return RepoRoot(root, True) if root else RepoRoot(path.resolve(), False)
    here = Path.cwd() if cwd is None else cwd
    root = find_git_root(here)
    if root is None:
        raise Refusal(f"not inside a git repository (searched upward from {here}); "
                      "run this inside the repository or pass --repo PATH")
    return RepoRoot(root, True)
