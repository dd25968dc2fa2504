"""The benchmark's CPU-testable parts: inputs, the per-config logic (timed by the tools' host timer
off CUDA), the JSON / markdown / PNG report from synthetic rows, the CLI without a GPU, the
roofline; on a GPU, that the tools' timer keeps host time out of the timings."""

from __future__ import annotations

import json
import time

import pytest
import torch

from kdtree.bench import grid, roofline, timing
from kdtree.bench.cases import LAYOUTS, case_args, uniform_case
from kdtree.kernels.masks import unpack_bool_rows
from kdtree.kernels.naive import tree_verify_mla_naive
from kdtree.kernels.reference import tree_verify_mla_reference
from kdtree.tools import bench, bench_report
from kdtree.tools import roofline as roofline_cli


@pytest.fixture
def pool():
    return torch.randn(5000, 576, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_uniform_case_follows_the_contract(pool, layout):
    case = uniform_case(4, 40, 3, 100, layout, pool, seed=7)
    args = case_args(case)
    out = tree_verify_mla_reference(*args)  # validates the whole call
    assert out.shape == (120, 4, 512) and case["kv_cache"] is pool
    idx = case["kv_indices"]
    assert idx.numel() == 3 * 140 and idx.unique().numel() == idx.numel()  # distinct slots
    if layout == "contiguous":
        assert torch.equal(idx - idx[0], torch.arange(idx.numel(), dtype=torch.int32))
    else:
        assert not torch.equal(idx.sort().values, idx)  # scattered, not accidentally sorted
    vis = unpack_bool_rows(case["tree_mask"], 40)
    assert vis[:, 0].all() and vis.diagonal().all()  # every node sees the root and itself
    other = uniform_case(4, 40, 3, 100, layout, pool, seed=8)
    assert not torch.equal(other["q"], case["q"])  # fresh seed, fresh inputs


def test_uniform_case_rejects_a_pool_too_small(pool):
    with pytest.raises(ValueError, match="pool"):
        uniform_case(1, 4, 8, 1000, "scattered", pool, seed=0)
    with pytest.raises(ValueError, match="layout"):
        uniform_case(1, 4, 1, 10, "paged", pool, seed=0)


def test_floor_matches_design_table():
    # docs/design.md section 3b, floor column at 4244 GB/s and 788 TFLOP/s
    for (H, T, B, L), want_ms in [((8, 16, 1, 32768), 0.012), ((8, 16, 1, 131072), 0.046),
                                  ((64, 16, 8, 32768), 0.74), ((64, 64, 8, 131072), 11.9)]:
        got = roofline.floor_seconds(roofline.Shape(H, T, B, L), 4.244e12, 7.88e14) * 1e3
        assert got == pytest.approx(want_ms, rel=0.06)


def test_roofline_counts_and_cli(capsys):
    s = roofline.Shape(8, 4, 1, 4096)
    assert roofline.flops(s) == 2 * 8 * 4 * 4100 * 1088
    assert roofline.bytes_moved(s) >= 4100 * 1152 + 4 * 8 * 2176
    roofline_cli.main(["--bw", "4.3e12", "--flops", "7.88e14", "--quick"])
    table = capsys.readouterr().out
    assert table.count("\n| ") == 1 + len(roofline.grid(True))
    assert "bandwidth" in table and "tensor core" in table


def test_grids():
    full, quick = grid.bench_grid(False), grid.bench_grid(True)
    assert len(full) == 4 * 4 * 2 * 3 + 2 * 2 * 3 and len(set(full)) == len(full)
    assert set(quick) <= set(full) and len(quick) == 8
    assert max(s.T for s in full) == 1024 and {s.L for s in full} == {4096, 32768, 131072}


def _broken(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, *, out=None, lse=None):
    out = tree_verify_mla_naive(q, kv_cache, qo_indptr, kv_indptr, kv_indices, tree_mask, sm_scale, out=out)
    return out.mul_(-1)


def _slow(*args, out=None, lse=None):
    time.sleep(0.3)
    return tree_verify_mla_naive(*args, out=out)


def test_bench_config_checks_skips_and_times(pool, monkeypatch):
    monkeypatch.setattr(grid, "SKIP_SECONDS", 0.2)
    monkeypatch.setattr(grid, "TARGET_SECONDS", 0.02)
    fns = {"naive": tree_verify_mla_naive, "broken": _broken, "slow": _slow}
    model = grid._CostModel()
    rows = grid.bench_config(roofline.Shape(2, 8, 2, 64), "scattered", fns, pool, 1e12, 1e14,
                              seed=3, model=model, timer=timing.HostTimer())
    by = {r["impl"]: r for r in rows}
    assert by["naive"]["status"] == "ok" and by["naive"]["check"] == "anchor"
    assert by["naive"]["reps"] >= grid.MIN_REPS and by["naive"]["min_ms"] <= by["naive"]["median_ms"]
    assert by["broken"]["status"] == "disagree" and by["broken"]["rel_l2"] > 1.0
    assert by["slow"]["status"] == "skipped" and by["slow"]["reps"] == 1
    # with a second measurement the cost model predicts `slow` over the limit: it is not called again
    calls = []

    def counted_slow(*args, **kwargs):
        calls.append(1)
        return _slow(*args, **kwargs)

    model.add("slow", roofline.Shape(2, 8, 2, 64), 0.3)
    rows = grid.bench_config(roofline.Shape(2, 8, 2, 64), "contiguous", {"naive": tree_verify_mla_naive,
                              "slow": counted_slow}, pool, 1e12, 1e14, seed=4, model=model, timer=timing.HostTimer())
    by = {r["impl"]: r for r in rows}
    assert by["slow"]["status"] == "skipped" and "cost model" in by["slow"]["note"] and not calls
    assert by["naive"]["status"] == "ok" and by["naive"]["check"].startswith("unchecked")


class _RecordingTimer(timing.HostTimer):
    """A host timer that logs each call and claims a lead, as a QueuedTimer has on CUDA."""

    def __init__(self, log, lead_s=0.0):
        super().__init__()
        self.log, self.lead_s = log, lead_s

    def __call__(self, fn):
        self.log.append("timed")
        return super().__call__(fn)


def test_round_robin_interleaves_through_the_timer_and_returns_host_seconds():
    log = []
    calls = {"a": lambda r: log.append(f"a{r}"), "b": lambda r: (log.append(f"b{r}"), time.sleep(0.002))}
    host = {"a": [], "b": []}
    gpu = timing.round_robin(calls, repeats={"a": 2, "b": 1}, timer=_RecordingTimer(log), host=host)
    assert log == ["timed", "a0", "timed", "b0", "timed", "a1"]
    assert [len(gpu["a"]), len(gpu["b"]), len(host["a"]), len(host["b"])] == [2, 1, 2, 1]
    assert host["b"][0] >= 0.002 and host["a"][0] < host["b"][0]
    assert isinstance(timing.make_timer("cpu"), timing.HostTimer)  # no queued timer off CUDA


def test_bench_config_reports_host_time_and_lead_overruns(pool, monkeypatch):
    monkeypatch.setattr(grid, "TARGET_SECONDS", 0.01)
    log = []
    rows = grid.bench_config(roofline.Shape(2, 8, 2, 64), "scattered", {"naive": tree_verify_mla_naive}, pool,
                              1e12, 1e14, seed=3, model=grid._CostModel(), timer=_RecordingTimer(log, 1e-9))
    (row,) = rows
    assert row["host_us"] > 0 and len(log) == 1 + row["reps"]  # the first call and every timed one
    assert row["lead_overruns"] == row["reps"] and "host time > 0.001 µs lead" in row["note"]


def _synthetic_rows():
    rows = []
    for s in [roofline.Shape(8, 16, 1, 4096), roofline.Shape(8, 16, 1, 32768), roofline.Shape(64, 256, 8, 131072)]:
        floor = roofline.floor_seconds(s, 4.2e12, 7.9e14)
        for layout in LAYOUTS:
            for impl, slowdown in (("cuda", 1.5), ("triton", 60.0), ("naive", 8.0)):
                med = floor * slowdown
                row = dict(H=s.H, T=s.T, B=s.B, L=s.L, layout=layout, impl=impl, label=s.label,
                           floor_ms=floor * 1e3, bytes=roofline.bytes_moved(s), flops=roofline.flops(s),
                           status="ok", note="", median_ms=med * 1e3, min_ms=med * 900, max_ms=med * 1200,
                           reps=5, gbps=1.0, tflops=1.0, fraction=1 / slowdown, host_us=12.34)
                if impl == "triton" and s.L == 131072:
                    row = {k: v for k, v in row.items() if k not in ("median_ms", "fraction")}
                    row.update(status="skipped", note="est. 3.4 s/call > 2 s (cost model)")
                if impl == "naive" and s.L == 32768 and layout == "scattered":
                    row.update(status="disagree", note="rel-L2 0.3 vs cuda > 0.02")
                rows.append(row)
    return rows


def test_write_report_from_synthetic_rows(tmp_path):
    rows = _synthetic_rows()
    facts = dict(gpu="NVIDIA H200", sm="9.0", driver="580.1", torch="2.11", triton="3.6", nvcc="13.0",
                 git_sha="abc123", git_dirty=False, date="2026-12-02", command="python -m kdtree.tools.bench",
                 copy_bytes_per_s=4.2e12, bf16_flops_per_s=7.9e14, not_run=["H128 T1024 B1 L128k scattered"],
                 impl_errors={}, flush_bytes=256 * 2**20, flush_mode="read", lead_s=200e-6)
    paths = bench_report.write_report(rows, facts, tmp_path / "out")
    assert [p.name for p in paths] == ["bench.json", "bench.md", "bench_time.png", "bench_roofline.png"]
    data = json.loads(paths[0].read_text())
    assert data["facts"]["gpu"] == "NVIDIA H200" and len(data["rows"]) == len(rows)
    md = paths[1].read_text()
    assert "## scattered slots" in md and "## contiguous slots" in md
    assert md.count("\n| 8 | 16 | 1 | 4k |") == 2 and "## every row" in md
    assert "skipped (est. 3.4 s/call" in md and "✗" in md and "40.0×" in md
    assert "Not run (time budget spent): 1 configs" in md
    assert "L2 wiped (256 MiB read, leaving it clean)" in md and "200 µs GPU busy-wait" in md
    every = md.split("## every row")[1].splitlines()
    assert "| reps | host µs | GB/s |" in every[2]
    assert every[4].startswith("| H8 T16 B1 L4k | scattered | cuda | ok |") and "| 5 | 12.3 | 1 |" in every[4]
    for png in paths[2:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_write_report_with_no_rows(tmp_path):
    paths = bench_report.write_report([], {"not_run": ["H8 T4 B1 L4k scattered"]}, tmp_path)
    assert all(p.exists() for p in paths) and "Not run" in paths[1].read_text()


def test_cli_without_gpu_says_so(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--quick"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


@pytest.fixture
def host_clock(monkeypatch):
    """Run the benchmark driver on the CPU: the host timer, cheap ceilings."""
    monkeypatch.setattr(grid, "measure_ceilings", lambda device="cuda": (2e10, 5e11))
    monkeypatch.setattr(grid, "TARGET_SECONDS", 0.005)


def test_run_on_cpu_with_budget(host_clock):
    log = []
    shapes = [roofline.Shape(2, 8, 2, 64), roofline.Shape(1, 1, 1, 0)]
    rows, facts = grid.run(["naive"], shapes, list(LAYOUTS), pool_gb=0.002, budget_s=60,
                            argv=["--impl", "naive"], log=log.append, device="cpu")
    assert len(rows) == 4 and all(r["status"] == "ok" and r["reps"] >= grid.MIN_REPS for r in rows)
    assert facts["copy_bytes_per_s"] == 2e10 and facts["command"].endswith("--impl naive")
    assert facts["impls"] == ["naive"] and facts["not_run"] == [] and facts["impl_errors"] == {}
    assert any(line.startswith("[4/4") for line in log)
    rows, facts = grid.run(["naive"], shapes, ["scattered"], 0.002, budget_s=-1, argv=[], log=log.append,
                            device="cpu")
    assert rows == [] and facts["not_run"] == ["H2 T8 B2 L64 scattered", "H1 T1 B1 L0 scattered"]


def test_main_writes_the_report(host_clock, monkeypatch, tmp_path):
    import functools

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "run", functools.partial(bench.run, device="cpu"))
    out = tmp_path / "res"
    assert bench.main(["--quick", "--impl", "naive", "--filter", "H8 T16 B1 ", "--pool-gb", "0.05",
                       "--layout", "both", "--out", str(out)]) == 0
    data = json.loads((out / "bench.json").read_text())
    assert [(r["label"], r["layout"]) for r in data["rows"]] == [("H8 T16 B1 L32k", "scattered"),
                                                                  ("H8 T16 B1 L32k", "contiguous")]
    assert (out / "bench.md").exists() and (out / "bench_roofline.png").exists()
    assert bench.main(["--filter", "no such shape"]) == 2


@pytest.mark.gpu
def test_gpu_timer_keeps_host_time_out_of_the_timings():
    x = torch.ones(1024, device="cuda")
    x.add_(1)
    torch.cuda.synchronize()

    def call(r):
        time.sleep(0.005)  # 5 ms on the host before the launch
        x.add_(1)

    plain = timing.round_robin({"k": call}, repeats=3, timer=timing.make_timer(lead_s=0.0))
    led_host = {"k": []}
    led = timing.round_robin({"k": call}, repeats=3, timer=timing.make_timer(lead_s=0.02), host=led_host)
    assert min(plain["k"]) >= 0.0049, plain  # idle GPU: the host's 5 ms are counted
    assert max(led["k"]) < 0.0025, led  # queued behind the busy-wait: only GPU time
    assert min(led_host["k"]) >= 0.005  # host time reported separately


def test_cli_refuses_bad_numbers_and_variants(capsys):
    for argv in (["--pool-gb", "0"], ["--splits", "0"], ["--variant", "g64"], ["--budget-s", "-1"],
                 ["--filter", "H8 ("]):
        assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--pool-gb': expected a finite number > 0, got '0'" in err
    assert "Invalid value for '--splits': expected a whole number >= 1, got '0'" in err
    assert "Invalid value for '--variant': 'g64' is not one of" in err
    assert "Invalid value for --filter: 'H8 (' is not a regular expression" in err
    assert "Traceback" not in err


def test_report_says_how_the_l2_was_wiped(tmp_path):
    facts = dict(gpu="g", sm="9.0", driver="d", torch="t", triton="t", nvcc="n", git_sha="s", git_dirty=False,
                 date="2026-12-02", command="c", copy_bytes_per_s=4e12, bf16_flops_per_s=8e14, not_run=[],
                 impl_errors={}, flush_bytes=2**20, lead_s=200e-6)
    md = bench_report.write_report([], dict(facts, flush_mode="write"), tmp_path / "w")[1].read_text()
    assert "L2 wiped (1 MiB written, leaving it dirty)" in md
    md = bench_report.write_report([], dict(facts, flush_mode="read"), tmp_path / "r")[1].read_text()
    assert "L2 wiped (1 MiB read, leaving it clean)" in md
