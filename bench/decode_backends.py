"""The backends the decode benchmark compares, each eager and with CUDA graphs.

An arm is a backend and a mode: ``kernel`` (the owned kernel, default dispatch), ``sm120`` (the
kernel with the variant compute capability 12.0 dispatches, forced: the sm_120 path), ``triton``
(SGLang 0.5.23's Triton kernels as SGLang serves MLA, `kdtree.bench.decode_triton`), each
``graph`` (verify steps and the draft model's decode passes replayed from graphs captured once
per bucket: `VerifyGraphs`, `DraftGraphs`) or ``eager``. `make_runner` builds an arm's runner
on a shared model and pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from kdtree.bench.forced import sm120_path, sm120_variant
from kdtree.engine.decode import backends as engine_backends
from kdtree.engine.decode.backends import AttentionBackend, OpBackend
from kdtree.engine.decode.draft_graphs import DraftGraphs
from kdtree.engine.decode.graph_capture import Bucket, BucketKernelBackend, VerifyGraphs
from kdtree.engine.decode.speculative import Runner

SM120_BACKEND = "kernel-sm120"
BACKENDS = ("kernel", "triton", "sm120")  # the benchmark's names, in report order
MODES = ("graph", "eager")


def sm120_path_op(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, *, out=None, lse=None):
    """The op contract launched with the variant an sm_120 device picks for these shapes
    (`kdtree.bench.forced.sm120_path`)."""
    return sm120_path(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out=out, lse=lse)


def register() -> None:
    """Make the engine's `get_backend` know ``sglang-triton`` and ``kernel-sm120`` (idempotent)."""
    from kdtree.bench.decode_triton import BACKEND_NAME, SGLangTritonBackend  # noqa: PLC0415

    known = engine_backends.known_backends()
    if BACKEND_NAME not in known:
        engine_backends.register_backend(BACKEND_NAME, SGLangTritonBackend)
    if SM120_BACKEND not in known:
        engine_backends.register_backend(SM120_BACKEND, lambda: OpBackend(
            SM120_BACKEND, "kdtree.bench.decode_backends", "sm120_path_op"))


def engine_backend_name(backend: str) -> str:
    """The engine backend of a benchmark backend name."""
    from kdtree.bench.decode_triton import BACKEND_NAME  # noqa: PLC0415

    names = {"kernel": "kernel", "triton": BACKEND_NAME, "sm120": SM120_BACKEND}
    if backend in names:
        return names[backend]
    if backend in engine_backends.known_backends():  # e.g. torch / reference on the CPU, eager only
        return backend
    raise ValueError(f"unknown decode backend {backend!r}; known: {list(names)} or an engine backend "
                     f"({engine_backends.known_backends()})")


def graph_factory(backend: str, model) -> Optional[Callable[[Bucket], AttentionBackend]]:
    """The attention a bucket's graph captures for a benchmark backend (None: the kernel's default)."""
    if backend == "kernel":
        return None
    if backend == "triton":
        from kdtree.bench.decode_triton import graph_factory as triton_factory  # noqa: PLC0415

        return triton_factory()
    if backend == "sm120":
        def factory(bucket: Bucket) -> AttentionBackend:
            from kdtree.kernels import plan_bucket  # noqa: PLC0415

            heads = model.config.num_heads
            variant = sm120_variant(bucket.rows, heads, bucket.batch)
            return BucketKernelBackend(plan_bucket(bucket.batch, bucket.tree, bucket.context, heads,
                                                   model.device.index or 0, variant=variant))
        return factory
    raise ValueError(f"unknown decode backend {backend!r}; known: {list(BACKENDS)}")


@dataclass(frozen=True)
class Arm:
    """One measured configuration: a backend and whether it replays graphs."""

    backend: str
    mode: str

    @property
    def name(self) -> str:
        return f"{self.backend}-{self.mode}"


def make_runner(arm: Arm, model, pool, draft_layers: Optional[int]) -> Runner:
    """The runner of an arm on a shared model and pool; with graphs, verify graphs and (for a
    self-draft drafter, `draft_layers` not None) the draft model's decode-pass graphs."""
    register()
    attention = engine_backends.get_backend(engine_backend_name(arm.backend))
    if arm.mode == "eager":
        return Runner(model, pool, attention)
    if arm.mode != "graph":
        raise ValueError(f"unknown mode {arm.mode!r}; known: {list(MODES)}")
    if model.device.type != "cuda":
        raise ValueError(f"arm {arm.name}: CUDA graphs need a CUDA device, the model is on {model.device}; "
                         "use the eager mode on the CPU")
    factory = graph_factory(arm.backend, model)
    graphs = VerifyGraphs(model, pool, backend_factory=factory)
    draft = DraftGraphs(model, pool, draft_layers, backend_factory=factory) if draft_layers else None
    return Runner(model, pool, attention, graphs=graphs, draft_graphs=draft)
