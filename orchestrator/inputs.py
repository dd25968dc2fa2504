"""A phase's inputs: the files its globs match, and one hash over their paths and contents.

The candidate files are those git would commit (tracked, plus untracked files that are not
ignored: ``git ls-files -co --exclude-standard``), so a build product or cache never makes a phase
stale, and a checkpoint commit holds exactly the files that were hashed. In a folder that is not
a git repository every file is a candidate except `_JUNK` (caches, build outputs, .git).

A run observes its inputs twice (`InputsIndex.observe`): at its start and at its end, each
time their content hash and every file's metadata (size, mtime_ns, ctime_ns, inode). Any
difference means the files changed while the gates ran, even when an edit was reverted before
the end (the content hash alone would not see it; the ctime does, since no write leaves it).

Globs are relative to the repo root: ``*`` and ``?`` stay within one path segment, ``**`` spans
any number of segments (``kernels/csrc/**`` is everything below ``kernels/csrc``). A glob that
begins with ``!`` excludes what it matches: the orchestrator's own outputs (the results folder,
the plan markdown, the changelog) are always excluded that way (`kdtree.orchestrator.plan.Plan.
input_globs`), so that ``inputs = ["**"]`` is not made stale by its own run.
"""

from __future__ import annotations

import hashlib
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Optional

from kdtree.orchestrator.git import GitError, nul_list, run_git

_JUNK_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "build", ".kdtree-cache"}
_JUNK_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".tmp", ".lock")


@lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern:
    """Compile a repo-relative glob (see module docstring) to an anchored regex."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape("["))
                i += 1
            else:
                body = pattern[i + 1:end].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def candidate_files(root: Path, is_git: bool) -> list[str]:
    """Repo-relative POSIX paths of the files that may be inputs (see module docstring)."""
    if is_git:
        try:
            paths = set(nul_list(run_git(root, "ls-files", "-z", "-co", "--exclude-standard")))
            return sorted(p for p in paths if (root / p).is_file())
        except GitError:
            pass  # no git binary: fall back to walking
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _JUNK_DIRS]
        rel = os.path.relpath(dirpath, root)
        for name in filenames:
            if not name.endswith(_JUNK_SUFFIXES):
                found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return sorted(found)


def matcher(globs: list[str]):
    """A predicate: is a path matched by one of ``globs`` and by none of its ``!`` globs?"""
    take = [glob_regex(g) for g in globs if not g.startswith("!")]
    drop = [glob_regex(g[1:]) for g in globs if g.startswith("!")]
    return lambda path: any(r.match(path) for r in take) and not any(r.match(path) for r in drop)


def match_inputs(files: list[str], globs: list[str]) -> list[str]:
    """The files matched by any of ``globs`` (less those its ``!`` globs match), in order."""
    wanted = matcher(globs)
    return [f for f in files if wanted(f)]


def unmatched_globs(files: list[str], globs: list[str]) -> list[str]:
    """The (non-``!``) globs that match none of ``files``."""
    return [g for g in globs if not g.startswith("!") and not any(glob_regex(g).match(f) for f in files)]


def hash_files(root: Path, paths: list[str]) -> str:
    """sha256 over the sorted (path, content) pairs; any change of name or byte changes it."""
    h = hashlib.sha256()
    for rel in sorted(paths):
        data = (root / rel).read_bytes()
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:16]


def _git_names(root: Path, *args: str) -> list[str]:
    return nul_list(run_git(root, *args))


def changes_since(root: Path, commit: str) -> Optional[tuple[list[str], list[str]]]:
    """(files in ``commit``'s tree, files that differ between it and the working tree), or None
    when git cannot say (no git binary, a commit this clone does not have)."""
    try:
        return (_git_names(root, "ls-tree", "-r", "-z", "--name-only", commit),
                _git_names(root, "diff", "--relative", "--name-only", "-z", commit, "--"))
    except GitError:
        return None


def changed_since(root: Path, commit: str, globs: list[str], current: list[str],
                  listings: Optional[tuple[list[str], list[str]]] = None) -> Optional[list[str]]:
    """The input files (matched by ``globs``) that differ between ``commit`` and the working tree:
    edited, added (untracked ones included) or removed; ``current`` is today's list of inputs;
    ``listings``: `changes_since` of that commit, when already known.
    None when git cannot say (no git binary, a commit this clone does not have)."""
    listings = listings if listings is not None else changes_since(root, commit)
    if listings is None:
        return None
    then = set(match_inputs(listings[0], globs))
    edited = set(match_inputs(listings[1], globs))
    now = set(current)
    return sorted((edited & (then | now)) | (then ^ now))


Stamp = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode


def stamps(root: Path, paths: list[str]) -> dict[str, Optional[Stamp]]:
    """Each file's (size, mtime_ns, ctime_ns, inode); None for a file that cannot be stat'ed."""
    out: dict[str, Optional[Stamp]] = {}
    for rel in paths:
        try:
            st = os.stat(root / rel)
        except OSError:
            out[rel] = None
            continue
        out[rel] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return out


class Observation:
    """A phase's inputs as seen at one moment: their hash, count and per-file stamps."""

    def __init__(self, inputs_hash: str, stamps: dict[str, Optional[Stamp]]):
        self.inputs_hash, self.stamps = inputs_hash, stamps

    @property
    def files(self) -> int:
        return len(self.stamps)

    def changed_since(self, earlier: "Observation") -> list[str]:
        """The files added, removed, or whose content or metadata differ from ``earlier``'s
        (every file, when only the hash tells: that cannot happen without a stamp changing)."""
        names = sorted(set(self.stamps) | set(earlier.stamps))
        changed = [n for n in names if self.stamps.get(n) != earlier.stamps.get(n)
                   or self.stamps.get(n) is None]
        if not changed and self.inputs_hash != earlier.inputs_hash:
            changed = names
        return changed


class InputsIndex:
    """The candidate files of one tree, listed once and shared by every phase's hash."""

    def __init__(self, root: Path, is_git: bool):
        self.root, self.is_git = root, is_git
        self.files = candidate_files(root, is_git)
        self._since: dict[str, Optional[tuple[list[str], list[str]]]] = {}  # per commit: phases share it

    def inputs_of(self, globs: list[str]) -> list[str]:
        return match_inputs(self.files, globs)

    def changed_since(self, commit: str, globs: list[str]) -> Optional[list[str]]:
        """`changed_since` for this tree (None outside a git repository)."""
        if not self.is_git:
            return None
        if commit not in self._since:
            self._since[commit] = changes_since(self.root, commit)
        return changed_since(self.root, commit, globs, self.inputs_of(globs), self._since[commit])

    def observe(self, globs: list[str]) -> Observation:
        """The inputs' hash and stamps now: stamps before and after hashing, so a write while
        hashing shows as a change too."""
        paths = self.inputs_of(globs)
        before = stamps(self.root, paths)
        digest = hash_files(self.root, paths)
        after = stamps(self.root, paths)
        return Observation(digest, {p: (after[p] if before[p] == after[p] else None) for p in paths})

    def hash_of(self, globs: list[str]) -> tuple[str, int]:
        """(inputs hash, number of files) for a phase's input globs."""
        paths = self.inputs_of(globs)
        return hash_files(self.root, paths), len(paths)
