"""Decode benchmark: tree-speculative decoding tokens/s per backend, with CUDA graphs and eager.

Every arm (kernel, SGLang's Triton kernels as SGLang serves MLA, the sm_120 path; each replaying
graphs and eager) decodes the same prefilled prompts, in interleaved rounds; the table gives
tokens/s (median, spread), the speedup over the baseline with its interval, accepted tokens per
step, time per step and its breakdown (`kdtree.bench.decode`).

    python -m kdtree.tools.decode --context 32k --context 128k --batch 2 --batch 1 \\
        --rounds 5 --new-tokens 64 --json decode.json --plot decode.png
    python -m kdtree.tools.decode --from-json decode.json --plot decode.png   # table and plot again
    python -m kdtree.tools.decode --device cpu --preset tiny --context 256 --backend torch \\
        --backend reference --baseline reference --mode eager --rounds 2   # the CPU path
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import click

from kdtree.cli_support import MachineError, UsageError, common_options
from kdtree.kernels import cli


def context_length(text: str) -> int:
    """'32k' -> 32768, '4096' -> 4096; ValueError naming the problem otherwise."""
    raw = str(text).strip().lower()
    scale = 1024 if raw.endswith("k") else 1
    try:
        value = int(raw[:-1] if scale > 1 else raw) * scale
    except ValueError:
        raise ValueError(f"expected a context length such as 4096 or 32k, got {text!r}") from None
    if value < 1:
        raise ValueError(f"expected a context length >= 1, got {text!r}")
    return value


CONTEXT = cli.Parsed(context_length, "length")


def _progress_bar(total: int, enabled: bool):
    """(advance(label), close()) over a rich progress bar on stderr; no-ops when disabled."""
    if not enabled:
        return (lambda label: None), (lambda: None)
    from rich.console import Console  # noqa: PLC0415
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=False)
    task = bar.add_task("decode", total=total)
    bar.start()
    return (lambda label: bar.update(task, advance=1, description=label)), bar.stop


def _save_plot(record: dict, path: str) -> None:
    from kdtree.bench.decode_report import save_plot  # noqa: PLC0415

    try:
        save_plot(record, path)
    except ImportError as err:
        raise MachineError(f"--plot needs matplotlib ({err}); install the gpu or test extra, or render the plot "
                           "elsewhere with --from-json") from err


@click.command(context_settings=cli.CONTEXT, help=__doc__.split("\n")[0])
@click.option("--context", "contexts", type=CONTEXT, multiple=True, help="prompt length, repeatable (4096, 32k); "
              "default 32k and 128k")
@click.option("--batch", "batches", type=cli.POSITIVE_INT, multiple=True,
              help="requests per context: one per --context, or one for all; default 2 at 32k, 1 at 128k")
@click.option("--budget", type=cli.POSITIVE_INT, default=64, show_default=True, help="tree nodes per request")
@click.option("--drafter", default="ddtree", show_default=True, type=click.Choice(["ddtree", "selfdraft", "ngram"]))
@click.option("--new-tokens", type=cli.POSITIVE_INT, default=64, show_default=True, help="per request")
@click.option("--rounds", type=cli.POSITIVE_INT, default=5, show_default=True, help="timed runs per arm, interleaved")
@click.option("--backend", "backends", multiple=True,
              help="kernel, triton, sm120 (default: all three) or an engine backend such as torch (eager)")
@click.option("--mode", "modes", multiple=True, type=click.Choice(["graph", "eager"]), help="default: both")
@click.option("--baseline", default="triton", show_default=True, help="the backend speedups are over")
@click.option("--preset", default="dsv3-tp8", show_default=True, help="model preset (kdtree.engine.model.config)")
@click.option("--device", default="cuda", show_default=True)
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--no-breakdown", is_flag=True, help="skip the per-arm step breakdown")
@click.option("--time-budget", type=cli.POSITIVE_FLOAT, help="seconds: start no round past this (rounds run are kept)")
@click.option("--json", "json_path", help="write the record (every round) to this file")
@click.option("--plot", "plot_path", help="write a PNG of tokens/s against context per arm to this file")
@click.option("--from-json", "from_json", help="print the table (and --plot) of a saved record; measure nothing")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@common_options
def command(**options) -> int:
    args = SimpleNamespace(**options)
    from kdtree.bench.decode_report import decode_table  # noqa: PLC0415
    from kdtree.fsutil import atomic_write_bytes  # noqa: PLC0415

    if args.from_json:
        try:
            record = json.loads(Path(args.from_json).read_text())
            table = decode_table(record)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UsageError(f"--from-json {args.from_json}: not a decode record this tool can read ({err})") from err
        print(table)
        if args.plot_path:
            _save_plot(record, args.plot_path)
        return 0

    from kdtree.bench.decode import DecodeConfig, progress_units, run_decode  # noqa: PLC0415

    if args.device.startswith("cuda"):
        cli.require_cuda("python -m kdtree.tools.decode", "the kernel, Triton and graph arms run on it; "
                         "pass --device cpu --backend torch --mode eager for the CPU path")
    contexts = args.contexts or (32768, 131072)
    batches = args.batches or ((2, 1) if not args.contexts else (1,))
    try:
        config = DecodeConfig(contexts=contexts, batches=batches, budget=args.budget, drafter=args.drafter,
                              new_tokens=args.new_tokens, rounds=args.rounds,
                              backends=args.backends or ("kernel", "triton", "sm120"),
                              modes=args.modes or ("graph", "eager"), baseline=args.baseline, preset=args.preset,
                              device=args.device, seed=args.seed, breakdown=not args.no_breakdown,
                              time_budget_s=args.time_budget)
    except ValueError as err:
        raise UsageError(str(err)) from err
    if config.baseline not in config.backends:
        raise UsageError(f"--baseline {config.baseline!r} is not one of the backends run ({list(config.backends)})")
    advance, close = _progress_bar(progress_units(config), not args.no_progress)
    command_line = "python -m kdtree.tools.decode " + " ".join(cli.invoked_argv())

    def save(partial: dict) -> None:  # after each context: a later one cut short keeps the earlier ones
        if args.json_path:
            atomic_write_bytes(Path(args.json_path), json.dumps({**partial, "command": command_line}, indent=1).encode())

    try:
        record = run_decode(config, progress=advance, on_context=save)
    except ValueError as err:
        raise UsageError(str(err)) from err
    finally:
        close()
    record["command"] = command_line
    print(decode_table(record))
    if args.plot_path:
        _save_plot(record, args.plot_path)
    return 0


main = cli.program(command, "python -m kdtree.tools.decode")

if __name__ == "__main__":
    sys.exit(main())
