"""kdtree.bench.variant_audit (what kdtree.tools.variant_audit runs) on the CPU: the torch backend
stays in the oracle's band, a wrong-scale backend is an outlier, a backend whose reruns differ is
a race."""

import pytest
import torch

from kdtree.engine import build_model, preset
from kdtree.engine.decode.backends import TorchBackend, dense_attention
from kdtree.bench.variant_audit import audit, path_tree, position_drifts


class ScaledBackend(TorchBackend):
    """Softmax scale off by `factor`: the wrong-scale defect."""

    def __init__(self, factor: float):
        self.factor = factor

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        return dense_attention(q, kv_cache, meta, sm_scale * self.factor)


class NoisyBackend(TorchBackend):
    """Correct but for fresh noise on every verify call: what a race looks like from outside."""

    def forward_verify(self, q, kv_cache, meta, sm_scale):
        out = dense_attention(q, kv_cache, meta, sm_scale)
        return out + 1e-3 * torch.randn_like(out)


def _prompts():
    return [[5, 9, 13, 2, 7, 7, 1], [3, 3, 8], [11, 4, 6, 10, 12, 1, 1, 2, 5]]


def test_path_tree_carries_the_path_as_a_chain_with_branches():
    path = [4, 8, 15, 16, 23, 42]
    tree, nodes = path_tree(path, 10, 64, seed=1)
    assert [tree.tokens[n] for n in nodes] == path
    assert all(tree.parents[nodes[k]] == nodes[k - 1] for k in range(1, len(nodes)))
    assert len(tree) > len(path)  # branches were hung on
    for k in range(len(path) - 1):  # following the path token by token lands on the next path node
        assert tree.child(nodes[k], path[k + 1]) == nodes[k + 1]


def test_path_tree_never_gives_a_node_two_children_with_one_token():
    for seed in range(50):  # a 3-token vocabulary: branches and path tokens collide all the time
        path = [seed % 3, (seed + 1) % 3, seed % 3, 2, 2, 1]
        tree, nodes = path_tree(path, 12, 3, seed=seed)
        assert [tree.tokens[n] for n in nodes] == path


def test_position_drifts_flag_a_flip_and_measure_the_margin():
    ref = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.9]])
    cand = torch.tensor([[3.0, 1.0, 0.0], [0.0, 1.9, 2.0]])
    d = position_drifts(0, ref, cand)
    assert not d[0].flipped and d[0].drift_max == 0
    assert d[1].flipped and abs(d[1].margin - 0.1) < 1e-6 and abs(d[1].drift_margin - 0.2) < 1e-6


def test_audit_tells_a_wrong_scale_and_a_race_from_a_correct_backend():
    model = build_model(preset("tiny"), seed=0, device="cpu")
    backends = {"torch": TorchBackend(), "scale+2%": ScaledBackend(1.02), "noisy": NoisyBackend()}
    result = audit(model, _prompts(), backends, new_tokens=6, tree_nodes=12, seed=3, repeats=2,
                   progress=lambda _: None)
    by_name = {s["backend"]: s for s in result["summaries"]}
    assert by_name["torch"]["drift_max_worst"] < 1e-3
    assert by_name["torch"]["rerun_unequal"] == 0
    assert result["verdict"]["torch"].startswith("in band")
    assert result["verdict"]["scale+2%"].startswith("outlier")
    assert result["verdict"]["noisy"].startswith("race")


@pytest.mark.gpu
def test_on_the_gpu_every_runnable_variant_stays_in_the_oracles_band():
    """ws and (on 9.0) wgmma against the fp64 oracle on phase 2's workload, short prompts only: same
    drift band, no flips at margins above the phase-2 tie margin, bitwise-equal reruns."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine (torch.cuda.is_available() is False)")
    from kdtree.bench.verify_step import token_exact_prompts
    from kdtree.kernels.launch_plan import runnable_variants
    from kdtree.bench.variant_audit import ForcedVariantBackend

    variants = [v for v in ("ws", "wgmma") if v in runnable_variants(torch.cuda.get_device_capability())]
    if not variants:
        pytest.skip("neither ws nor wgmma runs on this GPU (sm_90+ needed)")
    model = build_model(preset("tiny-long"), seed=0, device="cuda")
    prompts = token_exact_prompts(12, 0, 0, model.config.vocab_size, seed=11)
    result = audit(model, prompts, {v: ForcedVariantBackend(v) for v in variants}, new_tokens=24,
                   tree_nodes=64, seed=11, repeats=2, progress=lambda _: None)
    for name, text in result["verdict"].items():
        assert text.startswith("in band"), (name, text)
    for name, rows in result["positions"].items():
        assert not [r for r in rows if r["flipped"] and r["margin"] >= 0.1], name
