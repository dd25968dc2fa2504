"""kdtree.bench.timeline and kdtree.tools.timeline on synthetic dumps (CPU): decode, save/load,
the lane spans, the summary figures, the picture, and the CLI's refusals."""

import json
import os

import numpy as np
import pytest
import torch

from kdtree.bench import timeline as tlm
from kdtree.tools.timeline import main, parse_tiles

LANES, TILES, EVENTS = 4, 12, 24
SOFTMAX, STORE_P, PERIOD = 400, 90, 5000  # clocks: per tile softmax and P store, per pair of tiles


def wgmma_like(ctas=3, tiles=10, smids=(7, 7, 3)):
    """A timeline shaped as the wgmma variant's pair schedule: warpgroup 0 takes even tiles,
    warpgroup 1 odd ones, the producer loads each tile; a pair every PERIOD clocks."""
    header = np.zeros((ctas, len(tlm.HEADER_FIELDS)), dtype=np.uint64)
    stamps = np.zeros((ctas, LANES, TILES + 1, EVENTS), dtype=np.uint64)
    ev = tlm.EV
    for c in range(ctas):
        base = 1_000_000 * (c + 1)
        header[c] = [smids[c], c, 0, 0, ctas, 1, 1, tiles, 10_000 + 100 * c if c != 1 else 5, base, base + 99_999, 0]
        for t in range(tiles):
            lane = t % 2
            t0 = base + 1000 + (t // 2) * PERIOD + lane * 700
            put = {"tile_wait": 0, "tile_ready": 50, "s_issued": 80, "s_done": 1100,
                   "softmax_done": 1100 + SOFTMAX, "p_stored": 1100 + SOFTMAX + STORE_P, "pv_issued": 1700,
                   "bar0_wait": 1710, "bar0_done": 1900, "pv_done": 2800, "stage_freed": 2810}
            for name, dt in put.items():
                stamps[c, lane, t, ev[name]] = t0 + dt
            p0 = base + 200 + t * PERIOD // 2
            for name, dt in {"load_wait_free": 0, "load_free": 100, "load_issued": 400}.items():
                stamps[c, 2, t, ev[name]] = p0 + dt
        for lane in range(3):
            stamps[c, lane, TILES, 0] = base + 10
            stamps[c, lane, TILES, 1] = base + 90_000
    return tlm.Timeline(header, stamps, 0, {"variant": "wgmma", "config": "64,64,1,32768", "device": "synthetic"})


def test_decode_reads_the_extension_buffers_and_checks_their_size():
    tl = wgmma_like()
    shape = (tl.header.shape[0], LANES, TILES, EVENTS, len(tlm.HEADER_FIELDS), 0)
    back = tlm.decode(tl.header.tobytes(), tl.stamps.tobytes(), shape, tl.meta)
    assert np.array_equal(back.stamps, tl.stamps) and np.array_equal(back.header, tl.header)
    with pytest.raises(tlm.TimelineError, match="do not match the shape"):
        tlm.decode(tl.header.tobytes(), tl.stamps.tobytes()[:-8], shape)


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_save_and_load_round_trip(tmp_path, suffix):
    tl = wgmma_like()
    path = tlm.save(tl, tmp_path / f"dump{suffix}")
    back = tlm.load(path)
    assert np.array_equal(back.stamps, tl.stamps) and np.array_equal(back.header, tl.header)
    assert back.meta == tl.meta and back.tile0 == tl.tile0
    assert [p.name for p in tmp_path.iterdir()] == [f"dump{suffix}"]  # no temporary left behind


def test_load_refuses_what_is_not_a_dump(tmp_path):
    with pytest.raises(tlm.TimelineError, match="no such file"):
        tlm.load(tmp_path / "missing.npz")
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(tlm.TimelineError, match="not a timeline dump"):
        tlm.load(bad)
    with pytest.raises(tlm.TimelineError, match=".npz or .json"):
        tlm.save(wgmma_like(), tmp_path / "x.csv")


def test_lane_spans_cover_each_lane_without_gaps_and_name_the_softmax():
    tl = wgmma_like()
    spans = tlm.lane_spans(tl, 0)
    for lane in range(3):
        mine = [s for s in spans if s.lane == lane]
        assert mine and all(a.end == b.start for a, b in zip(mine, mine[1:]))
    soft = [s for s in spans if s.state == "softmax"]
    assert len(soft) == 10 and all(s.end - s.start == SOFTMAX for s in soft)
    assert {s.state for s in spans if s.lane == 2} >= {"wait free stage", "issue copies"}


def test_summary_figures_of_a_known_schedule():
    tl = wgmma_like()
    s = tlm.summarize(tl, 0)
    assert s["softmax_clocks"] == SOFTMAX and s["store_p_clocks"] == STORE_P
    assert s["clocks_per_tile"] == pytest.approx(PERIOD / 2, rel=0.2)
    assert s["mma_clocks_per_tile"] == 2176
    assert 0 < s["mma_in_flight_fraction"] <= 1 and s["idle_gaps_per_tile"] > 0
    assert s["wait_tile_clocks"] == 50 and s["wait_free_clocks"] == 100 and s["wait_barrier_clocks"] == 190


def test_merge_and_one_cta_per_sm():
    assert tlm.merge([(5, 9), (0, 2), (1, 3), (9, 10)]) == [(0, 3), (5, 10)]
    tl = wgmma_like()
    assert tlm.one_cta_per_sm(tl) == {3: 2, 7: 1}  # CTA 1 started first on SM 7


def test_stamps_past_the_ctas_last_tile_are_ignored():
    tl = wgmma_like(tiles=5)
    tl.stamps[0, 1, 5, tlm.EV["s_done"]] = tl.stamps[0, 1, 3, tlm.EV["s_done"]] + 1  # a pair's missing tile b
    assert all(s.tile < 5 for s in tlm.lane_spans(tl, 0))


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_render_draws_a_dump(tmp_path, suffix):
    dump = tlm.save(wgmma_like(), tmp_path / "d.npz")
    out = tmp_path / f"pic{suffix}"
    assert main(["render", str(dump), "--out", str(out), "--tiles", "2:8"]) == 0
    head = out.read_bytes()[:8]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in out.read_bytes()[:400] or head.startswith(b"<?xml")


def test_summary_command_prints_one_line_per_sm(tmp_path, capsys):
    dump = tlm.save(wgmma_like(), tmp_path / "d.json")
    assert main(["summary", str(dump)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["smid"] for x in lines[:2]] == [3, 7]
    assert lines[2]["median_over_sms"] == 2 and lines[2]["softmax_clocks"] == SOFTMAX


def test_render_refusals_are_one_line_usage_errors(tmp_path, capsys):
    dump = tlm.save(wgmma_like(), tmp_path / "d.npz")
    assert main(["render", str(tmp_path / "nope.npz")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["render", str(dump), "--cta", "9"]) == 2
    assert "--cta 9: not recorded" in capsys.readouterr().err
    assert main(["render", str(dump), "--tiles", "8:2"]) == 2
    assert "FIRST < END" in capsys.readouterr().err
    assert main(["render", str(dump), "--out", str(tmp_path / "x.jpg")]) == 2
    assert ".png or .svg" in capsys.readouterr().err


def test_parse_tiles():
    assert parse_tiles("2:8") == (2, 8)
    with pytest.raises(ValueError, match="FIRST:END"):
        parse_tiles("2-8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_run_refuses_without_a_gpu(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_mma_spans_start_where_the_issue_starts():
    """wgmma instructions stall at issue while the pipe works, so an MMA's span starts at the
    lane's stamp before its issue stamp, and ends at the stamp after its wait."""
    tl = wgmma_like()
    s = [x for x in tlm.mma_spans(tl, 0) if x.lane == 0 and x.tile == 2 and x.event == "s_done"][0]
    assert (s.start, s.end) == (tl.clock(0, 0, 2, "tile_ready"), tl.clock(0, 0, 2, "s_done"))
    pv = [x for x in tlm.mma_spans(tl, 0) if x.lane == 0 and x.tile == 2 and x.event == "pv_done"][0]
    assert (pv.start, pv.end) == (tl.clock(0, 0, 2, "p_stored"), tl.clock(0, 0, 2, "pv_done"))


def test_run_writes_dumps_pictures_and_summaries(tmp_path, monkeypatch, capsys):
    """`run` as the device script calls it, with the GPU parts (the case and the launch) stubbed:
    it asks for the timeline build, and writes each config's dump, picture and per-SM summary."""
    import kdtree.bench.cases as cases
    import kdtree.tools.timeline as tool

    seen = {}

    def fake_collect(case, *, variant=None, num_splits=None, meta=None):
        seen["flags"] = os.environ.get("KDTREE_NVCC_FLAGS")
        tl = wgmma_like()
        tl.meta.update(meta or {}, num_splits=2)
        return tl

    monkeypatch.setattr(tool.cli, "require_cuda", lambda *a, **k: None)
    monkeypatch.setattr(cases, "make_case", lambda *a, **k: {})
    monkeypatch.setattr(tlm, "collect", fake_collect)
    monkeypatch.setenv("KDTREE_NVCC_FLAGS", "-DKD_SKIP=8")
    assert main(["run", "--configs", "64,64,1,32768", "--out", str(tmp_path), "--revision", "r1"]) == 0
    assert seen["flags"] == "-DKD_SKIP=8 -DKD_TIMELINE=1"
    assert {p.name for p in tmp_path.iterdir()} == {"timeline-64-64-1-32768.npz", "timeline-64-64-1-32768.png",
                                                    "summary.jsonl"}
    lines = [json.loads(x) for x in (tmp_path / "summary.jsonl").read_text().splitlines()]
    assert [x["smid"] for x in lines] == [3, 7] and all(x["revision"] == "r1" for x in lines)
    assert "2 SMs recorded; medians over their first CTAs: " in capsys.readouterr().out
