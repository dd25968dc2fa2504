"""The measurement layer: every timer, timing loop, interleaving, workload and measuring function
the phases' gates and the tools use. Gates judge what it measures; phases bind a spec's workload
to a measurement here and a gate; tools parse arguments and call it.

- timing: `timing` (the one timer factory `make_timer`, `QueuedTimer` / `HostTimer`, the one
  interleaving loop `round_robin`, the measured ceilings), `roofline` (bytes, FLOPs, floors);
- inputs and workloads: `cases` (op-contract inputs), `accuracy_cases`, `structured_cases`,
  `forced` (the kernel with a forced plan), `decoy_trees` and `token_probe` (the token-exact
  runs), `verify_step` (a model's verify step), `graph_cases` (what is captured in CUDA graphs),
  `churn`, `spec_churn` (KV-pool churn), `sglang_allocator_model`, `sanitize_cases`;
- measurements: `speed` (candidate vs baseline, interleaved, for the speedup gate),
  `graph_replay` (capture and replay vs eager, for the graph-safety gate), `layouts`, `grid`
  (the benchmark), `kernel_check`, `kernel_profile`, `peer_grid` with `flashinfer_peer` and
  `flashmla_peer`, `step_profile`, `host_path`, `variant_audit`, `mma_ceiling`,
  `defrag_measure` and `defrag_figures` (phase 4's figures), `sglang_verify`.

It imports the kernels, the engine, the SGLang integration and the gates' result and tensor
helpers; nothing of it imports a phase or a tool.
"""
