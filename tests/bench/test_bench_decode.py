"""The decode benchmark (`kdtree.bench.decode`) end to end on the CPU with the tiny model (torch and
reference backends, eager): every round of every arm kept, arms interleaved in rotated order,
every arm starting from the same state (same tokens), speedups with intervals, the step
breakdown; the table and the PNG (`kdtree.bench.decode_report`) with one series per arm. The GPU
test at the end runs the real arms (kernel, Triton as SGLang serves it, sm_120 path; graphs and
eager) on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from kdtree.bench.decode import DecodeConfig, decode_prompts, progress_units, run_decode
from kdtree.bench.decode_report import decode_figure, decode_table, save_plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def cpu_config(**update):
    base = dict(contexts=(24, 40), batches=(2,), budget=4, drafter="ddtree", new_tokens=3, rounds=2,
                backends=("torch", "reference"), modes=("eager",), baseline="reference", preset="tiny",
                device="cpu", breakdown=True)
    base.update(update)
    return DecodeConfig(**base)


@pytest.fixture(scope="module")
def record(tiny_model):
    labels = []
    config = cpu_config()
    rec = run_decode(config, model=tiny_model, progress=labels.append)
    rec["_labels"] = labels
    rec["_units"] = progress_units(config)
    return rec


@pytest.mark.slow
def test_every_round_of_every_arm_is_kept_interleaved(record):
    assert [c["context"] for c in record["contexts"]] == [24, 40]
    for ctx in record["contexts"]:
        arms = ctx["arms"]
        assert set(arms) == {"torch-eager", "reference-eager"}
        for arm in arms.values():
            assert [r["order"] for r in arm["rounds"]] == [0, 1]
            assert all(r["tokens"] == 2 * 3 - 2 for r in arm["rounds"])  # 3 per request, the first from prefill
            assert arm["tokens_per_s"]["rounds"] == [r["tokens_per_s"] for r in arm["rounds"]]
            assert arm["tokens_per_s"]["spread"] >= 1.0 and arm["same_tokens"]
        assert ctx["same_tokens"] and ctx["rounds_run"] == 2 and not ctx["cut_by_time_budget"]
        s = ctx["speedups"]["torch-eager/reference-eager"]
        assert s["ratio"] > 0 and math.isnan(s["low"])  # two rounds a side: no 95 % interval
    assert record["_units"] == len(record["_labels"])  # the progress bar's total is what it gets


@pytest.mark.slow
def test_the_breakdown_names_every_part(record):
    b = record["contexts"][0]["arms"]["torch-eager"]["breakdown"]
    for key in ("attention_gpu_ms", "rest_gpu_ms", "drafting_gpu_ms", "conversion_gpu_ms", "host_exposed_ms",
                "verify_gpu_ms", "gpu_ms_per_step", "step_ms"):
        assert b[key] >= 0, key
    assert b["draft_passes"] == 3  # ddtree at budget 4: min(max_depth 8, budget - 1)
    assert b["gpu_ms_per_step"] == pytest.approx(b["drafting_gpu_ms"] + b["verify_gpu_ms"])


@pytest.mark.slow
def test_table_and_png_have_every_arm(record, tmp_path):
    table = decode_table(record)
    assert "torch-eager" in table and "reference-eager" in table and "host not hidden" in table
    fig = decode_figure(record)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["torch-eager", "reference-eager"]
    series = {c.get_label(): c.lines[0] for c in ax.containers}  # one errorbar series per arm
    assert set(series) == set(labels)
    for name, line in series.items():
        assert list(line.get_xdata()) == [24, 40]
        assert list(line.get_ydata()) == [c["arms"][name]["tokens_per_s"]["median"] for c in record["contexts"]]
    path = tmp_path / "decode.png"
    assert save_plot(record, str(path)) == labels
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(path))
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100


def test_prompts_are_seeded_and_sized():
    a, b = decode_prompts(100, 50, 3, seed=1), decode_prompts(100, 50, 3, seed=1)
    assert a == b and len(a) == 3 and all(len(p) == 50 for p in a)
    assert decode_prompts(100, 50, 3, seed=2) != a


def test_bad_configs_say_what_is_wrong(tiny_model):
    with pytest.raises(ValueError, match="one batch size >= 1 per context"):
        cpu_config(batches=(1, 2, 3))
    with pytest.raises(ValueError, match="rounds must be an int >= 1"):
        cpu_config(rounds=0)
    with pytest.raises(ValueError, match="new_tokens must be an int >= 2"):
        cpu_config(new_tokens=1)
    with pytest.raises(ValueError, match="modes"):
        cpu_config(modes=("fast",))
    with pytest.raises(ValueError, match="positions"):
        run_decode(cpu_config(contexts=(5000,)), model=tiny_model)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        run_decode(cpu_config(modes=("graph",)), model=tiny_model)
    with pytest.raises(ValueError, match="unknown decode backend"):
        run_decode(cpu_config(backends=("nope", "reference")), model=tiny_model)


@pytest.mark.slow
def test_a_time_budget_stops_rounds_but_keeps_them(tiny_model):
    rec = run_decode(cpu_config(contexts=(24,), rounds=50, time_budget_s=1e-6, breakdown=False), model=tiny_model)
    ctx = rec["contexts"][0]
    assert ctx["cut_by_time_budget"] and ctx["rounds_run"] == 1
    assert all(len(a["rounds"]) == 1 for a in ctx["arms"].values())


@pytest.mark.gpu
def test_every_arm_on_the_gpu_emits_the_same_tokens_and_graphs_replay(tiny_cuda_model):
    from kdtree.bench.decode_triton import load_kernels

    try:
        load_kernels()
    except ImportError as err:
        pytest.skip(f"SGLang's Triton kernels are not loadable here: {err}")
    model = tiny_cuda_model
    config = DecodeConfig(contexts=(700,), batches=(2,), budget=16, drafter="ddtree", new_tokens=12, rounds=2,
                          preset="tiny", device="cuda")
    rec = run_decode(config, model=model)
    ctx = rec["contexts"][0]
    assert set(ctx["arms"]) == {f"{b}-{m}" for b in ("kernel", "triton", "sm120") for m in ("graph", "eager")}
    assert ctx["same_tokens"], {n: a["same_tokens"] for n, a in ctx["arms"].items()}
    for arm in ctx["arms"].values():
        assert arm["breakdown"]["attention_gpu_ms"] > 0 and arm["tokens_per_s"]["median"] > 0
    torch.cuda.synchronize()
