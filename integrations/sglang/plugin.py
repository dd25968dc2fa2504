"""The ``sglang.srt.plugins`` entry point: ``--attention-backend triton`` builds our backend class.

SGLang calls every general plugin in each of its processes (engine, scheduler workers, ...)
before it builds attention backends; `register` replaces the registry's ``"triton"`` factory with
one that builds `kdtree.integrations.sglang.backend.backend_class()`. Keeping the name
``triton`` keeps every ``attention_backend == "triton"`` check in SGLang true (graph runners,
speculative workers, server-argument defaults), and the class hands everything but MLA target
verify to SGLang's own code. ``KDTREE_SGLANG=0`` in the environment leaves SGLang untouched;
so does an ``SGLANG_PLUGINS`` list (SGLang's own allow-list of plugin names) without ``kdtree``.

What it logs, to the ``kdtree.integrations.sglang`` logger: SGLang 0.5.23 loads plugins before it
configures logging (its scheduler process runs ``load_plugins()`` and then ``configure_logger``),
so a line logged while loading is dropped. The "enabled" line is therefore logged when the
factory first builds a backend in a process, long after logging is configured. The "disabled"
line (``KDTREE_SGLANG=0``) can only be logged at load, and shows only where logging was configured
before (``python -m kdtree.kernels.info`` reports the switch either way).
"""

from __future__ import annotations

import logging

from kdtree.envvars import KDTREE_SGLANG

log = logging.getLogger("kdtree.integrations.sglang")

BACKEND_NAME = "triton"
SWITCH = KDTREE_SGLANG.name

_announced = False  # the "enabled" line, once per process


def enabled_line() -> str:
    """What a process logs when it builds its first backend with the plugin on."""
    return (f"kdtree SGLang plugin enabled: --attention-backend {BACKEND_NAME} runs MLA target verify (EAGLE "
            "trees, page size 1) on the kdtree kernel, everything else on SGLang's Triton code; "
            f"{SWITCH}=0 turns it off")


def _announce_once() -> None:
    global _announced
    if not _announced:
        _announced = True
        log.info("%s", enabled_line())


def register() -> None:
    """Register the backend under SGLang's ``triton`` name (no-op with KDTREE_SGLANG=0)."""
    if KDTREE_SGLANG.is_off():
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

        backend = backend_class()(runner)
        _announce_once()
        return backend

    log.debug("kdtree SGLang plugin registered under --attention-backend %s", BACKEND_NAME)
