"""Which commit holds the files a run tested: a commit's inputs hash, and finding one by it.

A run records its inputs hash always (`kdtree.orchestrator.inputs`) and a commit only when that
commit's tree holds exactly those files. `commit_inputs_hash` hashes a commit's files the way
`kdtree.orchestrator.inputs.hash_files` hashes the working tree (same paths, same bytes, same
hash), from git's object store. `find_commit` walks HEAD's recent history for the newest commit
whose inputs hash is the recorded one; a checkpoint uses it to fill in the commit of a run made
on a machine whose copy of ``.git`` lagged the files it ran.

A symlinked input is hashed through its target in the working tree but as the link in a commit,
so such a run's commit stays unknown (never wrong).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

from kdtree.orchestrator.git import head_commit, try_git
from kdtree.orchestrator.inputs import match_inputs

SEARCH_DEPTH = 200  # commits of HEAD's history a checkpoint looks through


_git = try_git


def _tree_blobs(root: Path, commit: str) -> Optional[dict[str, str]]:
    """path -> blob id of every file in ``commit``'s tree below ``root`` (paths relative to
    ``root``, which may be a subproject's folder; None: no such commit)."""
    out = _git(root, "ls-tree", "-r", "-z", commit)
    if out is None:
        return None
    blobs = {}
    for entry in out.decode("utf-8", "surrogateescape").split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        _mode, kind, oid = meta.split(" ")
        if kind == "blob":
            blobs[path] = oid
    return blobs


class _Blobs:
    """Blob contents by id, read through one ``git cat-file --batch`` per batch and kept."""

    def __init__(self, root: Path):
        self.root = root
        self.data: dict[str, bytes] = {}

    def fetch(self, oids: list[str]) -> bool:
        missing = sorted({o for o in oids if o not in self.data})
        if not missing:
            return True
        out = _git(self.root, "cat-file", "--batch", stdin=("\n".join(missing) + "\n").encode())
        if out is None:
            return False
        pos = 0
        for oid in missing:
            header_end = out.index(b"\n", pos)
            _oid, _kind, size = out[pos:header_end].split(b" ")
            start = header_end + 1
            self.data[oid] = out[start:start + int(size)]
            pos = start + int(size) + 1
        return True


def _hash_listing(listing: list[tuple[str, str]], blobs: _Blobs) -> str:
    h = hashlib.sha256()
    for rel, oid in listing:  # sorted by path, as hash_files does
        data = blobs.data[oid]
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:16]


def commit_inputs_hash(root: Path, commit: str, globs: list[str],
                       blobs: Optional[_Blobs] = None) -> Optional[str]:
    """The inputs hash ``globs`` would give on ``commit``'s tree (None: git cannot tell)."""
    blobs = blobs or _Blobs(root)
    tree = _tree_blobs(root, commit)
    if tree is None:
        return None
    paths = match_inputs(sorted(tree), globs)
    listing = [(p, tree[p]) for p in sorted(paths)]
    if not blobs.fetch([oid for _, oid in listing]):
        return None
    return _hash_listing(listing, blobs)


def head_sha(root: Path) -> Optional[str]:
    return head_commit(root)


def find_commit(root: Path, globs: list[str], inputs_hash: str,
                depth: int = SEARCH_DEPTH) -> Optional[str]:
    """The newest of HEAD's last ``depth`` commits whose tree has ``inputs_hash``, or None."""
    out = _git(root, "rev-list", f"--max-count={depth}", "HEAD")
    if not out:
        return None
    blobs = _Blobs(root)
    seen: dict[tuple[tuple[str, str], ...], str] = {}
    for commit in out.decode().split():
        tree = _tree_blobs(root, commit)
        if tree is None:
            continue
        listing = tuple((p, tree[p]) for p in sorted(match_inputs(sorted(tree), globs)))
        if listing not in seen:
            if not blobs.fetch([oid for _, oid in listing]):
                return None
            seen[listing] = _hash_listing(list(listing), blobs)
        if seen[listing] == inputs_hash:
            return commit
    return None
