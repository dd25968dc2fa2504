"""A pytest plugin for the control run of `test_bench_decode_triton_interpreted`: the verify mask
handed to SGLang's extend kernel is all True (every tree cell visible, the tree mask lost), so the
verify checks against the oracle must fail."""

import kdtree.bench.decode_triton as decode_triton

_layout = decode_triton.sglang_verify_layout


def _mask_lost(meta, rows, with_mask=True):
    layout = _layout(meta, rows, with_mask)
    if layout.custom_mask is not None:
        layout.custom_mask.fill_(True)
    return layout


decode_triton.sglang_verify_layout = _mask_lost
