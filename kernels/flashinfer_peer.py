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


def unavailable_reason(backend: str, device=None) -> Optional[str]:
    """None when ``backend`` can run on ``device``; else why not (for a record or a skip)."""
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        backend_class(backend)
    except PeerUnavailable as exc:
        return str(exc)
    major, _ = torch.cuda.get_device_capability(device)
    if backend == "fa3" and major != 9:
        return f"fa3 needs sm_90a, this device is sm_{major}x"
    return None


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

    def __init__(self, backend: str, device="cuda"):
        import torch  # noqa: PLC0415

        self.backend = backend
        self._cls = backend_class(backend)
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
