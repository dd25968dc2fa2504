"""FlashMLA's dense MLA decode (the ``sgl-flash-mla`` 1.0.0 wheel) as a measured Hopper peer.

FlashMLA takes no tree mask: like the FlashInfer peers (`kdtree.bench.flashinfer_peer`) it is
timed on the **causal chain** of the same shapes (H, T query rows per request, B requests, L
prefix keys, latent 512 + rope 64, bf16, the same softmax scale), here in its best case: the
request's rows copied into its paged KV cache of 64-token pages (contiguous pages, one block table
row per request), outside any timed region. With ``causal=True`` and ``s_q = T`` query rows, row t
of a request of n keys sees keys 0 .. n - T + t: the prefix, then the chain's nodes 0..t.

Nothing of FlashMLA is vendored: ``flash_mla`` is imported at run time from an installed or
unpacked wheel (on ``sys.path``; the GPU machine gets the wheel carried git-ignored in
``.peers-carry``). In 1.0.0 dense decoding lives only in the wheel's legacy extension (the one
built for SM90), reached with ``use_legacy=True``; importing the package loads both of its
extensions with ``torch.ops.load_library``, so a torch whose ABI the wheel was not built for fails
at import, and `unavailable_reason` says so with the loader's text.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

PAGE_SIZE = 64  # FlashMLA's dense decode takes 64-token pages (its best case, and the size it documents)
HEAD_DIM_QK = 576  # latent 512 + rope 64
HEAD_DIM_V = 512
WHEEL = "sgl-flash-mla 1.0.0"


class PeerUnavailable(RuntimeError):
    """FlashMLA's dense decode cannot run here; the message says why."""


def load():
    """The ``flash_mla`` module (imported once; loads its CUDA extensions). PeerUnavailable with
    the import's own message (missing module, a .so torch cannot load, ...) when it fails."""
    try:
        return importlib.import_module("flash_mla")
    except Exception as exc:  # ImportError, or the OSError / RuntimeError of a .so this torch rejects
        raise PeerUnavailable(f"import flash_mla failed ({WHEEL} wheel on sys.path?): "
                              f"{type(exc).__name__}: {exc}") from exc


def version() -> Optional[str]:
    """The installed flash_mla's version (its VERSION file), read without importing it."""
    try:
        spec = importlib.util.find_spec("flash_mla")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        return (Path(list(spec.submodule_search_locations)[0]) / "VERSION").read_text().strip()
    except OSError:
        return None


def unavailable_reason(device=None) -> Optional[str]:
    """None when FlashMLA's dense decode can run on ``device``; else why not (for a record or a skip):
    no CUDA device, not sm_90 (its dense kernels are built for Hopper only), the import's error
    text, or a wheel loaded without its legacy (SM90, dense) extension."""
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"FlashMLA's dense decode is built for sm_90a only, this device is sm_{major}{minor}"
    try:
        module = load()
    except PeerUnavailable as exc:
        return str(exc)
    has_legacy = getattr(module, "has_legacy", None)
    if has_legacy is None or not callable(getattr(module, "flash_mla_with_kvcache", None)):
        return (f"flash_mla {getattr(module, '__version__', '?')} lacks has_legacy / flash_mla_with_kvcache: "
                f"not the {WHEEL} API this peer calls")
    if not has_legacy():
        loader = importlib.import_module("flash_mla._loader")
        why = getattr(loader, "_LEGACY_UNAVAILABLE", None) or "no reason given"
        return f"flash_mla loaded without its legacy extension, where dense decode lives: {why}"
    return None


@dataclass
class PagedCase:
    """One of our cases in FlashMLA's dense-decode layout.

    q [B, T, H, 576] (a view of the case's q: refreshing the case's queries in place refreshes
    these), k_cache [num_blocks, 64, 1, 576], block_table [B, max_pages] int32, cache_seqlens [B]
    int32 (prefix + T keys per request)."""

    q: object
    k_cache: object
    block_table: object
    cache_seqlens: object
    rows_per_request: int


