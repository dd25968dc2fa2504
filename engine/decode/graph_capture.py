"""The verify step captured in CUDA graphs: one graph per bucket, one shared memory pool.

A bucket (`Bucket`) admits up to ``batch`` requests of up to ``tree`` nodes and ``context``
prefix tokens each. Its graph holds the whole verify step: the metadata conversion (tree slots
scattered into ``kv_indices``, int32 indptrs, the packed ancestor mask built on the device from
parent rows, `tree_mask_from_parent_rows`), every layer (KV writes, attention on the kernel with
the bucket's launch plan, projections, MLPs) and the head. Per step the host writes one int64
staging vector (tokens, positions, slots, parent rows, node ids, kv positions, indptrs) and each
request's prefix slots into two static buffers, then replays (nano-vllm's scheme: static inputs,
capture per bucket, one memory pool for all graphs).

Static buffers are sized by tokens and tree words, never by T x L (`graph_buffer_bytes`; SGLang's
Triton backend preallocates a bool verify mask of ``max_bs x N x (context + N)`` bytes,
`sglang_verify_mask_bytes`).

Padding: rows past the batch's last node belong to no request (their attention is zero, their
KV goes to one scratch slot nobody reads, all with the same token and position so every write
is the same bytes); requests past the batch have no rows and no keys (the kernel's CTAs for them
exit at once). Buckets' context sizes are powers of two from `MIN_CONTEXT` (capped at the model's
positions), so a captured launch serves lengths from half its bucket to all of it with the split
count `kdtree.kernels.plan_bucket` weighs for that range (shorter prefixes of a
bucket's smallest size are served too, with that plan).

A step outside every bucket (too many requests, a bigger tree, a prefix past the model's
positions) returns None from `VerifyGraphs.verify_logits`: the runner runs it eagerly.

The same machinery serves the draft model's decode passes (`kdtree.engine.decode.draft_graphs`): a
decode pass is a step of one-node trees over the first ``num_layers`` layers, in ``decode`` mode.
The attention a graph holds comes from ``backend_factory(bucket)``: the kernel with the bucket's
launch plan by default; any backend whose ops are capturable (the SGLang Triton kernels with
static buffers sized by the bucket, `kdtree.bench.decode_triton`) can take its place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from kdtree.engine.decode.backends import AttentionBackend
from kdtree.engine.decode.metadata import AttentionMetadata
from kdtree.kernels.contract import LATENT_DIM, MAX_TREE_NODES

if TYPE_CHECKING:
    from kdtree.kernels.launch_plan import LaunchPlan
    from kdtree.engine.kv.kv_pool import KVPool
    from kdtree.engine.model.model import MLAModel
    from kdtree.engine.decode.speculative import Request, Runner
    from kdtree.engine.decode.tree import TokenTree

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
TREE_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
MIN_CONTEXT = 4096
STAGE_FIELDS = 6  # input_ids, positions, out_slots, parent_row, node, kv_pos: one row each


@dataclass(frozen=True)
class Bucket:
    """The largest step a graph serves: requests, nodes per request, prefix tokens per request."""

    batch: int
    tree: int
    context: int

    @property
    def rows(self) -> int:
        return self.batch * self.tree

    @property
    def mask_words(self) -> int:
        return math.ceil(self.tree / 32)

    @property
    def kv_capacity(self) -> int:
        """Entries of the static kv_indices: every request's prefix and tree, plus one dump entry."""
        return self.batch * (self.context + self.tree) + 1

    @property
    def stage_len(self) -> int:
        return STAGE_FIELDS * self.rows + 2 * (self.batch + 1)


def _round_up(value: int, sizes: Sequence[int]) -> Optional[int]:
    return next((s for s in sizes if s >= value), None)


def context_bucket(longest_prefix: int, max_context: int) -> Optional[int]:
    """The context size of the bucket for a longest prefix: a power of two >= MIN_CONTEXT, capped
    at `max_context`; None past it."""
    if longest_prefix > max_context:
        return None
    size = max(MIN_CONTEXT, 1 << max(longest_prefix - 1, 0).bit_length())
    return min(size, max_context)


def choose_bucket(batch: int, tree: int, longest_prefix: int, max_context: int,
                  batch_buckets: Sequence[int] = BATCH_BUCKETS,
                  tree_buckets: Sequence[int] = TREE_BUCKETS) -> Optional[Bucket]:
    """The smallest bucket holding this step, or None (the step runs eagerly)."""
    b, t = _round_up(batch, batch_buckets), _round_up(tree, tree_buckets)
    c = context_bucket(longest_prefix, max_context)
    if b is None or t is None or c is None:
        return None
    return Bucket(b, t, c)


