"""Logit drift per kernel variant on phase 2's token_exact workload: near-tie or defect?

    python -m kdtree.tools.variant_audit [--variants ws,wgmma] [--seeds 2] [--prompts 8]
        [--long-prompts 2] [--long-len 32768] [--new-tokens 32] [--tree-nodes 64]
        [--repeats 50] [--out DIR]

Phase 2's token_exact gate compares speculative decoding on a bf16 kernel with greedy decoding on
the fp64 oracle, token for token. Where the oracle's top-1 / top-2 margin is smaller than the
kernel's rounding moves the logits, any correct kernel can flip a token; a defect that the
accuracy cases miss shows instead as drift far outside the band the other variants stay in.
This tool tells the two apart. For each seed it draws the gate's prompts
(`kdtree.bench.verify_step.token_exact_prompts`), takes the oracle's greedy continuation, and then, for the
oracle and for the CUDA kernel with each variant forced on every call (prefill chunks included),
prefills the prompts in one batch and runs one verify step over one tree per prompt that holds the
oracle's path plus random branches (teacher forcing: every backend scores the same positions, in
batches shaped like the gate's). Per path position it records
the oracle's margin, each backend's largest logit drift over the vocabulary, its drift along the
margin and whether its argmax flips. Each variant's verify step is also re-run `--repeats` times on
the same pool: a race shows as reruns that are not bitwise equal.

Writes variant_audit.json into --out (default $OUT or .).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import click
import torch

from kdtree.bench.variant_audit import ForcedVariantBackend, audit
from kdtree.cli_support import MachineError, common_options
from kdtree.engine.decode.backends import AttentionBackend
from kdtree.kernels import cli


@click.command(context_settings=cli.CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--variants", default="ws,wgmma", show_default=True, help="comma-separated launch-plan variants to force")
@click.option("--preset", default="tiny-long", show_default=True)
@click.option("--seeds", type=int, default=2, show_default=True, help="fresh prompt draws")
@click.option("--seed", "seed", type=int, multiple=True,
              help="draw the prompts from this seed (repeatable; e.g. a gate record's first seed) instead of fresh ones")
@click.option("--prompts", type=int, default=16, show_default=True, help="prompts per draw (phase 2's gate: 16)")
@click.option("--long-prompts", type=int, default=2, show_default=True)
@click.option("--long-len", type=int, default=32768, show_default=True)
@click.option("--new-tokens", type=int, default=32, show_default=True)
@click.option("--tree-nodes", type=int, default=64, show_default=True)
@click.option("--repeats", type=int, default=20, show_default=True, help="reruns of each variant's verify step")
@click.option("--show-narrow", type=int, default=4, show_default=True,
              help="print this many narrowest-margin positions")
@click.option("--device", default="cuda", show_default=True)
@click.option("--out", default=lambda: os.environ.get("OUT", "."), show_default="$OUT or .")
@common_options
def command(**options) -> int:
    args = SimpleNamespace(**options)
    args.seed = list(args.seed)
    if args.device.startswith("cuda"):
        cli.require_cuda("kdtree.tools.variant_audit", "it forces the CUDA kernel's variants")
    elif args.variants:
        raise MachineError(f"kdtree.tools.variant_audit: the variants {args.variants} are CUDA kernels; "
                           f"--device {args.device} cannot run them (use --device cuda on the GPU machine)")
    from kdtree.bench.verify_step import token_exact_prompts  # noqa: PLC0415
    from kdtree.engine import build_model, preset  # noqa: PLC0415

    model = build_model(preset(args.preset), seed=0, device=args.device)
    backends: dict[str, AttentionBackend] = {v: ForcedVariantBackend(v) for v in args.variants.split(",") if v}
    names = list(backends)
    report = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "args": vars(args), "draws": []}
    seeds = args.seed or [int.from_bytes(os.urandom(4), "little") for _ in range(args.seeds)]
    for k, seed in enumerate(seeds):
        prompts = token_exact_prompts(args.prompts, args.long_prompts, args.long_len, model.config.vocab_size, seed)
        result = audit(model, prompts, backends, args.new_tokens, args.tree_nodes, seed, args.repeats)
        result["seed"] = seed
        report["draws"].append(result)
        print(f"draw {k} (seed {seed}):")
        for s in result["summaries"]:
            print(f"  {s['backend']:>6}: drift median {s['drift_max_median']:.3g}, p99 {s['drift_max_p99']:.3g}, "
                  f"worst {s['drift_max_worst']:.3g} at {s['worst']['prompt']}:{s['worst']['position']}; "
                  f"flips {s['flips']} at margins {[round(m, 4) for m in s['flip_margins']]}; "
                  f"reruns unequal {s['rerun_unequal']}/{s['reruns']}")
        for name, text in result["verdict"].items():
            print(f"  verdict {name}: {text}")
        narrow = sorted(range(len(result["positions"][names[0]])),
                        key=lambda j: result["positions"][names[0]][j]["margin"])[:args.show_narrow]
        for j in narrow:
            row = result["positions"][names[0]][j]
            print(f"  narrow margin {row['margin']:.4f} at {row['prompt']}:{row['position']}: "
                  + ", ".join(f"{n} moves it {result['positions'][n][j]['drift_margin']:.4f}"
                              + (" (flips)" if result["positions"][n][j]["flipped"] else "") for n in names))
    out = Path(args.out) / "variant_audit.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    return 0


main = cli.program(command, "python -m kdtree.tools.variant_audit")

if __name__ == "__main__":
    sys.exit(main())
