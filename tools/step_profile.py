"""Where one verify step of the engine spends its time: ``python -m kdtree.tools.step_profile``.

Builds phase 2's verify setup (`kdtree.bench.verify_step.VerifySetup`: a preset model, B
requests with an L-token prefix of random KV in the pool, one random tree each) and, per backend,
reports the step's wall time with the device synchronised around it, its host time (the call
returning, with no synchronisation inside), the GPU's busy time (the sum of the step's kernel
durations, from torch.profiler) and the host operators that cost the most. A step whose host
time exceeds its GPU time is launch-bound: the GPU idles between kernels, and a faster attention
kernel shows up only as idle time (CUDA graphs remove the host part; phase 3).

    python -m kdtree.tools.step_profile --preset dsv3-tp8 --context 4096 --batch 2 --tree 64
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import click

from kdtree.bench.step_profile import profile_step
from kdtree.cli_support import MachineError, common_options
from kdtree.kernels import cli


@click.command(context_settings=cli.CONTEXT, help=__doc__.split("\n")[0])
@click.option("--preset", default="dsv3-tp8", show_default=True)
@click.option("--context", "contexts", type=click.IntRange(0), multiple=True, help="repeatable; default 4096")
@click.option("--batch", type=cli.POSITIVE_INT, default=2, show_default=True)
@click.option("--tree", type=cli.POSITIVE_INT, default=64, show_default=True)
@click.option("--backend", "backends", multiple=True)
@click.option("--device", default="cuda", show_default=True)
@click.option("--json", "json_path", help="also write the results to this file")
@common_options
def command(**options) -> int:
    args = SimpleNamespace(**options)
    import torch  # noqa: PLC0415

    if args.device == "cuda" and not torch.cuda.is_available():
        raise MachineError("step_profile: no CUDA device here; pass --device cpu for the CPU torch path")
    from kdtree.bench.verify_step import VerifySetup  # noqa: PLC0415
    from kdtree.engine import build_model, preset  # noqa: PLC0415

    backends = tuple(args.backends or (["kernel", "triton"] if args.device == "cuda" else ["torch"]))
    contexts = args.contexts or [4096]
    model = build_model(preset(args.preset), seed=0, device=args.device)
    results = {}
    for context in contexts:
        setup = VerifySetup(model, context, args.batch, args.tree, seed=context, backends=backends)
        for name in backends:
            got = results[f"L{context} {name}"] = profile_step(setup, name)
            print(f"L={context} B={args.batch} T={args.tree} {name}: wall {got['wall_ms']:.2f} ms, host "
                  f"{got['host_ms']:.2f} ms, GPU busy {got['gpu_busy_ms']:.2f} ms, {got['launches']} launches")
            for op in got["top_host_ops"][:10]:
                print(f"    {op['self_cpu_ms']:8.3f} ms  {op['calls']:5d}x  {op['op']}")
        del setup
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


main = cli.program(command, "python -m kdtree.tools.step_profile")

if __name__ == "__main__":
    sys.exit(main())
