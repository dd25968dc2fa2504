"""How the kernel sources are laid out (kernels/csrc), checked on the text, no compiler needed:
every -D build switch has its default in knobs.cuh and nowhere else, no other file chooses code
with `#if` on one, the PTX wrappers are split by architecture (nothing sm_90+ in the sm_80 header,
nothing sm_90a-only outside the wgmma header), and a build for any arch but sm_90a includes no
sm_90a-only file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from kdtree.kernels.jit import CSRC

KNOBS = CSRC / "knobs.cuh"
SOURCES = sorted(p for p in CSRC.iterdir() if p.suffix in (".cu", ".cuh", ".h", ".cpp"))
REPO = CSRC.parents[1]

_DEFAULT = re.compile(r"^#ifndef (\w+)\n#define \1\b", re.M)
_CONDITION = re.compile(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b(.*)$", re.M)
_INCLUDE = re.compile(r'^\s*#include "([^"]+)"', re.M)


def _knobs() -> set[str]:
    return set(_DEFAULT.findall(KNOBS.read_text()))


def test_every_knob_default_lives_in_knobs_header():
    knobs = _knobs()
    assert {"KD_BREAK", "KD_SKIP", "WS_BN", "WS_STAGES"} <= knobs
    elsewhere = {p.name: _DEFAULT.findall(p.read_text()) for p in SOURCES if p != KNOBS}
    assert {name: found for name, found in elsewhere.items() if found} == {}


def test_every_knob_is_documented_in_the_header_comment():
    comment = "\n".join(line for line in KNOBS.read_text().splitlines() if line.startswith("//"))
    assert [k for k in sorted(_knobs()) if k not in comment] == []


def test_no_file_but_the_knobs_header_chooses_code_by_knob():
    knobs = _knobs()
    offending = []
    for path in SOURCES:
        if path == KNOBS:
            continue
        for condition in _CONDITION.findall(path.read_text()):
            named = set(re.findall(r"\w+", condition)) & knobs
            if named:
                offending.append((path.name, condition.strip()))
    assert offending == []


def test_superseded_wgmma_knobs_are_gone():
    texts = [p.read_text() for p in SOURCES] + [p.read_text() for p in (REPO / "scripts").glob("*.sh")]
    for knob in ("KD_WG_PRODUCER", "KD_WG_PFREE_ARRIVE"):
        assert not any(knob in text for text in texts), knob


def _code(path: Path) -> str:
    """The file without its // comments (the instructions are what matter)."""
    return re.sub(r"//[^\n]*", "", path.read_text())


@pytest.mark.parametrize("header, forbidden", [
    ("mma_sm80.cuh", ("mbarrier", "cp.async.bulk", "fence.proxy", "wgmma", "setmaxnreg")),
    ("mbarrier_sm90.cuh", ("wgmma", "setmaxnreg", "tcgen05")),
])
def test_ptx_wrappers_are_split_by_arch(header, forbidden):
    code = _code(CSRC / header)
    assert [word for word in forbidden if word in code] == []


def test_wgmma_lives_only_in_the_sm90a_files():
    users = sorted(p.name for p in SOURCES if "wgmma." in _code(p) or "setmaxnreg" in _code(p))
    assert users == ["tree_verify_mla_sm90a.cuh", "wgmma_sm90a.cuh"]


def _includes(name: str, seen: set[str]) -> set[str]:
    if name in seen or not (CSRC / name).exists():
        return seen
    seen.add(name)
    for inc in _INCLUDE.findall((CSRC / name).read_text()):
        _includes(inc, seen)
    return seen


def test_non_sm90a_builds_include_no_sm90a_file():
    """tree_verify_mla.cu, with its `#if KDTREE_SM90A` blocks (sm_90a builds only) left out."""
    unit = re.sub(r"#if KDTREE_SM90A\n.*?#endif\n", "", (CSRC / "tree_verify_mla.cu").read_text(), flags=re.S)
    assert "KDTREE_SM90A" not in unit
    reached: set[str] = set()
    for inc in _INCLUDE.findall(unit):
        _includes(inc, reached)
    assert "tree_verify_mla_ws.cuh" in reached and "mbarrier_sm90.cuh" in reached
    assert sorted(n for n in reached if "sm90a" in n) == []


@pytest.mark.parametrize("args, message", [
    ([], "REV_A REV_B [BUILD ...]"),
    (["HEAD"], "REV_A REV_B [BUILD ...]"),
    (["HEAD", "HEAD", "compute_90"], "build 'compute_90': expected sm_NN"),
])
def test_sass_compare_refuses_bad_arguments(args, message):
    proc = subprocess.run(["bash", str(REPO / "scripts" / "sass-compare.sh"), *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == ""
