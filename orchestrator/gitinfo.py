"""Git facts and operations (gitpython, imported lazily so `status` never pays for it)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from kdtree.orchestrator.errors import Refusal
from kdtree.orchestrator.specs import GitInfo


def open_repo(root: Path):
    """The gitpython Repo at ``root``; a Refusal when there is none."""
    import git  # noqa: PLC0415

    try:
        return git.Repo(root, search_parent_directories=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise Refusal(f"{root} is not a git repository; run inside one or pass --repo PATH") from None


def git_info(root: Path, is_git: bool, inputs: tuple[list[str], str], ignore: tuple[str, ...] = ()) -> GitInfo:
    """The commit that holds the run's inputs, HEAD, the branch, and whether the tree is dirty.

    ``inputs`` is (the phase's input globs, the inputs hash of the working tree). HEAD is named
    as the run's commit only when its tree has that inputs hash (see `GitInfo`); untracked files
    count as dirty, ``ignore`` paths do not.
    """
    if not is_git:
        return GitInfo()
    from kdtree.orchestrator.provenance import commit_inputs_hash  # noqa: PLC0415

    repo = open_repo(root)
    try:
        head: Optional[str] = repo.head.commit.hexsha
    except ValueError:  # no commit yet
        head = None
    branch = None if repo.head.is_detached else repo.active_branch.name
    dirty = repo.is_dirty(untracked_files=False) or any(f not in ignore for f in repo.untracked_files)
    globs, inputs_hash = inputs
    matches = head is not None and commit_inputs_hash(root, head, globs) == inputs_hash
    return GitInfo(sha=head if matches else None, dirty=dirty, branch=branch, head=head,
                   sha_source="head" if matches else None)


def in_progress_operation(repo) -> Optional[str]:
    """'a merge' / 'a rebase' / 'a cherry-pick' when the repository is in the middle of one."""
    gitdir = Path(repo.git_dir)
    if (gitdir / "MERGE_HEAD").exists():
        return "a merge"
    if (gitdir / "rebase-merge").exists() or (gitdir / "rebase-apply").exists():
        return "a rebase"
    if (gitdir / "CHERRY_PICK_HEAD").exists():
        return "a cherry-pick"
    if (gitdir / "REVERT_HEAD").exists():
        return "a revert"
    return None