def paged_layout(q, kv_cache, qo_indptr, kv_indptr, kv_indices, page_size: int = PAGE_SIZE) -> PagedCase:
    """Copy each request's key rows (``kv_cache[kv_indices[kv_indptr[b]:kv_indptr[b+1]]]``: prefix,
    then its T query slots) into pages of ``page_size`` rows, request after request; the pages'
    padding rows are zero. Every request must hold the same number of query rows (FlashMLA takes
    one s_q per call): ValueError otherwise."""
    import torch  # noqa: PLC0415

    if q.dim() != 3 or q.shape[-1] != HEAD_DIM_QK:
        raise ValueError(f"q: expected [Nq, H, {HEAD_DIM_QK}], got {list(q.shape)}")
    q_lens = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
    kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).tolist()
    if not q_lens:
        raise ValueError("no requests: qo_indptr holds one entry")
    if len(set(q_lens)) != 1:
        raise ValueError(f"FlashMLA takes one number of query rows per request, these requests have {q_lens}: "
                         f"time it on cases of uniform T")
    T = q_lens[0]
    if any(n < T for n in kv_lens):
        raise ValueError(f"each request needs at least its {T} query rows of keys, kv lengths are {kv_lens}")
    pages = [-(-n // page_size) for n in kv_lens]
    k_cache = torch.zeros(sum(pages), page_size, 1, kv_cache.shape[-1], dtype=kv_cache.dtype, device=kv_cache.device)
    flat = k_cache.view(-1, kv_cache.shape[-1])
    block_table = torch.zeros(len(pages), max(pages), dtype=torch.int32, device=kv_cache.device)
    start = 0
    for b, (n, p) in enumerate(zip(kv_lens, pages)):
        slots = kv_indices[int(kv_indptr[b]):int(kv_indptr[b]) + n].long()
        flat[start * page_size:start * page_size + n] = kv_cache[slots]
        block_table[b, :p] = torch.arange(start, start + p, dtype=torch.int32, device=kv_cache.device)
        start += p
    cache_seqlens = torch.tensor(kv_lens, dtype=torch.int32, device=kv_cache.device)
    return PagedCase(q=q.view(len(q_lens), T, q.shape[1], q.shape[2]), k_cache=k_cache, block_table=block_table,
                     cache_seqlens=cache_seqlens, rows_per_request=T)


def request_rows(paged: PagedCase, b: int):
    """The key rows request ``b`` reads, back out of the pages (what `paged_layout` copied in)."""
    n = int(paged.cache_seqlens[b])
    page_size = paged.k_cache.shape[1]
    pages = paged.block_table[b, :-(-n // page_size)].long()
    return paged.k_cache[pages].reshape(-1, paged.k_cache.shape[-1])[:n]


class FlashMLADecode:
    """FlashMLA's dense decode (``flash_mla_with_kvcache``, legacy SM90 kernels, bf16, causal)
    bound to our op contract's tensors."""

    def __init__(self, device="cuda"):
        import torch  # noqa: PLC0415

        self.device = torch.device(device)
        self._mla = load()

    def bind(self, q, kv_cache, qo_indptr, kv_indptr, kv_indices, sm_scale: float) -> Callable[[], object]:
        """Page these tensors (`paged_layout`, a copy) and run once, so FlashMLA fills its
        scheduling metadata (kept for every later call: the lengths never change); return a call
        that only launches and returns FlashMLA's output as ours, [Nq, H, 512] bf16."""
        paged = paged_layout(q, kv_cache, qo_indptr, kv_indptr, kv_indices)
        meta = self._mla.get_mla_metadata()[0]
        nq, heads = q.shape[0], q.shape[1]

        def call():
            out, _lse = self._mla.flash_mla_with_kvcache(
                paged.q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, meta,
                softmax_scale=float(sm_scale), causal=True, use_legacy=True)
            return out.reshape(nq, heads, HEAD_DIM_V)

        call()
        return call


def oracle_rel_l2(got, case: dict) -> float:
    """rel-L2 of ``got`` [Nq, H, 512] against the fp64 oracle on ``case`` with the causal chain
    mask in place of its tree (what FlashMLA computes); NaN / Inf in ``got`` reads infinite."""
    import math  # noqa: PLC0415

    from kdtree.bench.cases import oracle  # noqa: PLC0415
    from kdtree.bench.flashinfer_peer import chain_mask  # noqa: PLC0415

    chained = dict(case, tree_mask=chain_mask(case["qo_indptr"], device=case["q"].device))
    want, _ = oracle(chained)
    got = got.double()
    if not bool(got.isfinite().all()):
        return math.inf
    return float((got - want).norm() / want.norm().clamp_min(1e-30))
