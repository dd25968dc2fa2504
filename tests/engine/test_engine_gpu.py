"""On a CUDA GPU, in bf16: the phase-1 gate's comparison (greedy on the oracle vs tree speculative
decoding on the kernels) is token-exact. Skipped with its reason on CPU."""

from __future__ import annotations

import pytest

from engine_prompts import random_prompts
from kdtree.engine import generate

pytestmark = pytest.mark.gpu

PROMPTS = random_prompts(20, seed=7)
NEW = 32


@pytest.fixture(scope="module")
def oracle_greedy():
    result = generate(PROMPTS, drafter="none", backend="reference", device="cuda", max_new_tokens=NEW)
    assert result.dtype == "bfloat16"
    return result.tokens


@pytest.mark.parametrize("backend,drafter,budget", [
    ("torch", "none", 1), ("torch", "ddtree", 64), ("kernel", "none", 1), ("kernel", "ddtree", 64),
    ("cuda", "none", 1), ("cuda", "ngram", 16),
    ("cuda", "ddtree", 64), ("cuda", "ddtree", 512), ("triton", "ngram", 16), ("triton", "ddtree", 64),
])
def test_gpu_decoding_matches_oracle_greedy(oracle_greedy, backend, drafter, budget):
    result = generate(PROMPTS, drafter=drafter, budget=budget, backend=backend, device="cuda", max_new_tokens=NEW)
    assert result.tokens == oracle_greedy


def test_long_prompt_prefills_in_chunks_on_the_kernel_and_stays_exact():
    """A 6000-token prompt: prefill in model chunks of 2048 tokens, each as 1024-row chain trees on the
    kernel; greedy tokens equal the oracle's (whose prefill is one chunk)."""
    from kdtree.engine import build_model, preset

    model = build_model(preset("tiny-long"), device="cuda")
    prompt = [(7 * i) % 997 for i in range(6000)]
    ref = generate([prompt], model=model, drafter="none", backend="reference", max_new_tokens=8, prefill_chunk=8192)
    got = generate([prompt], model=model, drafter="ddtree", budget=32, backend="kernel", max_new_tokens=8,
                   prefill_chunk=2048)
    assert got.tokens == ref.tokens


def test_an_eager_verify_step_on_the_kernel_never_waits_for_the_gpu():
    """Uploads are pinned and asynchronous, the position bound comes from the host: under
    torch's sync debug mode a whole verify step (metadata, every layer, the head) raises nothing."""
    import torch

    from kdtree.bench.verify_step import VerifySetup
    from kdtree.engine import build_model, preset

    model = build_model(preset("tiny"), device="cuda")
    setup = VerifySetup(model, context=300, batch=2, budget=16, seed=3, backends=("kernel",))
    setup.step("kernel")  # first call: the extension and its workspace
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        setup.step("kernel")
    finally:
        torch.cuda.set_sync_debug_mode("default")
