"""The measurement library: what the phases' gates and the tools measure with.

- `cases`: op-contract inputs (random, chain and star trees; scattered / contiguous slots) and
  the accuracy edge cases phase 1 and the tools check;
- `timing`: the one GPU timer (each call queued behind an L2 wipe and a busy-wait) and the
  measured ceilings; `roofline`: bytes, FLOPs and floors of a call;
- `flashinfer_peer`: FlashInfer's MLA kernels as op-contract peers;
- `verify_step`: a model's whole verify step on random KV, its time broken down, and the
  token-exact prompts; `sglang_verify`: SGLang's Triton verify call and ours on its fixtures;
- `churn`, `spec_churn`, `defrag_measure`, `sglang_allocator_model`: the KV-pool workloads and
  measurements of defragmentation, and SGLang's allocator as the baseline.

It imports the kernels, the engine, the SGLang integration and the gates' timers; nothing of it
imports a phase or a tool.
"""
