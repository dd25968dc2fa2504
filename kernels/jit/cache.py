"""The build cache: where builds live, a build made once under a lock, what it says while it runs,
and how to empty the cache.

A build says when it starts (what, which archs, where), every `HEARTBEAT_S` seconds while the
compiler runs, and when it ends, through the ``kdtree.kernels.jit`` logger at INFO. A server
(SGLang configures the root logger) shows those lines with its own; in a process where nothing
has configured logging at all (no handler on the logger or above it), they are written to stderr
instead, since Python would drop them and a first call would sit silent for a minute. A cache hit
is logged at DEBUG only.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from kdtree import envvars
from kdtree.kernels.jit.toolchain import JitError

log = logging.getLogger("kdtree.kernels.jit")

HEARTBEAT_S = 15.0


def announce(message: str, *args: object) -> None:
    """`message` at INFO on the ``kdtree.kernels.jit`` logger, or on stderr where no logging is
    configured at all (module docstring)."""
    if log.hasHandlers():
        log.info(message, *args)
    else:
        sys.stderr.write(f"kdtree.kernels.jit: {message % args if args else message}\n")
        sys.stderr.flush()


def cache_root() -> Path:
    """Where builds are cached: $KDTREE_CACHE_DIR, else $XDG_CACHE_HOME/kdtree-engine/jit, else
    ~/.cache/kdtree-engine/jit."""
    explicit = envvars.KDTREE_CACHE_DIR.get()
    if explicit:
        return Path(explicit)
    xdg = envvars.XDG_CACHE_HOME.get()
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "kdtree-engine" / "jit"


def _run_with_heartbeat(cmd: list[str], what: str, timeout: float, heartbeat: float) -> subprocess.CompletedProcess:
    start = time.monotonic()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        while True:
            left = timeout - (time.monotonic() - start)
            try:
                out, err = proc.communicate(timeout=max(0.0, min(heartbeat, left)))
                return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                if time.monotonic() - start >= timeout:
                    proc.kill()
                    proc.communicate()
                    raise
                announce("%s: still compiling (%.0f s so far)", what, time.monotonic() - start)


def cached_build(root: Path, key: str, filename: str, command: Callable[[Path], list[str]], what: str, *,
                 error: type[Exception] = JitError, timeout: float = 1800, verbose: bool = False,
                 heartbeat: Optional[float] = None, note: str = "") -> Path:
    """`root/key/filename`, built on first use by `command(output path)`: the command writes into a
    temporary folder that is renamed into place under a file lock, so concurrent processes never
    load half a build (a leftover folder of the same key is replaced). A failing command raises
    `error` saying "`what` failed" with the command and its output. `note` is added to the line
    that says the build started (e.g. where its archs came from)."""
    target_dir = root / key
    out_path = target_dir / filename
    if out_path.exists():
        log.debug("%s: cached at %s", what, out_path)
        return out_path
    root.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # noqa: PLC0415

    with FileLock(str(root / f"{key}.lock"), timeout=timeout):
        if out_path.exists():
            log.debug("%s: built meanwhile by another process at %s", what, out_path)
            return out_path
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        cmd = command(tmp / filename)
        announce("%s: started, into %s (once per cache key; this takes a minute or so)%s", what, target_dir,
                 f"; {note}" if note else "")
        start = time.monotonic()
        try:
            proc = _run_with_heartbeat(cmd, what, timeout, HEARTBEAT_S if heartbeat is None else heartbeat)
        except subprocess.TimeoutExpired:
            shutil.rmtree(tmp, ignore_errors=True)
            raise error(f"{what} did not finish within {timeout:.0f} s:\n" + " ".join(cmd)) from None
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            log.error("%s: failed after %.1f s", what, time.monotonic() - start)
            raise error(f"{what} failed:\n" + " ".join(cmd) + "\n" + proc.stdout[-4000:] + proc.stderr[-4000:])
        if verbose and (proc.stdout or proc.stderr):
            log.info("%s: compiler output:\n%s", what, (proc.stdout + proc.stderr).rstrip())
        (tmp / "command.txt").write_text(" ".join(cmd) + "\n")
        if target_dir.exists():
            shutil.rmtree(target_dir)
        os.replace(tmp, target_dir)
        announce("%s: done in %.1f s: %s", what, time.monotonic() - start, out_path)
    return out_path


def cached_builds(root: Optional[Path] = None) -> list[Path]:
    """The build folders in the cache (the extension's keys and ``native/``'s)."""
    root = cache_root() if root is None else root
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.iterdir()):
        if path.is_dir() and not path.name.startswith("."):
            found.extend(sorted(p for p in path.iterdir() if p.is_dir()) if path.name == "native" else [path])
    return found


def clear_cache(root: Optional[Path] = None) -> tuple[int, int]:
    """Remove every build under the cache, and temporary folders left by builds that died (older
    than an hour); returns (builds removed, bytes freed). A build running meanwhile in another
    process keeps its temporary folder and lock, and renames its result into place as usual."""
    root = cache_root() if root is None else root
    if not root.is_dir():
        return 0, 0
    folders = len(cached_builds(root))
    stale = time.time() - 3600
    doomed = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()
              and (not p.name.startswith(".") or p.stat().st_mtime < stale)]
    freed = sum(f.stat().st_size for d in doomed for f in d.rglob("*") if f.is_file() and not f.is_symlink())
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return folders, freed
