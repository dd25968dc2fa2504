"""Import SGLang's attention test kit on a machine that lacks some of SGLang's unrelated
dependencies (networking, notebooks, quantization formats): each missing top-level module is
replaced by an inert stand-in and named, so a test can say exactly what it stubbed. Modules the
attention path itself needs (torch, triton, sglang) are never stubbed."""

from __future__ import annotations

import importlib
import sys
import types

NEVER_STUB = {"torch", "triton", "sglang", "numpy", "kdtree"}


class _StubModule(types.ModuleType):
    """A module whose every attribute is a fresh empty class (subclassable, callable, no effect)."""

    __path__: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})
        setattr(self, name, value)
        return value


def import_with_stubs(names: list[str], max_stubs: int = 30) -> tuple[list[types.ModuleType], list[str]]:
    """Import ``names``; on a missing third-party module, stub it and retry. Returns the modules
    and the stubbed module names, in the order they were found missing."""
    stubbed: list[str] = []
    while True:
        try:
            return [importlib.import_module(n) for n in names], stubbed
        except ModuleNotFoundError as err:
            missing = err.name or ""
            top = missing.split(".")[0]
            if not missing or top in NEVER_STUB or missing in stubbed or len(stubbed) >= max_stubs:
                raise
            for part in _parents(missing):
                if part not in sys.modules:
                    sys.modules[part] = _StubModule(part)
            stubbed.append(missing)


def _parents(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]

