"""Import SGLang's attention test kit on a machine that lacks some of SGLang's unrelated
dependencies (networking, notebooks, quantization formats): each missing top-level module is
replaced by an inert stand-in and named, so a test can say exactly what it stubbed. Modules the
attention path itself needs (torch, triton, sglang) are never stubbed."""

from __future__ import annotations

import importlib
import sys
import types

NEVER_STUB = {"torch", "triton", "sglang", "numpy", "kdtree"}

#: names of stubs that were called or instantiated, in order: a stub that does work the kit's
#: result depends on (an ``sgl_kernel`` op) silently does nothing, so a test reads this list
STUB_CALLS: list[str] = []


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class _StubMeta(type):
    """Stub classes answer any attribute with another stub class (``logger.enable(...)`` works)."""

    def __getattr__(cls, name: str):
        if _dunder(name):
            raise AttributeError(name)
        return _stub_class(f"{cls.__name__}.{name}")


def _stub_init(self, *args, **kwargs) -> None:
    STUB_CALLS.append(type(self).__name__)


def _stub_call(self, *args, **kwargs) -> None:
    STUB_CALLS.append(f"{type(self).__name__}()")


def _stub_getattr(self, name: str):
    if _dunder(name):
        raise AttributeError(name)
    return _stub_class(name)


def _stub_class(name: str) -> type:
    return _StubMeta(name, (), {"__init__": _stub_init, "__call__": _stub_call,
                                "__getattr__": _stub_getattr,
                                "__init_subclass__": classmethod(lambda cls, **kwargs: None)})


class _StubModule(types.ModuleType):
    """A module whose every attribute is a fresh stub class (subclassable, callable, no effect)."""

    __path__: list[str] = []

    def __getattr__(self, name: str):
        if _dunder(name):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder:
    """Finds any submodule of a stubbed package (``from sgl_kernel.utils import x`` at call time)."""

    def __init__(self, roots: set[str]):
        self.roots = roots

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname.split(".")[0] not in self.roots:
            return None
        import importlib.machinery  # noqa: PLC0415

        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module) -> None:
        pass


_finder = _StubFinder(set())


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
            _finder.roots.add(top)
            if _finder not in sys.meta_path:
                sys.meta_path.append(_finder)
            stubbed.append(missing)


def _parents(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]

