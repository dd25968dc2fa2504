"""A phase's inputs: the files its globs match, and one hash over their paths and contents.

The candidate files are those git would commit (tracked, plus untracked files that are not
ignored: ``git ls-files -co --exclude-standard``), so a build product or cache never makes a phase
stale, and a checkpoint commit holds exactly the files that were hashed. In a folder that is not
a git repository every file is a candidate except `_JUNK` (caches, build outputs, .git).

Globs are relative to the repo root: ``*`` and ``?`` stay within one path segment, ``**`` spans
any number of segments (``kernels/csrc/**`` is everything below ``kernels/csrc``).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Optional

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
            out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root,
                                 capture_output=True, check=True).stdout
            paths = {p for p in out.decode("utf-8", "surrogateescape").split("\0") if p}
            return sorted(p for p in paths if (root / p).is_file())
        except (OSError, subprocess.CalledProcessError):
            pass  # no git binary: fall back to walking
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _JUNK_DIRS]
        rel = os.path.relpath(dirpath, root)
        for name in filenames:
            if not name.endswith(_JUNK_SUFFIXES):
                found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return sorted(found)


def match_inputs(files: list[str], globs: list[str]) -> list[str]:
    """The files matched by any of ``globs``, sorted."""
    regexes = [glob_regex(g) for g in globs]
    return [f for f in files if any(r.match(f) for r in regexes)]


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
    out = subprocess.run(["git", *args], cwd=root, capture_output=True, check=True).stdout
    return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def changed_since(root: Path, commit: str, globs: list[str], current: list[str]) -> Optional[list[str]]:
    """The input files (matched by ``globs``) that differ between ``commit`` and the working tree:
    edited, added (untracked ones included) or removed; ``current`` is today's list of inputs.
    None when git cannot say (no git binary, a commit this clone does not have)."""
    try:
        then = set(match_inputs(_git_names(root, "ls-tree", "-r", "-z", "--name-only", commit), globs))
        edited = set(match_inputs(_git_names(root, "diff", "--name-only", "-z", commit, "--"), globs))
    except (OSError, subprocess.CalledProcessError):
        return None
    now = set(current)
    return sorted((edited & (then | now)) | (then ^ now))


class InputsIndex:
    """The candidate files of one tree, listed once and shared by every phase's hash."""

    def __init__(self, root: Path, is_git: bool):
        self.root, self.is_git = root, is_git
        self.files = candidate_files(root, is_git)

    def inputs_of(self, globs: list[str]) -> list[str]:
        return match_inputs(self.files, globs)

    def changed_since(self, commit: str, globs: list[str]) -> Optional[list[str]]:
        """`changed_since` for this tree (None outside a git repository)."""
        return changed_since(self.root, commit, globs, self.inputs_of(globs)) if self.is_git else None

    def hash_of(self, globs: list[str]) -> tuple[str, int]:
        """(inputs hash, number of files) for a phase's input globs."""
        paths = self.inputs_of(globs)
        return hash_files(self.root, paths), len(paths)
