"""A toy generic op for the gate tests: masked softmax-weighted sums (nothing of MLA).

out[r] = softmax(scores[r] restricted to mask[r]) @ values,  lse[r] = logsumexp of the same.
"""

from __future__ import annotations

import torch

from kdtree.gates.accuracy import AccuracyCase


def make_inputs(seed: int, device: str, rows: int = 24, keys: int = 40, dim: int = 16) -> dict:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, keys, generator=g) * 2
    values = torch.randn(keys, dim, generator=g)
    mask = torch.rand(rows, keys, generator=g) < 0.4
    mask[:, 0] = True  # every row sees something
    return {k: v.to(device) for k, v in {"scores": scores, "values": values, "mask": mask}.items()}


def make_outputs(inputs: dict) -> dict:
    rows, dim = inputs["scores"].shape[0], inputs["values"].shape[1]
    dev = inputs["scores"].device
    return {"out": torch.empty(rows, dim, device=dev), "lse": torch.empty(rows, device=dev)}


def oracle(inputs: dict) -> dict:
    s = inputs["scores"].double().masked_fill(~inputs["mask"], float("-inf"))
    return {"out": torch.softmax(s, -1) @ inputs["values"].double(), "lse": torch.logsumexp(s, -1)}


def candidate(inputs: dict, outputs: dict) -> dict:
    """Writes the buffers it is given; allocates and returns ``out`` when handed None for it."""
    s = inputs["scores"].float().masked_fill(~inputs["mask"], float("-inf"))
    out = torch.softmax(s, -1) @ inputs["values"].float()
    if outputs.get("out") is not None:
        outputs["out"].copy_(out)
        out = outputs["out"]
    if outputs.get("lse") is not None:
        outputs["lse"].copy_(torch.logsumexp(s, -1))
    return {"out": out}


def cases(device_shapes=((24, 40, 16), (1, 1, 8), (7, 33, 5))) -> list[AccuracyCase]:
    out = []
    for rows, keys, dim in device_shapes:
        out.append(AccuracyCase(
            name=f"r{rows}_k{keys}_d{dim}",
            make_inputs=lambda seed, device, r=rows, k=keys, d=dim: make_inputs(seed, device, r, k, d),
            make_outputs=make_outputs, params={"rows": rows, "keys": keys, "dim": dim}, may_allocate=("out",)))
    return out
