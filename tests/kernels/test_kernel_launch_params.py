"""The extension's one launch argument (`cuda_op.LaunchParams`), on the compiled binding itself:
built with this machine's nvcc, loaded without a GPU, and given parameters the launcher refuses
before it touches the device (so no CUDA call is made)."""

from __future__ import annotations

import os
import shutil

import pytest

from kdtree.kernels import cuda_op, jit

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc is not installed")

VALID = cuda_op.LaunchParams(q=0, kv=0, qo_indptr=0, kv_indptr=0, kv_indices=0, tree_mask=0, out=0, lse=0, ws_o=0,
                             ws_lse=0, total_rows=16, num_heads=16, batch=1, mask_words=1, num_splits=1, grid_y=1,
                             variant=1, sm_scale=0.1, stream=0)


@pytest.fixture(scope="module")
def ext():
    return jit.load_extension(["sm_90"])


pytestmark = [needs_nvcc, pytest.mark.slow]


def test_the_binding_publishes_the_fields_launch_params_packs(ext):
    assert tuple(ext.launch_fields) == cuda_op.LaunchParams._fields
    assert not hasattr(ext, "run_runs")  # one entry point; the parameters carry the KV layout


@pytest.mark.parametrize("params,message", [
    (tuple(VALID)[:19], "run: expected the 22 fields of launch_fields"),
    (VALID._replace(kv_run_indptr=64), "run: kv_run_indptr, kv_run_start and kv_run_pos are set together"),
    (VALID._replace(kv_run_start=64, kv_run_pos=64), "run: kv_run_indptr, kv_run_start and kv_run_pos"),
    (VALID._replace(kv_indices=64, kv_run_indptr=64, kv_run_start=64, kv_run_pos=64),
     "run: kv_indices must be 0 when the KV runs are set"),
])
def test_malformed_parameters_are_refused_with_a_message(ext, params, message):
    with pytest.raises(ValueError, match="^" + message):
        ext.run(params)


@pytest.mark.parametrize("change,error", [
    (dict(total_rows=0), "cudaErrorInvalidValue"),
    (dict(num_splits=0), "cudaErrorInvalidValue"),
    (dict(num_splits=100000), "cudaErrorInvalidValue"),
    (dict(variant=9), "cudaErrorInvalidValue"),
    (dict(grid_y=70000), "cudaErrorInvalidConfiguration"),
    (dict(batch=70000), "cudaErrorInvalidConfiguration"),
])
def test_each_field_reaches_the_launcher_in_its_place(ext, change, error):
    # the launcher checks these before any CUDA call: each error says the field arrived where it belongs
    with pytest.raises(RuntimeError, match=f"^tree_verify_mla launch failed: {error}"):
        ext.run(VALID._replace(**change))