def graph_buffer_bytes(bucket: Bucket, vocab: int = 0) -> int:
    """Bytes of a bucket's static buffers: the int64 staging vector, int32 kv_indices, the int32
    indptrs and packed mask the graph derives, and (with `vocab`) its fp32 logits."""
    stage = 8 * bucket.stage_len
    derived = 4 * (2 * (bucket.batch + 1) + bucket.rows * bucket.mask_words)
    return stage + 4 * bucket.kv_capacity + derived + 4 * bucket.rows * vocab


def sglang_verify_mask_bytes(max_bs: int, tree: int, context: int) -> int:
    """What SGLang 0.5.23's Triton backend preallocates for its target-verify custom mask
    (bool, one byte per cell): ``max_bs x N x (context + N)``."""
    return max_bs * tree * (context + tree)


def doubling_rounds(tree: int) -> int:
    """Pointer-doubling rounds that reach every ancestor of a tree of `tree` nodes."""
    return max(0, math.ceil(math.log2(tree))) if tree > 1 else 0


def tree_mask_from_parent_rows(parent_row: torch.Tensor, node: torch.Tensor, words: int, rounds: int) -> torch.Tensor:
    """The packed ancestor-or-self mask, int32 [rows, words], on the device and without a host sync.

    parent_row (int64 [rows]): the row of each row's parent node (a root: its own row); node
    (int64 [rows]): each row's node index in its tree (bit ``node`` of its own row is set).
    `rounds` pointer-doubling steps (`doubling_rounds` of the largest tree) OR in the ancestors at
    distance < 2^rounds. Equals `kdtree.kernels.pack_tree_masks` for the same trees.
    """
    word_of = node // 32
    bit = torch.bitwise_left_shift(torch.ones_like(node), node % 32)
    bit = torch.where(bit >= 2 ** 31, bit - 2 ** 32, bit).to(torch.int32)
    mask = torch.zeros(node.shape[0], words, dtype=torch.int32, device=node.device)
    mask.scatter_(1, word_of.unsqueeze(1), bit.unsqueeze(1))
    up = parent_row
    for _ in range(rounds):
        mask = torch.bitwise_or(mask, mask[up])
        up = up[up]
    return mask


class BucketKernelBackend(AttentionBackend):
    """The kernel for verify (and decode: a one-node tree) with a bucket's fixed launch plan
    (`kdtree.kernels.plan_bucket`), run as it is; output rows no request owns are zero."""

    requires_cuda = True

    def __init__(self, plan: "LaunchPlan"):
        self.name, self.plan = "kernel-graph", plan

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        from kdtree.kernels.cuda_op import launch  # noqa: PLC0415

        out = torch.zeros(q.shape[0], q.shape[1], LATENT_DIM, dtype=q.dtype, device=q.device)
        return launch(q, kv_cache, meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.tree_mask,
                      float(sm_scale), out=out, plan=self.plan, padded_rows=True)

    forward_decode = forward_verify

    def forward_extend(self, q, kv_cache, meta, sm_scale):
        raise RuntimeError("a verify graph runs verify and decode attention only")


def verify_body(model: "MLAModel", kv_caches: list[torch.Tensor], bucket: Bucket, backend: AttentionBackend,
                stage: torch.Tensor, kv_indices: torch.Tensor, logits: torch.Tensor,
                num_layers: Optional[int] = None, mode: str = "verify") -> None:
    """One verify step over a bucket's buffers: what a graph captures and what eager calls run.

    Reads ``stage`` (int64 [bucket.stage_len]) and ``kv_indices`` (int32 [bucket.kv_capacity],
    prefixes already in place; the tree slots are scattered in here), writes the tree's KV into the
    pool and the logits of every row into ``logits`` (fp32 [rows, vocab]). Shapes only on the host.
    ``num_layers`` runs the first layers only (the draft model); ``mode`` "decode" (one-node trees)
    sends attention to the backend's decode path.
    """
    if mode not in ("verify", "decode"):
        raise ValueError(f"mode must be 'verify' or 'decode', got {mode!r}")
    if mode == "decode" and bucket.tree != 1:
        raise ValueError(f"a decode bucket has one node per request, this one has {bucket.tree}")
    ids, positions, slots32, meta = bucket_metadata(bucket, stage, kv_indices, mode)
    # positions were checked on the host before the stage was written (VerifyGraphs.bucket, the
    # gate's draws); passing the bucket's bound keeps the model from reading them back (a sync)
    bound = min(bucket.context + bucket.tree, model.config.max_position_embeddings) - 1
    logits.copy_(model(ids, positions, slots32, kv_caches, backend, meta, num_layers=num_layers, max_position=bound))


