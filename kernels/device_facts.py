"""What the launch planner and the launcher need to know of a CUDA device, looked up once per device.

`device_facts(device)` is the one place the SM count, the compute capability and the opt-in
shared memory per block are read (`torch.cuda.get_device_properties`); the plans
(`kdtree.kernels.launch_plan`), the launcher (`kdtree.kernels.cuda_op`), the engine's graph
capture, the SGLang backend and phase 3 all take them from here.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch


class DeviceFacts(NamedTuple):
    """The facts of a device a launch plan depends on.

    ``shared_memory_per_block_optin`` is the most dynamic shared memory one block may opt into
    (bytes); None where it is not known (a plan made from an SM count and capability alone).
    """

    sm_count: int
    capability: tuple[int, int]
    shared_memory_per_block_optin: Optional[int] = None

    def describe(self) -> str:
        """``sm_90 with 132 SMs`` (and the shared memory, when known)."""
        text = f"sm_{self.capability[0]}{self.capability[1]} with {self.sm_count} SMs"
        if self.shared_memory_per_block_optin is not None:
            text += f", {self.shared_memory_per_block_optin} B shared memory per block"
        return text

    def mismatch(self, other: "DeviceFacts") -> Optional[str]:
        """What differs between the facts a plan was made for (self) and a device's (other), or
        None; an unknown shared-memory figure on either side matches any."""
        if (self.sm_count, tuple(self.capability)) != (other.sm_count, tuple(other.capability)):
            return f"made for {self.describe()}, the device is {other.describe()}"
        mine, theirs = self.shared_memory_per_block_optin, other.shared_memory_per_block_optin
        if mine is not None and theirs is not None and mine != theirs:
            return f"made for {mine} B shared memory per block, the device offers {theirs} B"
        return None


DeviceLike = Union[DeviceFacts, torch.device, int, str, None]

_facts: dict[int, DeviceFacts] = {}


def device_index(device: Union[torch.device, int, str, None]) -> int:
    """The CUDA device index of `device` (None or ``"cuda"``: the current device)."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device} (plan for a device that is not "
                         "here with DeviceFacts(sm_count=..., capability=...))")
    return device.index if device.index is not None else torch.cuda.current_device()


def device_facts(device: DeviceLike = None) -> DeviceFacts:
    """The facts of a CUDA device (an index, ``torch.device``, ``"cuda:1"``; None: the current
    one), read once per index and cached; a `DeviceFacts` is returned as it is."""
    if isinstance(device, DeviceFacts):
        return device
    index = device_index(device)
    facts = _facts.get(index)
    if facts is None:
        props = torch.cuda.get_device_properties(index)
        optin = getattr(props, "shared_memory_per_block_optin", None)
        facts = _facts[index] = DeviceFacts(props.multi_processor_count, (props.major, props.minor),
                                            int(optin) if optin else None)
    return facts
