"""A scheduler process of SGLang 0.5.23, in the order it runs, on the CPU: run as a script.

What SGLang does, from its wheel (``sglang/srt/managers/scheduler.py``, ``run_scheduler_process``;
``sglang/srt/plugins/__init__.py``, ``load_plugins``; ``sglang/srt/utils/common.py``,
``configure_logger``), imitated here step by step:

1. ``load_plugins()``: every ``sglang.srt.plugins`` entry point is found through
   ``importlib.metadata``, loaded and called, SGLang logging ``Loaded plugin <name> from group
   <group>`` and ``Executed general plugin: <name>`` at INFO to ``sglang.srt.plugins``. Nothing has
   configured logging yet.
2. ``configure_logger(server_args, prefix=" TP0")``: ``logging.basicConfig(level=<--log-level>,
   format="[%(asctime)s TP0] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", force=True)``.
3. The model runner builds its attention backend from the registry's ``--attention-backend``
   factory, and the scheduler runs batches: here one target-verify batch.

SGLang's attention registry and ``TritonAttnBackend`` are stood in by a package the caller puts on
``sys.path`` (``sglang.srt.layers.attention``: ``attention_registry``, ``triton_backend``) over
`fake_sglang`; the plugin is the installed one, found by its entry point. Arguments:
``--log-level LEVEL``, ``--heads H``, ``--tree N``.
"""

from __future__ import annotations

import argparse
import logging
from importlib.metadata import entry_points


def load_plugins() -> None:
    logger = logging.getLogger("sglang.srt.plugins")
    group = "sglang.srt.plugins"
    loaded = {}
    for ep in entry_points(group=group):
        loaded[ep.name] = ep.load()
        logger.info("Loaded plugin %s from group %s", ep.name, group)
    for name, func in loaded.items():
        func()
        logger.info("Executed general plugin: %s", name)


def configure_logger(log_level: str, prefix: str) -> None:
    logging.basicConfig(level=getattr(logging, log_level.upper()), format=f"[%(asctime)s{prefix}] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", force=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--tree", type=int, default=8)
    args = parser.parse_args()

    load_plugins()
    configure_logger(args.log_level, " TP0")

    import fake_sglang  # noqa: PLC0415
    from kdtree.bench.sglang_batches import make_verify_batch  # noqa: PLC0415
    from kdtree.kernels.reference import tree_verify_mla_reference  # noqa: PLC0415
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS  # noqa: PLC0415

    fx = make_verify_batch(args.heads, [40], args.tree, seed=1)
    runner = fake_sglang.runner_for(fx)
    runner.model_config = argparse.Namespace(is_encoder_decoder=False)
    backend = ATTENTION_BACKENDS["triton"](runner)
    type(backend).launch_op = fake_sglang.RecordingLaunch(tree_verify_mla_reference)  # the CPU has no kernel
    batch = fake_sglang.batch_for(fx)
    for _ in range(2):
        backend.init_forward_metadata(batch)
        backend.forward_extend(fx["q"], fx["k_extend"], fx["v_extend"], fake_sglang.mla_layer(args.heads), batch)
    print("route:", backend.kd_last_route[0])


if __name__ == "__main__":
    main()
