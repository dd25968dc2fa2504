"""FlashInfer's MLA kernels as measured peers: FA2 (mma.sync, sm_80+) and FA3 (wgmma, sm_90a).

FlashInfer 0.7.2 ships no tree mask for MLA, so a peer is timed on the **causal chain** of the
same shapes: the prefix, then the T draft slots as a chain. That is the work of a tree of T nodes
(every node reads the whole prefix; the tree part is <= T^2 of H*T*(L+T) scores), so ours with the
tree mask against the peer's chain is the comparison users make.

Nothing of FlashInfer is vendored: it is imported at run time from an installed or unpacked copy
(``flashinfer`` on ``sys.path``; the GPU machine gets a trimmed wheel carried git-ignored). The
package ``__init__`` pulls in modules that machine lacks, so the MLA backend modules are imported
beneath empty parent packages. Planning syncs the host (FlashInfer plans on the CPU), so a peer is
planned once per input set with `FlashInferMLA.bind` and the returned call only launches.

**FA2 as another GPU builds it** (``FlashInferMLA("fa2", smem_per_sm=...)``): FlashInfer's FA2 MLA
picks its tile from the device's shared memory per SM (2 stages of 64 keys on Hopper's 233472 B,
1 stage of 16 keys on sm_120's 102400 B). The limited peer is a second JIT module in the same
process: FlashInfer's own build spec for the same arguments, renamed (``..._smem102400``) and
compiled against an include tree whose ``attention/mla.cuh`` reads that figure instead of
asking the device (`limited_include_tree`; every other header is a link to FlashInfer's), with
FlashInfer's Python-side plan checks told the same limits while it plans. Both builds can then
be timed interleaved against our kernel.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Callable, Optional

BACKENDS = ("fa2", "fa3")
_WORKSPACE_BYTES = 256 << 20
_MODULES = {
    "fa2": ("flashinfer.mla._batch_mla._backends.fa2_backend", "_BatchMLAPagedAttentionFa2Backend"),
    "fa3": ("flashinfer.mla._batch_mla._backends.fa3_backend", "_BatchMLAPagedAttentionFa3Backend"),
}
_PARENTS = ("flashinfer", "flashinfer.mla", "flashinfer.mla._batch_mla")
SM120_SMEM_PER_SM = 102400  # what an sm_120 device reports as shared memory per SM
SM120_SMEM_PER_BLOCK = 101376  # its opt-in per-block maximum
# The statement of FlashInfer 0.7.2's mla.cuh that asks the device for its shared memory per SM.
SMEM_QUERY = "cudaDeviceGetAttribute(&smem_limit_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);"
MLA_HEADER = ("flashinfer", "attention", "mla.cuh")


class PeerUnavailable(RuntimeError):
    """FlashInfer (or the backend asked for) cannot run here; the message says why."""


def _package_dir() -> Path:
    loaded = sys.modules.get("flashinfer")
    if loaded is not None and getattr(loaded, "__path__", None):
        return Path(list(loaded.__path__)[0])
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        raise PeerUnavailable("flashinfer is not importable (put FlashInfer 0.7.2 on sys.path)")
    return Path(list(spec.submodule_search_locations)[0])


def _stub_parents(root: Path) -> None:
    for name in _PARENTS:
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = module


def backend_class(backend: str):
    """The FlashInfer backend class for ``backend`` ("fa2" or "fa3"), imported beneath stubs."""
    if backend not in _MODULES:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    _stub_parents(_package_dir())
    module_name, cls_name = _MODULES[backend]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PeerUnavailable(f"flashinfer {backend}: {exc}") from exc
    return getattr(module, cls_name)


def unavailable_reason(backend: str, device=None, smem_per_sm: Optional[int] = None) -> Optional[str]:
    """None when ``backend`` can run on ``device`` (built for ``smem_per_sm`` bytes of shared memory
    per SM when given: fa2 only); else why not (for a record or a skip)."""
    import torch  # noqa: PLC0415

    if smem_per_sm is not None and backend != "fa2":
        return f"{backend}: only fa2 can be built for another shared-memory size"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        cls = backend_class(backend)
        if smem_per_sm is not None:
            smem_limited_class(cls, smem_per_sm)
            mla_header(_package_dir() / "data" / "include")
    except PeerUnavailable as exc:
        return str(exc)
    major, _ = torch.cuda.get_device_capability(device)
    if backend == "fa3" and major != 9:
        return f"fa3 needs sm_90a, this device is sm_{major}x"
    return None


def patch_smem_query(text: str, smem_per_sm: int) -> str:
    """mla.cuh's text with its shared-memory query replaced by ``smem_limit_per_sm = N;``.
    Raises PeerUnavailable unless the query occurs exactly once (another FlashInfer version)."""
    found = text.count(SMEM_QUERY)
    if found != 1:
        raise PeerUnavailable(f"FlashInfer's mla.cuh holds its shared-memory query {found} times, not once: "
                              f"this FlashInfer cannot be built for {smem_per_sm} B per SM here (0.7.2 can)")
    return text.replace(SMEM_QUERY, f"smem_limit_per_sm = {int(smem_per_sm)};")


def mla_header(include_dir: Path) -> Path:
    """FlashInfer's mla.cuh under its include dir; PeerUnavailable when it is not there."""
    header = include_dir.joinpath(*MLA_HEADER)
    if not header.is_file():
        raise PeerUnavailable(f"FlashInfer's {'/'.join(MLA_HEADER)} is not under {include_dir}")
    return header


