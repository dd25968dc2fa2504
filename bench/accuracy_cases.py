"""The accuracy cases: the edge cases of docs/design.md section 4 (L = 0, T = 1, a chain, a star,
T at the maximum, H = 1 and 128, odd sizes, prefixes that split) plus random mixes. Phase 1's
accuracy gate and `python -m kdtree.tools.devcheck` both check the kernel on these; each is
(name, H, [(T_b, L_b) per request], tree kind of `kdtree.bench.cases.make_case`).
"""

ACCURACY_CASES = [
    ("random H8 T16 L1000", 8, [(16, 1000)], "random"),
    ("T1 L0 H16", 16, [(1, 0)], "random"),
    ("chain H1 T5 L37", 1, [(5, 37)], "chain"),
    ("star H16 T300 L50", 16, [(300, 50)], "star"),
    ("mixed H128", 128, [(7, 300), (1, 5), (40, 0)], "random"),
    ("T1024 H8 L200", 8, [(1024, 200)], "random"),
    ("T1024 H128 L64", 128, [(1024, 64)], "chain"),
    ("H64 T64 B2 L4096", 64, [(64, 4096), (64, 4000)], "random"),
    ("H16 T33 L16k", 16, [(33, 16384)], "random"),
    ("H8 T4 L32k", 8, [(4, 32768)], "random"),
    ("odd H3", 3, [(17, 77), (3, 1), (2, 0)], "random"),
    ("H128 T256 L2000", 128, [(256, 2000)], "random"),
    ("B8 mixed H8", 8, list(zip([1, 4, 9, 16, 33, 64, 2, 100], [0, 5, 100, 999, 3000, 31, 7, 12])), "random"),
]
