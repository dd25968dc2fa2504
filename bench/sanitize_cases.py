"""What runs under compute-sanitizer: every kernel variant the device runs, on small shapes,
held to the oracle (`kdtree.tools.sanitize_driver` runs it; phase 1's sanitizer gate runs that).

Inputs are built on the host and copied over, and the oracle runs on the host, so the only GPU
kernels launched are the tree-verify kernels (and the split combine). Every variant the device
runs (`launch_plan.runnable_variants`: wgmma on compute capability 9.0) is forced through its
plan, with the plan's split count and with a forced one. `DONE_MARKER` is printed last, so a run
that dies early can never pass as clean.
"""

from __future__ import annotations

from typing import Callable

DONE_MARKER = "kdtree-sanitize-driver: done"
CASES = [  # (H, [(T_b, L_b)], tree kind): short prefixes, splits, mask words, ragged tiles
    (8, [(16, 70)], "random"),
    (3, [(5, 0), (1, 9), (40, 33)], "random"),
    (16, [(33, 2100)], "star"),
    (128, [(2, 17)], "chain"),
]
FORCED_SPLITS = (None, 3)  # the plan's own, and three splits even where it would take one


def check_every_variant(say: Callable[[str], None] = print) -> int:
    """Run every case through every variant and split count on the current CUDA device, say one
    line per run and `DONE_MARKER` last; the number of wrong outputs."""
    import torch  # noqa: PLC0415

    from kdtree.bench.cases import make_case  # noqa: PLC0415
    from kdtree.bench.forced import forced_kernel  # noqa: PLC0415
    from kdtree.kernels.launch_plan import runnable_variants  # noqa: PLC0415
    from kdtree.kernels.reference import tree_verify_mla_reference  # noqa: PLC0415

    bad = 0
    for variant in runnable_variants(torch.cuda.get_device_capability()):
        for splits in FORCED_SPLITS:
            for H, reqs, kind in CASES:
                host = make_case(H, reqs, kind, seed=7, device="cpu")
                dev = {k: v.to("cuda") if isinstance(v, torch.Tensor) else v for k, v in host.items()}
                nq = host["q"].shape[0]
                out = torch.full((nq, H, 512), float("nan"), dtype=torch.bfloat16).to("cuda")
                lse = torch.full((nq, H), float("nan"), dtype=torch.float32).to("cuda")
                forced_kernel(variant, splits)(dev["q"], dev["kv_cache"], dev["qo_indptr"], dev["kv_indptr"],
                                               dev["kv_indices"], dev["tree_mask"], dev["sm_scale"], out=out, lse=lse)
                got = out.to("cpu").double()
                ref = tree_verify_mla_reference(host["q"].double(), host["kv_cache"].double(), host["qo_indptr"],
                                                host["kv_indptr"], host["kv_indices"], host["tree_mask"],
                                                host["sm_scale"])
                rel = float((got - ref).norm() / ref.norm())
                ok = rel <= 1e-2 and not torch.isnan(got).any()
                bad += not ok
                say(f"{variant:7s} splits={splits or 'auto'} H{H} {reqs}: rel {rel:.2e} {'ok' if ok else 'WRONG'}")
    say(DONE_MARKER)
    return bad
