"""Demo: ``python -m kdtree.engine generate`` prints greedy / tree-speculative generations.

Exit codes: 0 done, 1 the run failed (a kernel that could not be built, the KV pool exhausted),
2 bad arguments (unknown device or backend, a backend this machine cannot run, bad prompt ids).
"""

from __future__ import annotations

import json
import random

import click

from kdtree.cli_support import common_options, run
from kdtree.engine.decode.backends import known_backends
from kdtree.engine.model.config import PRESETS
from kdtree.engine.decode.drafters import DRAFTER_NAMES


def _prompts(prompt_ids: str | None, seed: int, batch: int, vocab: int,
             prompt_len: int | None = None) -> list[list[int]]:
    if prompt_ids:
        try:
            base = [int(t) for t in prompt_ids.split(",") if t.strip()]
        except ValueError as err:
            raise click.BadParameter(f"expected comma-separated token ids, got {prompt_ids!r}") from err
        if not base:
            raise click.BadParameter("no token ids given", param_hint="--prompt-ids")
        # more prompts: the given one, then its suffixes' repetitions, all different lengths
        return [base] + [(base * (b + 2))[: len(base) + 3 * b] for b in range(1, batch)]
    rng = random.Random(seed)
    prompts = []
    for b in range(batch):
        length = prompt_len if prompt_len else rng.randint(4, 48)
        if b % 2:  # every other prompt repeats a motif, so prompt lookup has something to find
            motif = [rng.randrange(vocab) for _ in range(rng.randint(3, 8))]
            prompts.append((motif * length)[:length])
        else:
            prompts.append([rng.randrange(vocab) for _ in range(length)])
    return prompts


CONTEXT = {"help_option_names": ["-h", "--help"]}


@click.group(context_settings=CONTEXT)
@common_options
def main() -> None:
    """kdtree-engine demo."""


@main.command(context_settings=CONTEXT)
@click.option("--prompt-ids", default=None, help="comma-separated prompt token ids, e.g. 5,17,17,3")
@click.option("--prompt-len", default=None, type=click.IntRange(1), help="length of the random prompts "
              "(default: 4-48 tokens each)")
@click.option("--seed", default=0, show_default=True, help="seed of the random prompts (and the model)")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1, 256), help="number of prompts")
@click.option("--drafter", default="ddtree", show_default=True, type=click.Choice(list(DRAFTER_NAMES)))
@click.option("--budget", default=64, show_default=True, type=click.IntRange(1, 1024), help="tree nodes per request")
@click.option("--backend", default="torch", show_default=True, type=click.Choice(known_backends()),
              help="attention: kernel (alias cuda) = the owned CUDA kernel, triton = today's engines, "
                   "torch / reference on any device")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N")
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1, 4096))
@click.option("--preset", "preset_name", default="tiny", show_default=True,
              type=click.Choice(sorted(PRESETS)), help="model size")
@click.option("--cuda-graph/--no-cuda-graph", "cuda_graph", default=None,
              help="replay verify steps from CUDA graphs (default: on for --backend kernel on CUDA with a drafter)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of a report")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="CPU threads torch may use (torch.set_num_threads; default: torch's choice). On a busy "
                   "machine fewer threads than cores keeps tokens/s steady")
@common_options
def generate(prompt_ids, prompt_len, seed, batch, drafter, budget, backend, device, max_new_tokens, preset_name,
             cuda_graph, as_json, threads):
    """Generate greedily (--drafter none) or with tree speculative decoding."""
    from rich.console import Console  # noqa: PLC0415 - keep `--help` fast
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from kdtree.engine.api import build_model, check_device, generate as run_generate  # noqa: PLC0415
    from kdtree.engine.decode.backends import get_backend  # noqa: PLC0415
    from kdtree.engine.model.config import preset  # noqa: PLC0415

    err = Console(stderr=True)
    if threads is not None:
        import torch  # noqa: PLC0415

        torch.set_num_threads(threads)
    try:
        dev = check_device(device)
        if get_backend(backend).requires_cuda and dev.type != "cuda":
            raise click.BadParameter(f"backend {backend!r} runs on CUDA devices only; add --device cuda, or "
                                     "use --backend torch or reference on the CPU", param_hint="--backend")
        if cuda_graph and (backend not in ("kernel", "cuda") or dev.type != "cuda" or drafter == "none"):
            raise click.BadParameter("CUDA graphs capture verify steps on the kernel backend: they need "
                                     "--backend kernel --device cuda and a drafter; or pass --no-cuda-graph",
                                     param_hint="--cuda-graph")
        cfg = preset(preset_name)
        prompts = _prompts(prompt_ids, seed, batch, cfg.vocab_size, prompt_len)
        total = len(prompts) * max_new_tokens
        if as_json:
            model = build_model(cfg, seed=seed, device=dev)
            result = run_generate(prompts, model=model, drafter=drafter, budget=budget, backend=backend,
                                  max_new_tokens=max_new_tokens, cuda_graph=cuda_graph)
        else:
            with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=err, transient=True) as bar:
                task = bar.add_task(f"building the {preset_name} model on {dev}", total=total)
                model = build_model(cfg, seed=seed, device=dev)
                bar.update(task, description=f"prefill + decoding ({backend}, {drafter})")
                result = run_generate(prompts, model=model, drafter=drafter, budget=budget, backend=backend,
                                      max_new_tokens=max_new_tokens, cuda_graph=cuda_graph,
                                      on_step=lambda n: bar.advance(task, n))
    except click.ClickException:
        raise
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    except (RuntimeError, OSError) as exc:  # a kernel that cannot be built or loaded, the pool exhausted
        err.print(f"[red]error:[/] {exc}")
        raise SystemExit(1) from exc

    if as_json:
        payload = result.to_dict()
        payload["prompts"] = prompts
        click.echo(json.dumps(payload))
        return
    console = Console(soft_wrap=True)
    for i, (prompt, tokens) in enumerate(zip(prompts, result.tokens)):
        shown = prompt if len(prompt) <= 64 else f"{prompt[:32]} ... {prompt[-8:]}"
        console.print(f"[bold]request {i}[/] prompt ({len(prompt)}): {shown}")
        console.print(f"  new ({len(tokens)}): [green]{tokens}[/]")
    console.print(f"drafter [bold]{drafter}[/] budget {budget} backend {backend} on {result.device} "
                  f"({result.dtype}): {result.steps} steps, mean accepted length "
                  f"[bold]{result.mean_accepted:.2f}[/] tokens/step, {result.tokens_per_s:.1f} tokens/s "
                  f"(prefill {result.prefill_s:.2f} s, then [bold]{result.decode_tokens_per_s:.1f}[/] tokens/s)"
                  + (f"; {result.graph_replays} verify steps and {result.draft_graph_replays} draft passes replayed "
                     "from CUDA graphs" if result.cuda_graph else ""))


if __name__ == "__main__":
    run(main, prog_name="python -m kdtree.engine")
