"""kdtree.tools.kernel_times: kernel-name shortening, its arguments and its CPU-only refusal."""

import pytest
import torch

from kdtree.tools.kernel_times import main, parse_split_list, short_name


def test_short_name_drops_namespace_templates_and_arguments():
    assert short_name("void kdtree::tree_verify_mla_ws_kernel(kdtree::TreeVerifyParams)") == "tree_verify_mla_ws_kernel"
    assert short_name("void kdtree::tree_verify_mla_kernel<2>(kdtree::TreeVerifyParams)") == "tree_verify_mla_kernel"
    assert short_name("kdtree::combine_splits_kernel") == "combine_splits_kernel"


def test_split_list_is_the_plan_or_forced_counts():
    assert parse_split_list("auto,8,33") == [None, 8, 33]
    with pytest.raises(Exception, match="whole number >= 1"):
        parse_split_list("auto,0")


def test_bad_configs_are_a_usage_error(capsys):
    assert main(["--configs", "8,4,1"]) == 2
    assert "Invalid value for '--configs': '8,4,1' is not H,T,B,L" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_refuses_without_a_gpu_and_says_why(capsys):
    assert main(["--configs", "8,4,1,4096"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
