"""Just-in-time build of the CUDA extension, cached by what determines the binary.

The extension is compiled with nvcc on first use into `cache_root()` ``/<key>/``:
``$KDTREE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/kdtree-engine/jit``, else
``~/.cache/kdtree-engine/jit``. A build writes into a temporary folder and renames it into place,
under a file lock, so concurrent processes never see half a build.

- `archs`: which archs (``$KDTREE_CUDA_ARCHS``, ``$TORCH_CUDA_ARCH_LIST`` or the device in use;
  sm_90 and newer, 9.0 as sm_90a), and CUDA's rules for what runs where;
- `toolchain`: nvcc, the host compiler, pybind11 and Python's headers;
- `cache`: the cache folder, one build under a lock with its log lines, clearing it;
- `extension`: the extension's command, key, build and import;
- `report`: one arch's compile with ptxas' report and the SASS (no GPU needed).

``python -m kdtree.kernels.build --extension`` builds ahead of time what each GPU will load (on a
machine without a GPU, for the archs the variables or ``--arch`` name);
``python -m kdtree.kernels.build --clear-cache`` empties the cache; ``python -m kdtree.kernels.info``
shows the toolkit, the archs and the cache. Nothing here imports torch.
"""

from kdtree.kernels.jit.archs import (ARCH_VARIABLES, MIN_CAPABILITY, SM90A, ArchRequest, arch_defines,
                                      arch_for_capability, can_run, capability_of, check_supported,
                                      extension_archs, gencode, normalize_arch, ptx_arch, requested,
                                      requested_archs, unsupported_reason)
from kdtree.kernels.jit.cache import (HEARTBEAT_S, announce, cache_root, cached_build, cached_builds,
                                      clear_cache)
from kdtree.kernels.jit.extension import (BASE_FLAGS, BINDING_SOURCES, CSRC, KERNEL_SOURCES, MODULE_NAME,
                                          build_extension, build_key, extension_path, extra_flags,
                                          load_extension, load_for_capability, nvcc_threads, source_hash)
from kdtree.kernels.jit.report import SMEM_RECORD_TAG, ArchBuild, SmemRecord, compile_arch, smem_records
from kdtree.kernels.jit.toolchain import JitError, find_cuobjdump, find_nvcc

__all__ = ["ARCH_VARIABLES", "ArchBuild", "ArchRequest", "BASE_FLAGS", "BINDING_SOURCES", "CSRC", "HEARTBEAT_S",
           "JitError", "KERNEL_SOURCES", "MIN_CAPABILITY", "MODULE_NAME", "SM90A", "SMEM_RECORD_TAG", "SmemRecord",
           "announce", "arch_defines", "arch_for_capability", "build_extension", "build_key", "cache_root",
           "cached_build", "cached_builds", "can_run", "capability_of", "check_supported", "clear_cache",
           "compile_arch", "extension_archs", "extension_path", "extra_flags", "find_cuobjdump", "find_nvcc",
           "gencode", "load_extension", "load_for_capability", "normalize_arch", "nvcc_threads", "ptx_arch",
           "requested", "requested_archs", "smem_records", "source_hash", "unsupported_reason"]

# the names engine/kv/native.py builds its own extension with
from kdtree.kernels.jit import toolchain as _toolchain  # noqa: E402

_pybind11_include = _toolchain.pybind11_include
_python_include = _toolchain.python_include
