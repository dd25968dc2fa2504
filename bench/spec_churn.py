"""Speculative decoding under churn: requests arrive and finish while others decode, defrag on or off.

Built on the engine's public pieces (`Runner.prefill`, a drafter's `propose`, `Runner.verify_step`,
`KVPool`); with ``defrag=True`` the pool uses the Tier 0 allocator and a relocation round runs
after every step under a copy budget, moving the KV that the next step's drafter and verifier
read. `serve` returns every request's generated tokens, which must not depend on ``defrag``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from kdtree.engine.kv.allocator import FreeListAllocator, SortedRunAllocator
from kdtree.engine.decode.backends import get_backend
from kdtree.engine.decode.drafters import get_drafter
from kdtree.engine.kv.kv_pool import KVPool
from kdtree.engine.model.model import MLAModel
from kdtree.engine.kv.relocation import Relocator
from kdtree.engine.decode.speculative import Request, Runner


@dataclass(frozen=True)
class Arrival:
    step: int  # the step before which the request joins
    prompt: tuple[int, ...]
    max_new_tokens: int


@dataclass
class ServeResult:
    tokens: list[list[int]]  # per arrival, in arrival order
    rows_relocated: int
    max_round_bytes: int
    budget_bytes: int
    steps: int


def serve(model: MLAModel, arrivals: Sequence[Arrival], *, pool_slots: int, defrag: bool,
          drafter: str = "ddtree", budget: int = 8, backend: str = "torch",
          copy_budget_bytes: Optional[int] = None, relocator_cls=Relocator) -> ServeResult:
    """Greedy tree-speculative decoding of `arrivals` (each joins at its step) over one pool."""
    spec = get_drafter(drafter)
    if spec is None:
        raise ValueError("serve needs a drafter (speculative decoding), not 'none'")
    allocator = SortedRunAllocator(pool_slots) if defrag else FreeListAllocator(pool_slots)
    pool = KVPool(model.config.num_layers, pool_slots, dtype=model.dtype, device=model.device,
                  allocator=allocator)
    runner = Runner(model, pool, get_backend(backend))
    relocator = relocator_cls(pool) if defrag else None
    if copy_budget_bytes is None:
        copy_budget_bytes = 64 * pool.bytes_per_slot
    pending = sorted(enumerate(arrivals), key=lambda ia: (ia[1].step, ia[0]))
    requests: dict[int, Request] = {}
    active: list[Request] = []
    rows = max_round = 0
    step = 0
    while pending or active:
        while pending and pending[0][1].step <= step:
            i, a = pending.pop(0)
            r = Request(i, list(a.prompt), a.max_new_tokens)
            requests[i] = r
            runner.prefill([r])
            if r.done:
                pool.release(r.rid)
            else:
                active.append(r)
        if active:
            trees = spec.propose(active, budget, runner)
            runner.verify_step(active, trees)
            for r in active:
                if r.done:
                    del r.output[r.max_new_tokens:]
                    pool.release(r.rid)
            active = [r for r in active if not r.done]
        if relocator is not None:
            report = relocator.step(copy_budget_bytes)
            rows += report.rows_copied
            max_round = max(max_round, report.bytes_copied)
        step += 1
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return ServeResult(tokens=[requests[i].output for i in range(len(arrivals))], rows_relocated=rows,
                       max_round_bytes=max_round, budget_bytes=copy_budget_bytes, steps=step)