def limited_include_tree(include_dir: Path, dest: Path, smem_per_sm: int) -> Path:
    """``dest``: FlashInfer's ``include_dir`` as links, except ``flashinfer/attention/mla.cuh``, a
    copy built for ``smem_per_sm`` (`patch_smem_query`). Relative includes resolve inside the
    tree, so every header sees the patched one. Built beside ``dest`` and renamed into place; an
    existing tree whose header already holds the patch is reused."""
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    patched = patch_smem_query(mla_header(include_dir).read_text(), smem_per_sm)
    have = dest.joinpath(*MLA_HEADER)
    if have.is_file() and have.read_text() == patched:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    for entry in include_dir.iterdir():
        if entry.name != MLA_HEADER[0]:
            (tmp / entry.name).symlink_to(entry.resolve())
    for entry in (include_dir / MLA_HEADER[0]).iterdir():
        if entry.name != MLA_HEADER[1]:
            (tmp / MLA_HEADER[0]).mkdir(exist_ok=True)
            (tmp / MLA_HEADER[0] / entry.name).symlink_to(entry.resolve())
    attention = tmp / MLA_HEADER[0] / MLA_HEADER[1]
    attention.mkdir(parents=True)
    for entry in (include_dir / MLA_HEADER[0] / MLA_HEADER[1]).iterdir():
        if entry.name != MLA_HEADER[2]:
            (attention / entry.name).symlink_to(entry.resolve())
    (attention / MLA_HEADER[2]).write_text(patched)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest


def smem_limited_class(cls, smem_per_sm: int, smem_per_block: int = SM120_SMEM_PER_BLOCK):
    """A subclass of FlashInfer's FA2 backend class whose plan builds and loads the module for a
    device with ``smem_per_sm`` bytes of shared memory per SM (module docstring). Raises
    PeerUnavailable when this FlashInfer lacks the hooks it relies on."""
    import dataclasses  # noqa: PLC0415

    backend_module = sys.modules.get(cls.__module__)
    common = sys.modules.get(cls.__module__.rsplit(".", 1)[0] + "._fa_common")
    try:
        jit = importlib.import_module("flashinfer.jit")
        jit_env = importlib.import_module("flashinfer.jit.env")
    except ImportError as exc:
        raise PeerUnavailable(f"flashinfer.jit: {exc}") from exc
    needs = [(backend_module, "get_batch_mla_module"), (common, "_get_fa_shared_memory_limits"),
             (jit, "gen_batch_mla_module"), (jit_env, "FLASHINFER_GEN_SRC_DIR")]
    missing = [name for module, name in needs if module is None or not hasattr(module, name)]
    if missing:
        raise PeerUnavailable(f"this FlashInfer lacks {missing}: its FA2 cannot be built for {smem_per_sm} B per SM "
                              f"here (0.7.2 can)")
    include = Path(jit_env.FLASHINFER_GEN_SRC_DIR) / f"kdtree_include_smem{smem_per_sm}"
    loaded: dict = {}

    def limited_module(backend: str, *args):
        if args not in loaded:
            tree = limited_include_tree(_package_dir() / "data" / "include", include, smem_per_sm)
            spec = jit.gen_batch_mla_module(backend, *args)
            spec = dataclasses.replace(spec, name=f"{spec.name}_smem{smem_per_sm}",
                                       extra_include_dirs=[tree, *(spec.extra_include_dirs or [])])
            loaded[args] = spec.build_and_load()
        return loaded[args]

    class SmemLimited(cls):
        def plan(self, *args, **kwargs):
            saved = backend_module.get_batch_mla_module, common._get_fa_shared_memory_limits
            backend_module.get_batch_mla_module = limited_module
            common._get_fa_shared_memory_limits = lambda device: (smem_per_sm, smem_per_block)
            try:
                return super().plan(*args, **kwargs)
            finally:
                backend_module.get_batch_mla_module, common._get_fa_shared_memory_limits = saved

    SmemLimited.__name__ = f"{cls.__name__}_smem{smem_per_sm}"
    return SmemLimited


