"""Token-exact gate: per prompt, the candidate's generated tokens must equal the reference's.

``streams`` is an iterable of ``(prompt_id, candidate_tokens, reference_tokens)``; tokens are any
sequence of ints (a list, a tuple, a 1-D tensor). For every prompt that diverges the report
names the first divergence: the index, both tokens there (None where a stream has ended) and both
lengths. A prompt whose reference is empty measured nothing and counts as not exact.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from kdtree.gates.base import Figure, GateContext, GateResult, verdict
from kdtree.gates.spec import TokenExactGateSpec


def _tokens(seq: Any) -> list[int]:
    if hasattr(seq, "tolist"):
        seq = seq.tolist()
    return [int(t) for t in seq]


def first_divergence(candidate: Sequence[int], reference: Sequence[int]) -> Optional[dict[str, Any]]:
    """None when equal, else ``{index, candidate, reference, candidate_len, reference_len}``."""
    for i, (c, r) in enumerate(zip(candidate, reference)):
        if c != r:
            return {"index": i, "candidate": c, "reference": r,
                    "candidate_len": len(candidate), "reference_len": len(reference)}
    if len(candidate) == len(reference):
        return None
    i = min(len(candidate), len(reference))
    return {"index": i,
            "candidate": candidate[i] if i < len(candidate) else None,
            "reference": reference[i] if i < len(reference) else None,
            "candidate_len": len(candidate), "reference_len": len(reference)}


def _describe(pid: str, d: dict[str, Any]) -> str:
    text = f"prompt {pid}: first divergence at token {d['index']}: {d['candidate']} vs reference {d['reference']}"
    if d["candidate_len"] != d["reference_len"]:
        text += f" (lengths {d['candidate_len']} vs {d['reference_len']})"
    return text


def check_token_exact(spec: TokenExactGateSpec, streams: Iterable[tuple[Any, Any, Any]],
                      ctx: GateContext) -> GateResult:
    """Compare every stream; see the module docstring.

    Figures: ``exact_fraction`` (key, ``>= spec.min_exact_fraction``) and ``prompts``
    (``>= spec.min_prompts``). Details: ``divergences`` (one row per diverging prompt),
    ``empty_references``, ``tokens_compared``.
    """
    seen: set[str] = set()
    divergences: list[dict[str, Any]] = []
    empty: list[str] = []
    n = exact = compared = 0
    for pid, cand, ref in streams:
        pid = str(pid)
        if pid in seen:
            raise ValueError(f"prompt id {pid!r} appears twice")
        seen.add(pid)
        cand, ref = _tokens(cand), _tokens(ref)
        n += 1
        compared += len(ref)
        if not ref:
            empty.append(pid)
            continue
        d = first_divergence(cand, ref)
        if d is None:
            exact += 1
        else:
            divergences.append({"prompt": pid, **d})
    fraction = exact / n if n else float("nan")
    figures = [
        Figure(name="exact_fraction", value=fraction, op=">=", threshold=spec.min_exact_fraction, key=True),
        Figure(name="prompts", value=n, op=">=", threshold=spec.min_prompts),
    ]
    parts = []
    if n < spec.min_prompts:
        parts.append(f"only {n} prompts compared, the spec needs at least {spec.min_prompts}")
    if divergences:
        parts.append(f"{len(divergences)} of {n} prompts diverge; "
                     + "; ".join(_describe(d["prompt"], d) for d in divergences[:3]))
    if empty:
        parts.append(f"{len(empty)} prompts have an empty reference stream ({', '.join(empty[:5])})")
    if not parts:
        parts.append(f"{exact}/{n} prompts token-exact ({compared} reference tokens)")
    return verdict(spec.name, spec.kind, figures, "; ".join(parts), divergences=divergences,
                   empty_references=empty, tokens_compared=compared, prompts=n)
