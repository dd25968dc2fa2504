"""SGLang's own Triton attention kernels (``extend_attention_fwd`` for target verify,
``decode_attention_fwd`` for decode), loaded from the installed sglang wheel.

The GPU checks compare the backend with SGLang's real kernel. ``import sglang...`` runs the
package's ``__init__`` files, which pull in most of SGLang's serving stack (zmq, PIL, psutil,
requests, transformers patches, ...); a GPU machine without network may not have all of it.
`load_extend_attention` (and `load_decode_attention`) tries the normal import first; when that fails it loads the same files
of the wheel with the package ``__init__`` files skipped, giving the two modules outside the
kernel files that they import (``sglang.srt.utils``: platform predicates; ``sglang.srt.environ``
loads as is) from `_platform_shim`: the kernel's code is SGLang's, byte for byte. It says which
way it went and, for the fallback, why the normal import failed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Callable

_PACKAGES = ("sglang", "sglang.srt", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention")
_KERNEL = "sglang.kernels.ops.attention.extend_attention"
_DECODE_KERNEL = "sglang.kernels.ops.attention.decode_attention"


def _platform_shim() -> types.ModuleType:
    """Our stand-in for ``sglang.srt.utils``: the five predicates the kernel files read, on CUDA."""
    import torch  # noqa: PLC0415

    shim = types.ModuleType("sglang.srt.utils")
    shim.is_cuda = lambda: torch.version.cuda is not None and torch.cuda.is_available()
    shim.is_hip = lambda: getattr(torch.version, "hip", None) is not None
    shim.is_gfx95_supported = lambda: False
    shim.is_gfx1250_supported = lambda: False
    shim.get_device_core_count = lambda device_id=0: torch.cuda.get_device_properties(device_id).multi_processor_count
    return shim


def load_extend_attention() -> tuple[Callable, str]:
    """(extend_attention_fwd, how it was loaded); ImportError with both reasons if neither way works."""
    return _load_kernel(_KERNEL, "extend_attention_fwd")


def load_decode_attention() -> tuple[Callable, str]:
    """(decode_attention_fwd, how it was loaded), the same two ways as `load_extend_attention`."""
    return _load_kernel(_DECODE_KERNEL, "decode_attention_fwd")


def _load_kernel(kernel: str, attr: str) -> tuple[Callable, str]:
    try:
        module = importlib.import_module(kernel)
        return getattr(module, attr), "import sglang (the installed wheel, normally)"
    except Exception as err:  # noqa: BLE001 - any failure of SGLang's import chain
        first = f"{type(err).__name__}: {err}"
    loaded = sys.modules.get("sglang")  # left by the failed import when sglang has no __init__ (a trimmed copy)
    if loaded is not None and getattr(loaded, "__path__", None):
        roots = list(loaded.__path__)
    else:
        spec = importlib.util.find_spec("sglang")
        roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    if not roots:
        raise ImportError(f"sglang is not installed ({first})")
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]  # half-imported leftovers of the failed import
    before = set(sys.modules)
    try:
        for name in _PACKAGES:
            pkg = types.ModuleType(name)
            pkg.__path__ = [roots[0] + name[len("sglang"):].replace(".", "/")]
            sys.modules[name] = pkg
        sys.modules["sglang.srt.utils"] = _platform_shim()
        module = importlib.import_module(kernel)
        return getattr(module, attr), f"the wheel's kernel files, package __init__s skipped (import sglang failed: {first})"
    except Exception as err:  # noqa: BLE001
        raise ImportError(f"import sglang failed ({first}); loading the kernel files failed too: "
                          f"{type(err).__name__}: {err}") from err
    finally:
        for name in set(sys.modules) - before:
            if name == "sglang" or name.startswith("sglang."):
                del sys.modules[name]
