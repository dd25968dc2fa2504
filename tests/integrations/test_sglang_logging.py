"""What the SGLang plugin says in a server log.

SGLang 0.5.23 loads plugins before it configures logging, so what the plugin says must be said
later: the "enabled" line when the first backend of a process is built, the first-batch line when
the kernel first serves a verify batch. `test_a_server_shows_both_lines_in_sglangs_load_order`
runs SGLang's order in a fresh process (`sglang_load_order`); the rest use stand-ins in-process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import fake_sglang
from kdtree.integrations.sglang import plugin
from kdtree.integrations.sglang.backend import CPU_PLAN_DEVICE, make_backend_class
from kdtree.bench.sglang_batches import make_verify_batch
from kdtree.kernels import launch_plan
from test_sglang_backend import _fake_registry

LOGGER = "kdtree.integrations.sglang"
HERE = Path(__file__).resolve().parent


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def _backend_class():
    cls = make_backend_class(fake_sglang.TritonAttnBackend)
    cls.launch_op = fake_sglang.RecordingLaunch()
    return cls


def _step(backend, fx, mode="target_verify", layer=None):
    batch = fake_sglang.batch_for(fx, mode)
    backend.init_forward_metadata(batch)
    layer = layer or fake_sglang.mla_layer(2)
    return backend.forward_extend(fx["q"], fx["k_extend"], fx["v_extend"], layer, batch)


def _stand_in_sglang(root: Path) -> Path:
    """SGLang's attention registry and Triton backend module, stood in on disk for a subprocess."""
    pkg = root / "sglang" / "srt" / "layers" / "attention"
    pkg.mkdir(parents=True)
    for folder in (root / "sglang", root / "sglang" / "srt", root / "sglang" / "srt" / "layers", pkg):
        (folder / "__init__.py").write_text("")
    (pkg / "attention_registry.py").write_text(
        "ATTENTION_BACKENDS = {'triton': 'sglang\\'s own'}\n\n"
        "def register_attention_backend(name):\n"
        "    def deco(fn):\n        ATTENTION_BACKENDS[name] = fn\n        return fn\n    return deco\n")
    (pkg / "triton_backend.py").write_text("from fake_sglang import KVWriteLoc, TritonAttnBackend  # noqa: F401\n")
    return root


def _serve(tmp_path, *args, env=None) -> subprocess.CompletedProcess:
    root = _stand_in_sglang(tmp_path / "site")
    environ = {k: v for k, v in os.environ.items() if k not in ("KDTREE_SGLANG", "SGLANG_PLUGINS")}
    environ.update(PYTHONPATH=os.pathsep.join([str(root), str(HERE)]), **(env or {}))
    return subprocess.run([sys.executable, str(HERE / "sglang_load_order.py"), *args], capture_output=True, text=True,
                          env=environ, cwd=tmp_path, timeout=300)


@pytest.mark.slow
def test_a_server_shows_both_lines_in_sglangs_load_order(tmp_path):
    done = _serve(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "route: kernel" in done.stdout
    ours = [line for line in done.stderr.splitlines() if "kdtree" in line and "plugin" not in line.split("] ")[0]]
    enabled = [line for line in ours if "kdtree SGLang plugin enabled" in line]
    served = [line for line in ours if "kdtree kernel serves MLA target verify" in line]
    assert len(enabled) == 1 and enabled[0].startswith("[") and " TP0] " in enabled[0]
    assert "--attention-backend triton" in enabled[0] and "KDTREE_SGLANG=0" in enabled[0]
    # the documentation's example: 8 draft tokens and 16 heads on an H200 (the CPU plans for one)
    assert len(served) == 1 and "variant wgmma (" in served[0], served
    assert "first batch 1 requests, 8 draft tokens, 16 heads" in served[0]
    # SGLang's own loading lines come before its logging exists: they are not in the log
    assert "Loaded plugin kdtree" not in done.stderr


@pytest.mark.slow
def test_a_server_at_warning_level_shows_neither(tmp_path):
    done = _serve(tmp_path, "--log-level", "warning")
    assert done.returncode == 0, done.stderr
    assert "kdtree" not in done.stderr


def test_registering_says_nothing_at_info_building_the_first_backend_says_enabled_once(monkeypatch, caplog):
    registry = _fake_registry(monkeypatch)
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.attention.triton_backend",
                        types.SimpleNamespace(TritonAttnBackend=fake_sglang.TritonAttnBackend))
    monkeypatch.delenv("KDTREE_SGLANG", raising=False)
    monkeypatch.setattr(plugin, "_announced", False)
    fx = make_verify_batch(2, [10], 4, seed=1)
    runner = fake_sglang.runner_for(fx)
    runner.model_config = types.SimpleNamespace(is_encoder_decoder=False)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        plugin.register()
        assert _lines(caplog) == []
        registry.ATTENTION_BACKENDS["triton"](runner)
        registry.ATTENTION_BACKENDS["triton"](runner)  # a second backend (the draft model's) says nothing
    (line,) = _lines(caplog)
    assert line == plugin.enabled_line()
    assert "enabled" in line and "--attention-backend triton" in line and "KDTREE_SGLANG=0" in line


def test_loading_with_the_switch_off_says_disabled_and_why(monkeypatch, caplog):
    registry = _fake_registry(monkeypatch)
    monkeypatch.setenv("KDTREE_SGLANG", "0")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        plugin.register()
    (line,) = _lines(caplog)
    assert "disabled" in line and "KDTREE_SGLANG=0" in line
    assert registry.ATTENTION_BACKENDS["triton"] == "sglang's own"


@pytest.mark.parametrize("heads,tree_size,requests,variant", [
    (16, 8, 1, "wgmma"),   # docs/sglang.md's example on an H200: 128 rows per request
    (2, 9, 2, "ws"),       # 18 rows per request: past base16's 16
    (1, 9, 2, "base16"),
    (2, 40, 2, "wgmma"),
])
def test_the_first_verify_batch_names_the_plan_that_runs(caplog, heads, tree_size, requests, variant):
    fx = make_verify_batch(heads, [37, 5][:requests], tree_size, seed=3)
    cls = _backend_class()
    backend = cls(fake_sglang.runner_for(fx))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _step(backend, fx, layer=fake_sglang.mla_layer(heads))
        _step(backend, fx, layer=fake_sglang.mla_layer(heads))
    assert backend.kd_last_route[0] == "kernel"
    ran = cls.launch_op.plans[0]
    assert launch_plan.variant_name(ran.variant) == variant
    (line,) = _lines(caplog)
    # on the CPU the plan is made for an H200 (9.0): the line still names the device it ran on
    assert f"variant {variant} ({ran.num_splits} KV split" in line and "the CPU" in line
    assert "compute capability 9.0" in line and CPU_PLAN_DEVICE.capability == (9, 0)
    assert f"{requests} requests, {requests * tree_size} draft tokens, {heads} heads" in line


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
