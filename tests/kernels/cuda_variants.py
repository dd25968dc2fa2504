"""Each CUDA kernel variant as its own callable, for the shared accuracy suite.

`kdtree.kernels.tree_verify_mla` picks a variant from the shapes; these force one through
KDTREE_VARIANT for the duration of the call, so every specialisation meets the same bounds on
every case, not only on the shapes the dispatcher would send it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from kdtree.kernels.launch_plan import VARIANTS


@contextmanager
def forced_variant(name: str):
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: expected one of {sorted(VARIANTS)}")
    before = os.environ.get("KDTREE_VARIANT")
    os.environ["KDTREE_VARIANT"] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("KDTREE_VARIANT", None)
        else:
            os.environ["KDTREE_VARIANT"] = before


def _forcing(name: str):
    def call(*args, **kwargs):
        from kdtree.kernels import tree_verify_mla  # noqa: PLC0415

        with forced_variant(name):
            return tree_verify_mla(*args, **kwargs)

    call.__name__ = f"tree_verify_mla_{name}"
    return call


tree_verify_mla_base16 = _forcing("base16")
tree_verify_mla_base32 = _forcing("base32")
tree_verify_mla_ws = _forcing("ws")
tree_verify_mla_g64 = _forcing("g64")
