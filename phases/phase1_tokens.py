"""Phase 1's token-exact runs: counted op calls, speculative runs against greedy, decoy verify steps.

Built on the engine's own seams: `kdtree.engine.register_backend` (the gate registers the
candidate backend wrapped by `CountedBackend` under a name of its own), `generate` (its
``on_step`` marks step boundaries), and `kdtree.engine.speculative.Runner` (prefill and one
verify step on trees the gate builds, `phase1_trees.decoy_tree`).

`CountedBackend` wraps a backend instance: the op under test is wrapped to count its calls, and
a verify forward's op calls count only when what the forward returns is what the op returned
in it (a backend that calls the op and then answers from elsewhere counts zero).
"""

from __future__ import annotations

import copy
import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

_names = itertools.count()


@dataclass
class CallLog:
    """Op calls inside verify forwards, per step (a step ends at each `mark_step`)."""

    steps: list[int] = field(default_factory=list)
    current: int = 0
    op_calls: int = 0  # all calls of the op, verify or not

    def mark_step(self) -> None:
        self.steps.append(self.current)
        self.current = 0


class CountedBackend:
    """Wraps an engine backend instance so that the op under test counts its calls (module docstring)."""

    def __init__(self, inner, op_under_test: Callable, log: CallLog):
        import torch  # noqa: PLC0415

        self._inner, self._log, self._torch = inner, log, torch
        self._in_verify: Optional[list] = None
        self.name = getattr(inner, "name", "?")
        resolved = getattr(inner, "op", None) if hasattr(type(inner), "op") else None
        if resolved is op_under_test:
            resolve, counted = inner._op, self._counting(op_under_test)
            # OpBackend resolves each mode's op through _op(which): count where it is the op under test
            inner._op = lambda which: counted if resolve(which) is op_under_test else resolve(which)
        forward_verify = inner.forward_verify

        def counted_verify(q, kv_cache, meta, sm_scale):
            self._in_verify = []
            try:
                out = forward_verify(q, kv_cache, meta, sm_scale)
            finally:
                outs, self._in_verify = self._in_verify, None
            if any(o is out or (o.shape == out.shape and bool(self._torch.equal(o, out))) for o in outs):
                log.current += len(outs)
            return out

        inner.forward_verify = counted_verify

    def _counting(self, op: Callable) -> Callable:
        def counted(*args, **kwargs):
            out = op(*args, **kwargs)
            self._log.op_calls += 1
            if self._in_verify is not None:
                self._in_verify.append(out)
            return out

        return counted

    def __getattr__(self, item):
        return getattr(self._inner, item)

    def forward(self, q, kv_cache, meta, sm_scale):
        return self._inner.forward(q, kv_cache, meta, sm_scale)


def counted_backend(backend: str, op_under_test: Callable) -> tuple[str, CallLog]:
    """Register a fresh `CountedBackend` around ``get_backend(backend)`` under a new name; returns
    (that name, its call log)."""
    from kdtree.engine import backends  # noqa: PLC0415

    log = CallLog()
    inst = CountedBackend(backends.get_backend(backend), op_under_test, log)
    name = f"{backend}+counted-{next(_names)}"
    backends.register_backend(name, lambda: inst)
    return name, log


def same_length(what: str, a: list, b: list) -> None:
    """A run that returns another number of streams than its reference is an error, never zipped short."""
    if len(a) != len(b):
        raise ValueError(f"{what}: the candidate run returned {len(a)} token streams and the reference "
                         f"{len(b)}, for the same prompts")


@dataclass
class DecoyResult:
    tokens: list[list[int]]  # per prompt: the prefill token, then what the verify step emitted
    emitted: list[int]
    logits: Any  # fp32 [sum(P_b + 1), V]: root and path nodes, in request order


def decoy_step(model, backend: str, prompts: list[list[int]], greedy: list[list[int]], path_len: int,
               tree_seed: int, pool=None) -> tuple[DecoyResult, Any]:
    """Prefill `prompts` (unless a prefilled ``pool`` is given: then a copy of it is used) and run
    one verify step on decoy trees whose paths are the greedy continuations; returns the result and
    the pool as it was after prefill (to share with another backend)."""
    import torch  # noqa: PLC0415

    from kdtree.engine import KVPool, get_backend  # noqa: PLC0415
    from kdtree.engine.metadata import verify_metadata  # noqa: PLC0415
    from kdtree.engine.speculative import Request, Runner  # noqa: PLC0415
    from kdtree.engine.tree import TokenTree  # noqa: PLC0415
    from kdtree.phases.phase1_trees import decoy_tree  # noqa: PLC0415

    vocab = model.config.vocab_size
    trees = [decoy_tree(g[0], g[1: path_len + 1], vocab, random.Random(tree_seed + i)) for i, g in enumerate(greedy)]
    requests = [Request(i, list(p), 10 ** 9) for i, p in enumerate(prompts)]
    if pool is None:
        slots = sum(len(p) + 1 for p in prompts) + sum(len(t.tokens) for t in trees) + 16
        pool = KVPool(model.config.num_layers, slots, dtype=model.dtype, device=model.device)
        Runner(model, pool, get_backend(backend)).prefill(requests)
        prefilled = copy.deepcopy(pool)
    else:
        prefilled, pool = pool, copy.deepcopy(pool)
        for r, g in zip(requests, greedy):
            r.output.append(g[0])
    runner = Runner(model, pool, get_backend(backend))
    sizes = [len(t.tokens) for t in trees]
    starts = [sum(sizes[:b]) for b in range(len(trees))]
    # the logits of root and path nodes, from a forward identical to verify_step's
    slots = pool.alloc(sum(sizes)).tolist()
    prefix = [pool.slots(r.rid) for r in requests]
    meta = verify_metadata(prefix, [slots[s: s + n] for s, n in zip(starts, sizes)],
                           [t.parents for t in trees], model.device)
    positions = []
    for p, t in zip(prefix, trees):
        depth = [0] * len(t.parents)
        for i in range(1, len(depth)):
            depth[i] = depth[t.parents[i]] + 1
        positions += [len(p) + d for d in depth]
    logits = runner.forward([tok for t in trees for tok in t.tokens], positions, slots, meta)
    rows = torch.tensor([s + n for s, t in zip(starts, trees) for n in [0] + t.path_nodes], device=logits.device)
    path_logits = logits[rows].float().cpu()
    pool.free(slots)
    emitted = runner.verify_step(requests, [TokenTree(t.tokens, t.parents) for t in trees])
    return DecoyResult([list(r.output) for r in requests], emitted, path_logits), prefilled


def margin_fraction(candidate_logits, reference_logits) -> float:
    """The largest |candidate - reference| logit at any compared row, as a fraction of the
    reference's top-1 / top-2 margin in that row: how close the candidate came to changing a token."""
    import torch  # noqa: PLC0415

    top2 = reference_logits.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).clamp_min(1e-12)
    drift = (candidate_logits - reference_logits).abs().amax(dim=-1)
    return float(torch.max(drift / margin))
