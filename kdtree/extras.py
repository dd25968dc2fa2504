"""Which extra of kdtree-engine installs a missing dependency, and the one line that says so.

The CPU-only install (``pip install .``) has no torch: the orchestrator, ``kdtree.kernels.info``
and ``kdtree.kernels.build`` work without it; everything that runs tensors needs the ``gpu``
extra (or ``sglang``, which brings torch too). `missing` makes the error, and
`install_excepthook` turns such an error, ending a ``python -m kdtree...`` program, into that one
line instead of a traceback (exit status 1). Standard library only.
"""

from __future__ import annotations

import sys
from typing import Optional

__all__ = ["EXTRA_OF", "install_excepthook", "message", "missing"]

#: the top-level module -> the extra that installs it
EXTRA_OF = {"torch": "gpu", "numpy": "gpu", "triton": "gpu", "pybind11": "gpu", "matplotlib": "gpu",
            "sglang": "sglang", "transformers": "test", "hypothesis": "test", "pytest": "test"}


def message(module: str, what: Optional[str] = None) -> str:
    """``<what> needs torch, which is not installed here: pip install "kdtree-engine[gpu]" ...``."""
    extra = EXTRA_OF.get(module.split(".")[0], "gpu")
    who = what or "this"
    return (f"{who} needs {module}, which is not installed here: install the '{extra}' extra "
            f"(pip install \".[{extra}]\" from a clone, or \"kdtree-engine[{extra}]\" from the wheel)")


def missing(module: str, what: Optional[str] = None) -> ModuleNotFoundError:
    """The ModuleNotFoundError to raise for `module`, naming the extra that installs it."""
    return ModuleNotFoundError(message(module, what), name=module)


def _program() -> str:
    argv = list(getattr(sys, "orig_argv", []))
    if "-m" in argv[:-1]:
        return f"python -m {argv[argv.index('-m') + 1]}"
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return f"python -m {spec.name.removesuffix('.__main__')}" if spec is not None else "python"


def install_excepthook() -> None:
    """Make a ModuleNotFoundError for a dependency of an extra end the program with one line."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        name = getattr(exc, "name", None) or ""
        if issubclass(exc_type, ModuleNotFoundError) and name.split(".")[0] in EXTRA_OF:
            sys.stderr.write(f"{_program()}: {message(name.split('.')[0])}\n")
            return
        previous(exc_type, exc, tb)

    hook.kdtree_extras = True  # type: ignore[attr-defined]
    if not getattr(previous, "kdtree_extras", False):
        sys.excepthook = hook
