"""Uploads keep dtype and values, from lists, numpy arrays and CPU tensors."""

import numpy as np
import torch

from kdtree.engine.decode.h2d import to_device


def test_lists_arrays_and_tensors_arrive_with_their_values_and_dtype():
    assert torch.equal(to_device([3, 1, 2], "cpu", torch.int32), torch.tensor([3, 1, 2], dtype=torch.int32))
    assert to_device([3, 1, 2], "cpu", torch.int32).dtype == torch.int32
    got = to_device(np.arange(4, dtype=np.int64), "cpu", torch.int32)
    assert got.dtype == torch.int32 and got.tolist() == [0, 1, 2, 3]
    t = torch.tensor([1.5, 2.5])
    assert to_device(t, "cpu").tolist() == [1.5, 2.5]
