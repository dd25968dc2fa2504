"""The kit importer stubs only what is missing and unrelated, and names every stub."""

import sys

import pytest

from sglang_kit_imports import import_with_stubs


def test_missing_dependencies_are_stubbed_and_named(tmp_path, monkeypatch):
    (tmp_path / "kitmod_a.py").write_text(
        "import kit_absent_net\nfrom kit_absent_q.sub import Scheme\n"
        "class Sock(kit_absent_net.Socket):\n    pass\nkit_absent_net.logger.enable('x')\n"
        "Scheme().anything(1)\nclass Typed(Scheme, total=False):\n    pass\nVALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (mod,), stubbed = import_with_stubs(["kitmod_a"])
    assert mod.VALUE == 7
    from kit_absent_net.later.deep import thing  # a submodule imported only at call time

    assert thing is not None
    from sglang_kit_imports import STUB_CALLS

    before = len(STUB_CALLS)
    mod.Scheme()
    assert STUB_CALLS[before:] == ["kit_absent_q.sub.Scheme"]  # what a stub was asked to do is on record
    assert stubbed == ["kit_absent_net", "kit_absent_q"]  # submodules come from the stub finder
    for name in ["kitmod_a", *stubbed]:
        sys.modules.pop(name, None)


def test_a_missing_attention_dependency_is_never_stubbed(tmp_path, monkeypatch):
    (tmp_path / "kitmod_b.py").write_text("import triton.kit_absent_language\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError):
        import_with_stubs(["kitmod_b"])