def bucket_metadata(bucket: Bucket, stage: torch.Tensor, kv_indices: torch.Tensor,
                    mode: str = "verify") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The device-side conversion of a graph step: (input ids, positions, int32 out slots, the
    attention metadata) from the staging vector, the tree slots scattered into ``kv_indices`` and
    the packed ancestor mask built from parent rows. Host-side lengths are the bucket's bounds."""
    r, b = bucket.rows, bucket.batch
    fields = stage[: STAGE_FIELDS * r].view(STAGE_FIELDS, r)
    ids, positions, slots, parent_row, node, kv_pos = fields.unbind(0)
    qo_indptr = stage[STAGE_FIELDS * r: STAGE_FIELDS * r + b + 1].to(torch.int32)
    kv_indptr = stage[STAGE_FIELDS * r + b + 1:].to(torch.int32)
    slots32 = slots.to(torch.int32)
    kv_indices.index_copy_(0, kv_pos, slots32)
    mask = tree_mask_from_parent_rows(parent_row, node, bucket.mask_words, doubling_rounds(bucket.tree))
    meta = AttentionMetadata(mode, qo_indptr, kv_indptr, kv_indices, mask,
                             qo_lens=[bucket.tree] * b, kv_lens=[bucket.context + bucket.tree] * b)
    return ids, positions, slots32, meta


def stage_values(bucket: Bucket, prefix_lens: Sequence[int], trees: Sequence["TokenTree"],
                 tree_slots: Sequence[Sequence[int]], scratch_slot: int) -> tuple[list[int], list[int]]:
    """The staging vector of one step (host ints) and each request's kv_indices offset."""
    r, b = bucket.rows, bucket.batch
    ids, pos, slots = [0] * r, [0] * r, [scratch_slot] * r
    parent_row, node, kv_pos = list(range(r)), [0] * r, [bucket.kv_capacity - 1] * r
    qo, kv, row, at = [0], [0], 0, 0
    starts = []
    for length, tree, own in zip(prefix_lens, trees, tree_slots):
        starts.append(at)
        depths = tree.depths()
        for t, (tok, par) in enumerate(zip(tree.tokens, tree.parents)):
            ids[row + t], pos[row + t], slots[row + t] = tok, length + depths[t], own[t]
            parent_row[row + t] = row + (par if par >= 0 else t)
            node[row + t], kv_pos[row + t] = t, at + length + t
        row += len(tree)
        at += length + len(tree)
        qo.append(row)
        kv.append(at)
    qo += [row] * (b + 1 - len(qo))
    kv += [at] * (b + 1 - len(kv))
    return ids + pos + slots + parent_row + node + kv_pos + qo + kv, starts


class _Captured:
    def __init__(self, bucket: Bucket, graph, stage, kv_indices, logits):
        self.bucket, self.graph, self.stage, self.kv_indices, self.logits = bucket, graph, stage, kv_indices, logits


