"""kdtree.kernels.kernel_times: kernel-name shortening and its CPU-only refusal."""

import pytest
import torch

from kdtree.kernels.kernel_times import main, short_name


def test_short_name_drops_namespace_templates_and_arguments():
    assert short_name("void kdtree::tree_verify_mla_ws_kernel(kdtree::TreeVerifyParams)") == "tree_verify_mla_ws_kernel"
    assert short_name("void kdtree::tree_verify_mla_kernel<2>(kdtree::TreeVerifyParams)") == "tree_verify_mla_kernel"
    assert short_name("kdtree::combine_splits_kernel") == "combine_splits_kernel"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_refuses_without_a_gpu_and_says_why():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["--configs", "8,4,1,4096"])
