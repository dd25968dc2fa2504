"""kdtree-engine: the `kdtree` namespace.

The project's folders live at the top level of the repository (orchestrator/, phases/, gates/,
kernels/, engine/) and are mapped into this namespace by pyproject's package-dir, so they import
as `kdtree.orchestrator`, `kdtree.kernels`, ... and never collide with unrelated PyPI packages
such as `kernels` in an SGLang environment (from the repository root, see `kdtree.checkout`).
"""

__all__ = ["__version__"]

# The package's one version: pyproject reads it (dynamic version), the CLIs' --version print it.
__version__ = "0.2.0"

# `python -m kdtree.<program>` (sys.argv[0] is "-m" while the module is found): a dependency of an
# extra that is not installed ends the program with one line naming the extra, not a traceback
import sys as _sys  # noqa: E402

if _sys.argv[:1] == ["-m"]:
    from kdtree.extras import install_excepthook as _install_excepthook

    _install_excepthook()