def version() -> Optional[str]:
    """FlashInfer's version string, read without importing its package __init__."""
    try:
        text = (_package_dir() / "_build_meta.py").read_text()
    except (PeerUnavailable, OSError):
        return None
    for line in text.splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("'\"")
    return None


class FlashInferMLA:
    """One FlashInfer MLA backend bound to our op contract's tensors (causal chain mask)."""

    def __init__(self, backend: str, device="cuda", smem_per_sm: Optional[int] = None):
        import torch  # noqa: PLC0415

        if smem_per_sm is not None and backend != "fa2":
            raise ValueError(f"smem_per_sm: only fa2 can be built for another shared-memory size, not {backend!r}")
        self.backend = backend
        self.smem_per_sm = smem_per_sm
        self._cls = backend_class(backend)
        if smem_per_sm is not None:
            self._cls = smem_limited_class(self._cls, smem_per_sm)
        self.device = torch.device(device)
        self._workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)

    def bind(self, q, kv_cache, qo_indptr, kv_indptr, kv_indices, sm_scale: float,
             out=None) -> Callable[[], object]:
        """Plan for these tensors (host sync) and return a call that only launches.

        q [Nq, H, 576] bf16, kv_cache [S, 576] bf16, int32 indptrs/indices as in our contract;
        each request's last T_b slots are its chain. The call writes and returns ``out``
        [Nq, H, 512] (allocated here when not given)."""
        import torch  # noqa: PLC0415

        num_heads = q.shape[1]
        kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
        impl = self._cls(
            float_workspace_buffer=self._workspace, use_cuda_graph=False,
            qo_indptr_buf=None, kv_indptr_buf=None, kv_indices_buf=None, kv_len_arr_buf=None,
            query_split_widths=(512, 64), kv_split_widths=(512, 64))
        impl.plan(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_lens,
                  num_heads=num_heads, head_dim_ckv=512, head_dim_kpe=64, page_size=1, causal=True,
                  sm_scale=float(sm_scale), q_data_type=q.dtype, kv_data_type=kv_cache.dtype,
                  output_dtype=q.dtype, scale_mode="default", use_profiler=False)
        q_nope, q_pe = q[..., :512], q[..., 512:]
        ckv = kv_cache[:, :512].unsqueeze(1)  # [S, page_size=1, 512], row stride 576
        kpe = kv_cache[:, 512:].unsqueeze(1)
        if out is None:
            out = torch.empty(q.shape[0], num_heads, 512, dtype=q.dtype, device=q.device)

        def call():
            impl.run_from_wrapper(query=(q_nope, q_pe), kv_cache=(ckv, kpe), out=out, lse=None,
                                  return_lse=False, profiler_buffer=None, kv_len=None, page_table=None,
                                  return_lse_base_on_e=False, o_scale=None, ckv_scale=None,
                                  ckv_scale_arr=None, kpe_scale=None)
            return out

        return call


def chain_mask(qo_indptr, device=None):
    """Packed masks of a chain per request (node t sees nodes 0..t): what the peers compute."""
    from kdtree.kernels.masks import pack_tree_masks  # noqa: PLC0415

    lens = [int(b) - int(a) for a, b in zip(qo_indptr[:-1].tolist(), qo_indptr[1:].tolist())]
    return pack_tree_masks([[t - 1 for t in range(n)] for n in lens], device=device)
