"""What the SGLang plugin says in a server log (CPU, SGLang's classes stood in by `fake_sglang`).

One line when the plugin loads (enabled or disabled, and why); one line on the first
target-verify batch the kernel serves (variant, GPU, compute capability); one line per distinct
reason a target-verify batch goes to SGLang's own path, never one per batch.
"""

from __future__ import annotations

import logging

import pytest

import fake_sglang
from kdtree.integrations.sglang import plugin
from kdtree.integrations.sglang.backend import make_backend_class
from kdtree.integrations.sglang.fixtures import make_verify_batch
from kdtree.kernels.reference import tree_verify_mla_reference
from test_sglang_backend import _fake_registry

LOGGER = "kdtree.integrations.sglang"


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def _backend_class():
    cls = make_backend_class(fake_sglang.TritonAttnBackend)
    cls.verify_op = staticmethod(tree_verify_mla_reference)
    return cls


def _step(backend, fx, mode="target_verify", layer=None):
    batch = fake_sglang.batch_for(fx, mode)
    backend.init_forward_metadata(batch)
    layer = layer or fake_sglang.mla_layer(2)
    return backend.forward_extend(fx["q"], fx["k_extend"], fx["v_extend"], layer, batch)


def test_loading_says_enabled_and_how_to_turn_it_off(monkeypatch, caplog):
    _fake_registry(monkeypatch)
    monkeypatch.delenv("KDTREE_SGLANG", raising=False)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        plugin.register()
    (line,) = _lines(caplog)
    assert "enabled" in line and "--attention-backend triton" in line and "KDTREE_SGLANG=0" in line


def test_loading_with_the_switch_off_says_disabled_and_why(monkeypatch, caplog):
    registry = _fake_registry(monkeypatch)
    monkeypatch.setenv("KDTREE_SGLANG", "0")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        plugin.register()
    (line,) = _lines(caplog)
    assert "disabled" in line and "KDTREE_SGLANG=0" in line
    assert registry.ATTENTION_BACKENDS["triton"] == "sglang's own"


@pytest.mark.parametrize("tree_size,variant", [(9, "base16"), (40, "ws")])
def test_the_first_verify_batch_names_variant_device_and_capability_once(caplog, tree_size, variant):
    fx = make_verify_batch(2, [37, 5], tree_size, seed=3)
    backend = _backend_class()(fake_sglang.runner_for(fx))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _step(backend, fx)
        _step(backend, fx)
    assert backend.kd_last_route[0] == "kernel"
    (line,) = _lines(caplog)
    # on the CPU the plan is made for an H200 (9.0): the line still names the device it ran on
    assert f"variant {variant} " in line and "the CPU" in line and "compute capability 9.0" in line
    assert f"2 requests, {2 * tree_size} draft tokens, 2 heads" in line


def test_a_fallback_reason_is_logged_once_not_per_batch(caplog):
    fx = make_verify_batch(2, [10], 4, seed=2)
    backend = _backend_class()(fake_sglang.runner_for(fx))
    capped = fake_sglang.mla_layer(2, logit_cap=30.0)
    scaled = fake_sglang.mla_layer(2, k_scale=0.5)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            assert _step(backend, fx, layer=capped) is fake_sglang.PARENT_RESULT
        assert _step(backend, fx, layer=scaled) is fake_sglang.PARENT_RESULT
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    assert "SGLang's Triton path" in lines[0] and "logit capping" in lines[0]
    assert "scaled (quantised) KV" in lines[1]


def test_a_backend_the_kernel_can_never_serve_says_why_once(caplog):
    fx = make_verify_batch(2, [10], 4, seed=4)
    cls = _backend_class()
    backend = cls(fake_sglang.runner_for(fx, use_mla=False))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _step(backend, fx)
        _step(backend, fx)
        cls(fake_sglang.runner_for(fx, use_mla=False))  # another instance of the class (a second layer set)
        _step(backend, fx)
    (line,) = _lines(caplog)
    assert "the model is not MLA" in line


@pytest.mark.parametrize("mode", ["extend", "decode", "draft_extend"])
def test_batches_that_are_not_target_verify_log_nothing(caplog, mode):
    fx = make_verify_batch(2, [10], 4, seed=1)
    backend = _backend_class()(fake_sglang.runner_for(fx))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert _step(backend, fx, mode=mode) is fake_sglang.PARENT_RESULT
    assert _lines(caplog) == []
