"""Command-line programs over the measurement layer (`kdtree.bench`): each parses its arguments,
calls bench and prints or writes what it measured.

    python -m kdtree.tools.bench            the benchmark over the grid, against the roofline
    python -m kdtree.tools.roofline         bytes, FLOPs and floors of the grid
    python -m kdtree.tools.devcheck         build, check every variant against the oracle, time
    python -m kdtree.tools.kernel_times     per-kernel GPU time by forced split count (CUPTI)
    python -m kdtree.tools.mma_ceiling      what mma.sync can reach on this GPU
    python -m kdtree.tools.host_path_bench  host time of one call, on the CPU
    python -m kdtree.tools.peers            ours against FlashInfer's and FlashMLA's kernels
    python -m kdtree.tools.sanitize_driver  the compute-sanitizer driver
    python -m kdtree.tools.step_profile     where one verify step spends its time
    python -m kdtree.tools.variant_audit    every variant's logit drift against the oracle (near-tie or defect?)

Every timing goes through `kdtree.bench.timing`. Tools import bench, the kernels and the engine;
nothing imports a tool, and no tool imports another but `bench`, which writes its report with
`bench_report`'s writer.
"""
