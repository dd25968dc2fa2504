"""Prompt sets for the engine tests (no pytest import: the GPU script uses them too)."""

from __future__ import annotations

import random


def random_prompts(n: int, seed: int, vocab: int = 1024, lo: int = 3, hi: int = 40) -> list[list[int]]:
    """n prompts of different lengths; odd ones repeat a short motif (prompt lookup can hit)."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        length = lo + (i * 7 + rng.randrange(5)) % (hi - lo)
        if i % 2:
            motif = [rng.randrange(vocab) for _ in range(rng.randint(2, 7))]
            prompts.append((motif * length)[:length])
        else:
            prompts.append([rng.randrange(vocab) for _ in range(length)])
    return prompts


def repetitive_prompts(n: int, seed: int, vocab: int = 1024) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        motif = [rng.randrange(vocab) for _ in range(3 + i % 5)]
        out.append(motif * (2 + i % 3) + motif[: i % 3])
    return out
