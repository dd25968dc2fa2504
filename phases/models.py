"""The models the phases' gates measure on: the speed preset, and one seeded model per process.

Imported by the phases' check modules only (it imports the engine, and so torch); the specs
never import it.
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from kdtree.engine import build_model, preset

SPEED_PRESET = "dsv3-tp8"  # DeepSeek-V3 / Kimi-K2 attention as one TP-8 shard (kdtree.engine.model.config)

_models: dict[tuple, Any] = {}


def shared_model(preset_name: str, device: str):
    """One seeded model per (preset, device) per process: the speed gates share it. One large
    model at a time: building another drops the last and hands its memory back first."""
    key = (preset_name, device)
    if key not in _models:
        _models.clear()
        release_device_memory()
        _models[key] = build_model(preset(preset_name), seed=0, device=device)
    return _models[key]


def release_device_memory() -> None:
    """Hand the caching allocator's free blocks back to the driver. A gate after a memory-heavy
    one (32k-token prompts) otherwise finds the device full of torch's cached blocks, and what
    allocates outside torch's allocator (Triton loading a kernel module) runs out of memory."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
