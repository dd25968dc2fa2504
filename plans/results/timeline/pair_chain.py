"""The wgmma pair schedule's serial chain per pair of tiles, from a timeline dump (medians over each
SM's first CTA, pairs 2..14): tile a ready -> S_a done -> softmax_a done (warpgroup 0) -> warpgroup 1
has tile a's max -> softmax_b done -> next tile a ready.

    python plans/results/timeline/pair_chain.py DUMP.npz
"""
import statistics
import sys

from kdtree.bench import timeline as tlm

tl = tlm.load(sys.argv[1])
rows = []
for c in tlm.one_cta_per_sm(tl).values():
    for i in range(2, 15):
        a, b = 2 * i, 2 * i + 1
        v = {k: tl.clock(c, lane, t, e) for k, (lane, t, e) in {
            "ready_a": (0, a, "tile_ready"), "s_done_a": (0, a, "s_done"), "soft_a": (0, a, "softmax_done"),
            "wait_b": (1, b, "tile_wait"), "ready_b": (1, b, "tile_ready"), "s_issued_b": (1, b, "s_issued"),
            "max_a_at_wg1": (1, a, "bar0_done"), "soft_b": (1, b, "softmax_done"), "next_a": (0, a + 2, "tile_ready")}.items()}
        if None in v.values():
            continue
        rows.append({"S_a (issue + wait)": v["s_done_a"] - v["ready_a"], "softmax_a": v["soft_a"] - v["s_done_a"],
                     "wg1 waits for tile b": v["ready_b"] - v["wait_b"],
                     "wg1: max_a -> softmax_b done": v["soft_b"] - v["max_a_at_wg1"],
                     "chain: ready_a -> softmax_b done": v["soft_b"] - v["ready_a"],
                     "rest of the pair (PVs, P_b, next tile a)": v["next_a"] - v["soft_b"],
                     "pair": v["next_a"] - v["ready_a"]})
print(f"{len(rows)} pairs")
for k in rows[0]:
    print(f"  {k:42s} {statistics.median(r[k] for r in rows):7.0f} clocks")
