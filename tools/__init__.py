"""Measurement and checking tools for the tree-verify kernel (GPU-side, mostly), kept out of the
op's package `kdtree.kernels`:

    python -m kdtree.tools.bench            the benchmark over the grid, against the roofline
    python -m kdtree.tools.roofline         bytes, FLOPs and floors of the grid
    python -m kdtree.tools.devcheck         build, check every variant against the oracle, time
    python -m kdtree.tools.kernel_times     per-kernel GPU time by forced split count (CUPTI)
    python -m kdtree.tools.mma_ceiling      what mma.sync can reach on this GPU
    python -m kdtree.tools.host_path_bench  host time of one call, on the CPU
    python -m kdtree.tools.sanitize_driver  the compute-sanitizer driver
    python -m kdtree.tools.variant_audit    every variant's logit drift against the oracle (near-tie or defect?)

All inputs come from `kdtree.bench.cases` and all GPU timings from `kdtree.bench.timing` (the
gates' queued timer). Tools import `kdtree.kernels` and `kdtree.gates`, never the reverse.
"""
