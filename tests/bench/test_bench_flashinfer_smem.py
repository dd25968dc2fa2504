"""FlashInfer FA2 built as on another GPU: the header patch and the include tree (CPU, no FlashInfer)."""

from __future__ import annotations

import pytest

from kdtree.bench import flashinfer_peer as fp


def _fake_include(root):
    attention = root / "flashinfer" / "attention"
    attention.mkdir(parents=True)
    (attention / "mla.cuh").write_text(f'#include "prefill.cuh"\n#include "../profiler.cuh"\n  {fp.SMEM_QUERY}\n')
    (attention / "prefill.cuh").write_text("// prefill\n")
    (root / "flashinfer" / "profiler.cuh").write_text("// profiler\n")
    (root / "other.h").write_text("// other\n")
    return root


def test_the_patch_replaces_the_devices_answer_once():
    text = fp.patch_smem_query(f"a\n{fp.SMEM_QUERY}\nb", fp.SM120_SMEM_PER_SM)
    assert "smem_limit_per_sm = 102400;" in text and fp.SMEM_QUERY not in text
    for wrong in ("no query here", f"{fp.SMEM_QUERY}\n{fp.SMEM_QUERY}"):
        with pytest.raises(fp.PeerUnavailable, match="not once"):
            fp.patch_smem_query(wrong, 102400)


def test_the_include_tree_patches_mla_and_links_everything_else(tmp_path):
    src = _fake_include(tmp_path / "src")
    tree = fp.limited_include_tree(src, tmp_path / "gen" / "inc", 102400)
    mla = tree / "flashinfer" / "attention" / "mla.cuh"
    assert not mla.is_symlink() and "smem_limit_per_sm = 102400;" in mla.read_text()
    assert (tree / "flashinfer" / "attention" / "prefill.cuh").read_text() == "// prefill\n"
    assert (tree / "flashinfer" / "profiler.cuh").is_symlink() and (tree / "other.h").is_symlink()
    assert (src / "flashinfer" / "attention" / "mla.cuh").read_text().count(fp.SMEM_QUERY) == 1  # untouched
    # reused as it is; rebuilt for another size
    assert fp.limited_include_tree(src, tree, 102400) == tree
    fp.limited_include_tree(src, tree, 99000)
    assert "smem_limit_per_sm = 99000;" in mla.read_text()
    assert not [p for p in tree.parent.iterdir() if p.name.startswith(".")]  # no leftover temporary tree


def test_a_flashinfer_without_the_header_is_unavailable(tmp_path):
    with pytest.raises(fp.PeerUnavailable, match="mla.cuh"):
        fp.limited_include_tree(tmp_path, tmp_path / "out", 102400)


def test_only_fa2_can_be_built_for_another_shared_memory_size():
    assert "only fa2" in fp.unavailable_reason("fa3", smem_per_sm=102400)
    with pytest.raises(ValueError, match="only fa2"):
        fp.FlashInferMLA("fa3", smem_per_sm=102400)
