"""The one device-facts helper (`kdtree.kernels.device_facts`): what it reads of a device, once per
index, and how it names the device it was given. Fake device properties stand in for a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kdtree.kernels import device_facts as df
from kdtree.kernels.device_facts import DeviceFacts


@pytest.fixture()
def fake_devices(monkeypatch):
    asked = []
    props = {0: SimpleNamespace(multi_processor_count=132, major=9, minor=0, shared_memory_per_block_optin=232448),
             1: SimpleNamespace(multi_processor_count=188, major=12, minor=0, shared_memory_per_block_optin=101376),
             2: SimpleNamespace(multi_processor_count=108, major=8, minor=0)}  # a torch without the opt-in field

    def get(index):
        asked.append(index)
        return props[index]

    monkeypatch.setattr(df, "_facts", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", get)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    return asked


def test_facts_are_read_once_per_index(fake_devices):
    assert df.device_facts(0) == DeviceFacts(132, (9, 0), 232448)
    assert df.device_facts("cuda:0") is df.device_facts(torch.device("cuda", 0))
    assert df.device_facts(2) == DeviceFacts(108, (8, 0), None)
    assert fake_devices == [0, 2]


def test_no_index_means_the_current_device(fake_devices):
    assert df.device_facts() == df.device_facts("cuda") == DeviceFacts(188, (12, 0), 101376)
    assert fake_devices == [1]


def test_facts_given_are_returned_as_they_are(fake_devices):
    facts = DeviceFacts(78, (9, 0))
    assert df.device_facts(facts) is facts and fake_devices == []


def test_a_device_that_is_not_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match=r"^device: expected a CUDA device, got cpu \(plan for a device that is "
                                         r"not here with DeviceFacts"):
        df.device_facts("cpu")


def test_describe_and_mismatch_name_the_facts():
    h200 = DeviceFacts(132, (9, 0), 232448)
    assert h200.describe() == "sm_90 with 132 SMs, 232448 B shared memory per block"
    assert DeviceFacts(188, (12, 0)).describe() == "sm_120 with 188 SMs"
    assert h200.mismatch(DeviceFacts(132, (9, 0))) is None
    assert h200.mismatch(DeviceFacts(132, [9, 0], 232448)) is None  # a capability list reads as the tuple
    assert h200.mismatch(DeviceFacts(132, (9, 0), 101376)) == \
        "made for 232448 B shared memory per block, the device offers 101376 B"
    assert DeviceFacts(132, (9, 0)).mismatch(DeviceFacts(132, (10, 0))) == \
        "made for sm_90 with 132 SMs, the device is sm_100 with 132 SMs"