class VerifyGraphs:
    """Captured verify steps of one model and pool on the kernel backend (module docstring).

    `verify_logits` serves a step from its bucket's graph (capturing it on first use) or returns
    None when no bucket holds the step. ``captures``, ``replays`` and ``fallbacks`` count what
    happened; `buffer_bytes` is what the static buffers of the captured buckets take.

    ``backend_factory(bucket)`` gives the attention backend a bucket's graph captures (default:
    the kernel with the bucket's launch plan, `backend_for`); ``num_layers`` and ``mode`` are
    `verify_body`'s (the draft model's decode passes: `kdtree.engine.decode.draft_graphs`).
    """

    def __init__(self, model: "MLAModel", pool: "KVPool", batch_buckets: Sequence[int] = BATCH_BUCKETS,
                 tree_buckets: Sequence[int] = TREE_BUCKETS, max_context: Optional[int] = None,
                 backend_factory: Optional[Callable[[Bucket], AttentionBackend]] = None,
                 num_layers: Optional[int] = None, mode: str = "verify"):
        if model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, it is on {model.device}")
        if max(tree_buckets) > MAX_TREE_NODES:
            raise ValueError(f"tree buckets go up to {max(tree_buckets)} nodes; the kernel takes {MAX_TREE_NODES}")
        if mode == "decode" and tuple(tree_buckets) != (1,):
            raise ValueError(f"decode graphs hold one node per request: tree_buckets must be (1,), got {tuple(tree_buckets)}")
        self.model, self.pool = model, pool
        self.backend_factory, self.num_layers, self.mode = backend_factory, num_layers, mode
        self.batch_buckets, self.tree_buckets = tuple(sorted(batch_buckets)), tuple(sorted(tree_buckets))
        limit = model.config.max_position_embeddings
        self.max_context = min(limit, max_context) if max_context else limit
        self.scratch_slot = int(pool.alloc(1)[0])  # padded rows' KV lands here; nothing reads it
        self.memory_pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[Bucket, _Captured] = {}
        self.captures = self.replays = self.fallbacks = 0

    def bucket(self, prefix_lens: Sequence[int], trees: Sequence["TokenTree"]) -> Optional[Bucket]:
        longest_tree = max(len(t) for t in trees)
        deepest = max(length + max(t.depths()) for length, t in zip(prefix_lens, trees))
        if deepest >= self.model.config.max_position_embeddings:
            return None  # the eager step raises the model's clear error
        return choose_bucket(len(trees), longest_tree, max(prefix_lens), self.max_context,
                             self.batch_buckets, self.tree_buckets)

    @property
    def buffer_bytes(self) -> int:
        return sum(graph_buffer_bytes(b, self.model.config.vocab_size) for b in self.graphs)

    def plan(self, bucket: Bucket) -> "LaunchPlan":
        """The kernel launch plan a bucket's graph is captured with."""
        from kdtree.kernels import plan_bucket  # noqa: PLC0415

        return plan_bucket(bucket.batch, bucket.tree, bucket.context, self.model.config.num_heads,
                           self.model.device.index or 0)

    def backend_for(self, bucket: Bucket) -> AttentionBackend:
        """The attention backend a bucket's graph is captured with."""
        if self.backend_factory is not None:
            return self.backend_factory(bucket)
        return BucketKernelBackend(self.plan(bucket))

    def _capture(self, bucket: Bucket) -> _Captured:
        dev = self.model.device
        stage = torch.tensor(stage_values(bucket, [], [], [], self.scratch_slot)[0], dtype=torch.int64, device=dev)
        kv_indices = torch.zeros(bucket.kv_capacity, dtype=torch.int32, device=dev)
        logits = torch.zeros(bucket.rows, self.model.config.vocab_size, dtype=torch.float32, device=dev)
        backend = self.backend_for(bucket)

        def body():
            verify_body(self.model, self.pool.kv, bucket, backend, stage, kv_indices, logits, self.num_layers,
                        self.mode)

        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):  # the kernel's workspace and every lazy init happen outside capture
                body()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.memory_pool):
            body()
        self.captures += 1
        return _Captured(bucket, graph, stage, kv_indices, logits)

    def verify_logits(self, runner: "Runner", requests: Sequence["Request"], trees: Sequence["TokenTree"],
                      tree_slots: Sequence[Sequence[int]]) -> Optional[torch.Tensor]:
        """Logits [sum T_b, vocab] of the step from its bucket's graph, or None (run it eagerly).

        The logits are a view of the graph's static output: valid until the next replay (the
        runner reads them at once). Nothing here allocates device memory once the bucket is captured.
        """
        return self.logits_for([runner.prefix(r.rid) for r in requests], trees, tree_slots)

    def logits_for(self, prefixes: Sequence[torch.Tensor], trees: Sequence["TokenTree"],
                   tree_slots: Sequence[Sequence[int]], row_ids: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """`verify_logits` for explicit prefixes (int32 device tensors of slots, one per tree).

        ``row_ids``, a device tensor of the rows' token ids in tree order (``sum(len(t))`` of
        them), replaces the trees' tokens on the device: a token the GPU has just computed goes
        in without the host reading it back."""
        rows = sum(len(t) for t in trees)
        if row_ids is not None and (row_ids.dim() != 1 or row_ids.numel() != rows or row_ids.device != self.model.device):
            raise ValueError(f"row_ids must be a 1-D tensor of {rows} token ids on {self.model.device}, "
                             f"got shape {tuple(row_ids.shape)} on {row_ids.device}")
        lens = [int(p.numel()) for p in prefixes]
        bucket = self.bucket(lens, trees)
        if bucket is None:
            self.fallbacks += 1
            return None
        captured = self.graphs.get(bucket)
        if captured is None:
            captured = self.graphs[bucket] = self._capture(bucket)
        values, starts = stage_values(bucket, lens, trees, tree_slots, self.scratch_slot)
        # through pinned memory: a pageable upload would make the host wait for the stream first
        captured.stage.copy_(torch.tensor(values, dtype=torch.int64).pin_memory(), non_blocking=True)
        if row_ids is not None:  # the ids are the stage's first field, rows in tree order
            captured.stage[:rows].copy_(row_ids)
        for start, length, prefix in zip(starts, lens, prefixes):
            if length:
                captured.kv_indices[start: start + length].copy_(prefix)
        captured.graph.replay()
        self.replays += 1
        return captured.logits[:rows]
