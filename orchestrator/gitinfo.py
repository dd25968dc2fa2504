"""Git facts a run record holds: the commit that holds the run's inputs, HEAD, branch, dirty."""

from __future__ import annotations

from pathlib import Path

from kdtree.orchestrator.git import branch, head_commit, nul_list, try_git
from kdtree.orchestrator.specs import GitInfo


def is_dirty(root: Path, ignore: tuple[str, ...] = ()) -> bool:
    """Whether the working tree (below ``root``) differs from HEAD; untracked files count,
    ``ignore`` paths (relative to ``root``) do not."""
    out = try_git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
                  "--", ".")
    if out is None:
        return False
    prefix = (try_git(root, "rev-parse", "--show-prefix") or b"").decode().strip()
    for entry in nul_list(out):
        path = entry[3:]
        rel = path[len(prefix):] if prefix and path.startswith(prefix) else path
        if rel not in ignore:
            return True
    return False


def git_info(root: Path, is_git: bool, inputs: tuple[list[str], str], ignore: tuple[str, ...] = ()) -> GitInfo:
    """The commit that holds the run's inputs, HEAD, the branch, and whether the tree is dirty.

    ``inputs`` is (the phase's input globs, the inputs hash of the working tree). HEAD is named
    as the run's commit only when its tree has that inputs hash (see `GitInfo`); untracked files
    count as dirty, ``ignore`` paths do not.
    """
    if not is_git:
        return GitInfo()
    from kdtree.orchestrator.provenance import commit_inputs_hash  # noqa: PLC0415

    head = head_commit(root)
    globs, inputs_hash = inputs
    matches = head is not None and commit_inputs_hash(root, head, globs) == inputs_hash
    return GitInfo(sha=head if matches else None, dirty=is_dirty(root, ignore), branch=branch(root),
                   head=head, sha_source="head" if matches else None)
