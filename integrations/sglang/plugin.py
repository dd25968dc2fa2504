"""The ``sglang.srt.plugins`` entry point: ``--attention-backend triton`` builds our subclass.

SGLang calls every general plugin in each of its processes (engine, scheduler workers, ...)
before it builds attention backends; `register` replaces the registry's ``"triton"`` factory with
one that builds `kdtree.integrations.sglang.backend.backend_class()`. Keeping the name
``triton`` keeps every ``attention_backend == "triton"`` check in SGLang true (graph runners,
speculative workers, server-argument defaults), and the subclass hands everything but MLA target
verify to SGLang's own code. ``KDTREE_SGLANG=0`` in the environment leaves SGLang untouched;
so does an ``SGLANG_PLUGINS`` list (SGLang's own allow-list of plugin names) without ``kdtree``.

Each call logs one line to the ``kdtree.integrations.sglang`` logger: enabled or disabled, and why.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("kdtree.integrations.sglang")

BACKEND_NAME = "triton"
SWITCH = "KDTREE_SGLANG"


def register() -> None:
    """Register the backend under SGLang's ``triton`` name (no-op with KDTREE_SGLANG=0)."""
    if os.environ.get(SWITCH, "1") == "0":
        log.info("kdtree SGLang plugin disabled (%s=0): --attention-backend %s is SGLang's own", SWITCH,
                 BACKEND_NAME)
        return
    from sglang.srt.layers.attention.attention_registry import register_attention_backend  # noqa: PLC0415

    @register_attention_backend(BACKEND_NAME)
    def create_kdtree_triton_backend(runner):
        if runner.model_config.is_encoder_decoder:
            raise ValueError("Cross attention is not supported in the triton attention backend. "
                             "Please use `--attention-backend flashinfer`.")
        from kdtree.integrations.sglang.backend import backend_class  # noqa: PLC0415

        return backend_class()(runner)

    log.info("kdtree SGLang plugin enabled: --attention-backend %s runs MLA target verify (EAGLE trees, "
             "page size 1) on the kdtree kernel, everything else on SGLang's Triton code; %s=0 turns it off",
             BACKEND_NAME, SWITCH)
