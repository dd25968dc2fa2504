"""SGLang 0.5.23's own Triton kernels (``extend_attention_fwd``, ``decode_attention_fwd``) run on the
CPU under Triton's interpreter (``TRITON_INTERPRET=1``) through the Triton backend as SGLang serves it
(`kdtree.bench.decode_triton`), so the calls the decode benchmark's baseline makes are checked
against SGLang's real kernels without a GPU:

- `test_bench_decode_triton.py` again, its SGLang-signature stand-ins replaced by the real kernels
  (``KDTREE_TEST_REAL_SGLANG_KERNELS=1``): verify, decode and extend against the oracle, the graph
  body over a bucket's padded metadata against the eager logits, and phase 2's parity reference
  (SGLang's target-verify call on SGLang-format batches) against attention read off SGLang's layout;
- the same run with the verify mask lost (`broken_sglang_layout`): the verify checks fail;
- the decode benchmark's command with the Triton backend against the reference backend, eagerly:
  the same tokens.

Each runs in its own process (the interpreter is chosen when the kernels' module is loaded). The
kernel files come from `make sglang-kernels` (`scripts/fetch-sglang-kernels.py`, into
.kdtree-cache/sglang-kernels) or ``KDTREE_SGLANG_KERNELS``; without them the tests skip, saying so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def kernel_files() -> Path:
    where = os.environ.get("KDTREE_SGLANG_KERNELS") or str(ROOT / ".kdtree-cache" / "sglang-kernels")
    if not (Path(where) / "sglang" / "kernels" / "ops" / "attention" / "extend_attention.py").is_file():
        pytest.skip(f"SGLang's kernel files are not at {where}: `make sglang-kernels` fetches them "
                    "(or set KDTREE_SGLANG_KERNELS to a folder holding them)")
    try:
        import triton  # noqa: F401, PLC0415
    except ImportError as err:
        pytest.skip(f"triton is not installed: {err}")
    return Path(where)


def sglang_env(**extra: str) -> dict[str, str]:
    """The child's environment besides TRITON_INTERPRET: SGLang's kernel files and the control plugin
    on the path, no GPU."""
    path = os.pathsep.join([str(kernel_files()), str(HERE), os.environ.get("PYTHONPATH", "")])
    return {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path, **extra}


def pytest_run(run_interpreted, *extra: str):
    return run_interpreted(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu", "-rf", *extra,
                            str(HERE / "test_bench_decode_triton.py")], sglang_env(KDTREE_TEST_REAL_SGLANG_KERNELS="1"))


def test_the_backend_matches_the_oracle_on_sglangs_own_kernels(run_interpreted):
    done = pytest_run(run_interpreted)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert "15 passed" in done.stdout, tail  # every CPU check ran on the real kernels, none skipped


def test_a_lost_verify_mask_fails_against_sglangs_own_kernels(run_interpreted):
    # the kernel checks only (the layout tests read the mask directly)
    done = pytest_run(run_interpreted, "-p", "broken_sglang_layout", "-k", "oracle or graph_body")
    failed = {line.split("::")[1].split(" ")[0] for line in done.stdout.splitlines() if line.startswith("FAILED")}
    assert done.returncode == 1 and "2 failed, 3 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    assert failed == {"test_the_backend_through_sglang_signatures_matches_the_oracle[verify]",
                      "test_the_graph_body_on_the_backend_gives_the_eager_logits[verify]"}, done.stdout[-3000:]


def test_the_decode_benchmark_on_sglangs_kernels_emits_the_reference_tokens(run_interpreted, tmp_path):
    out = tmp_path / "decode.json"
    done = run_interpreted(["-m", "kdtree.tools.decode", "--context", "80", "--batch", "2", "--budget", "6",
                            "--new-tokens", "4", "--rounds", "1", "--backend", "triton", "--backend", "reference",
                            "--mode", "eager", "--baseline", "reference", "--preset", "tiny", "--device", "cpu",
                            "--no-breakdown", "--no-progress", "--json", str(out)], sglang_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    (context,) = record["contexts"]
    assert set(context["arms"]) == {"triton-eager", "reference-eager"}
    assert context["same_tokens"] and all(arm["same_tokens"] for arm in context["arms"].values())
    assert context["arms"]["triton-eager"]["steps"] >= 1
    assert "| 80 | 2 | triton-eager |" in done.stdout
