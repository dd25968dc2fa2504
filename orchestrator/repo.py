"""Finding the project a command works on: from the cwd upward, to the nearest plan configuration.

It runs no git command: a repository is a folder holding ``.git``, found by walking up.
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


def find_project(start: Path, git_root: Optional[Path]) -> Optional[Path]:
    """The nearest folder from ``start`` up to ``git_root`` (inclusive; to the filesystem root
    when None) whose ``pyproject.toml`` has a ``[tool.orchestrate]`` table."""
    from kdtree.orchestrator.plan import has_plan_config  # noqa: PLC0415

    start = start.resolve()
    for folder in (start, *start.parents):
        if has_plan_config(folder):
            return folder
        if git_root is not None and folder == git_root:
            return None
    return None


def resolve_root(repo: Optional[str], cwd: Optional[Path] = None) -> RepoRoot:
    """The project a command works on: ``--repo FOLDER``, or found from the cwd (see below).

    Without ``--repo``: the nearest folder between the cwd and its git repository's root whose
    ``pyproject.toml`` has ``[tool.orchestrate]`` (a subproject of a monorepo works from
    anywhere inside it); the repository root when none has one (loading the plan then refuses
    and names ``orchestrate init``). Outside any git repository, the nearest such folder from
    the cwd upward, taken as ``--repo`` takes a copied tree.

    ``--repo`` names a project folder: one with ``[tool.orchestrate]`` in its pyproject (inside
    a git repository or not), a repository root (a folder with its own ``.git``), or a folder
    outside any git repository (a copied working tree on a GPU host: commands that need git
    then refuse, runs record no commit). A folder inside another repository that has neither a
    plan configuration nor a ``.git`` of its own is refused: the command would otherwise work on
    the outer repository.
    """
    from kdtree.orchestrator.plan import has_plan_config  # noqa: PLC0415

    if repo is not None:
        path = Path(repo).expanduser()
        if not path.is_dir():
            raise Refusal(f"--repo {repo}: no such directory")
        path = path.resolve()
        outer = find_git_root(path)
        if has_plan_config(path) or (path / ".git").exists():
            return RepoRoot(path, outer is not None)
        if outer is not None:
            raise Refusal(f"--repo {repo}: {path} has no [tool.orchestrate] in a pyproject.toml and "
                          f"is not a repository root (it lies inside the git repository {outer}); "
                          f"run `orchestrate init` in {path} to give it a plan, or pass --repo {outer}")
        return RepoRoot(path, False)
    here = (Path.cwd() if cwd is None else cwd).resolve()
    root = find_git_root(here)
    if root is None:
        project = find_project(here, None)
        if project is not None:  # a project outside any repository, as --repo takes it
            return RepoRoot(project, False)
        raise Refusal(f"not inside a git repository, and no pyproject.toml with [tool.orchestrate] "
                      f"from {here} upward; run this inside the project (`orchestrate init` makes "
                      "one) or pass --repo PATH")
    return RepoRoot(find_project(here, root) or root, True)
