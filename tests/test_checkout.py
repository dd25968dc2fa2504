"""The checkout's top-level folders never shadow PyPI packages of the same name (kdtree.checkout)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

from kdtree import checkout

ROOT = Path(__file__).resolve().parent.parent


def test_checkout_root_is_this_repository():
    assert checkout.checkout_root() == ROOT


def test_shadowing_entries_name_the_root_in_every_spelling(monkeypatch):
    monkeypatch.chdir(ROOT)
    path = ["", ".", str(ROOT), str(ROOT / "tests"), "/usr/lib/python3/dist-packages"]
    assert checkout.shadowing_entries(path) == ["", ".", str(ROOT)]


def test_shadowing_entries_ignore_the_current_directory_elsewhere(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert checkout.shadowing_entries(["", "."]) == []


def test_unshadow_removes_the_root_and_evicts_only_our_top_level_modules(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", ["", str(ROOT), "/somewhere/site-packages", str(ROOT)])
    ours = types.ModuleType("kernels")
    ours.__file__ = str(ROOT / "kernels" / "__init__.py")
    theirs = types.ModuleType("tools")
    theirs.__file__ = "/somewhere/site-packages/tools/__init__.py"
    monkeypatch.setitem(sys.modules, "kernels", ours)
    monkeypatch.setitem(sys.modules, "tools", theirs)

    removed = checkout.unshadow()

    assert removed == ["", str(ROOT), str(ROOT)]
    assert sys.path == ["/somewhere/site-packages"]
    assert "kernels" not in sys.modules
    assert sys.modules["tools"] is theirs

