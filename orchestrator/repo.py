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
    """The repository for a command: ``--repo PATH``, or the one holding the cwd (searched upward).

    ``--repo`` names a repository's root: a folder with its own ``.git``, or a folder that is not
    inside any git repository (a copied working tree on a GPU host: commands that need git then
    refuse, runs record no commit). A folder inside another repository without a ``.git`` of its
    own is refused: the command would otherwise work on the outer repository.
    """
    if repo is not None:
        path = Path(repo).expanduser()
        if not path.is_dir():
            raise Refusal(f"--repo {repo}: no such directory")
        path = path.resolve()
        if (path / ".git").exists():
            return RepoRoot(path, True)
        outer = find_git_root(path.parent)
        if outer is not None:
            raise Refusal(f"--repo {repo}: {path} is not a repository root (it has no .git of its "
                          f"own and lies inside the git repository {outer}); pass --repo {outer} "
                          f"to work on that repository, or run `git init` in {path} to make it one")
        return RepoRoot(path, False)
    here = Path.cwd() if cwd is None else cwd
    root = find_git_root(here)
    if root is None:
        raise Refusal(f"not inside a git repository (searched upward from {here}); "
                      "run this inside the repository or pass --repo PATH")
    return RepoRoot(root, True)
