"""Token-exact gate: per prompt and run, the candidate's generated tokens must equal the reference's.

``streams`` holds one `Stream` per (prompt, run): a *run* is one way of generating over the same
prompts (say tree speculative decoding with one drafter); tokens are any sequence of ints (a
list, a tuple, a 1-D tensor). A plain ``(prompt_id, candidate_tokens, reference_tokens)`` tuple
is a stream of the run ``""``. A prompt counts once however many runs cover it, and is exact only
when it is exact in every run: ``spec.min_prompts`` counts prompts, not streams. For every
stream that diverges the report names the first divergence: the index, both tokens there (None
where a stream has ended) and both lengths. A stream whose reference is empty measured nothing
and counts as not exact.

Equal tokens alone do not show that the candidate produced them. ``runs`` (`RunStats`, one per
run) can add, per run, the number of calls the op under test received in each step of the
candidate's run (``spec.min_op_calls_per_step``: a candidate that never calls the op, or skips
it in some step, fails) and the mean accepted length per step of the candidate and of the
reference (``spec.max_accept_rel_diff``: a verify step that accepts fewer drafted tokens than the
reference's saw other attention than the reference did), and how close the candidate came to
changing a token: its largest logit deviation from the reference's on the same inputs, as a
fraction of the reference's top-1 / top-2 margin there (``spec.max_margin_fraction``; greedy
margins are wide, so an error can move logits far without flipping a token yet).

Near-ties. The reference is an fp64 oracle and the candidate a bf16 kernel: where the oracle's
top-1 / top-2 margin is smaller than the kernel's rounding moves logits (a few hundredths of a
logit, against margins that are usually far wider), any correct kernel picks the runner-up about
half the time. A `Stream` may carry the reference's margin and
runner-up at each token; with ``spec.tie_margin`` set, a first divergence to exactly the
runner-up where the margin is below ``tie_margin`` is a *near-tie*: reported (details
``near_ties``, figure ``near_tie_prompts`` held to ``spec.max_near_tie_prompts``), not counted
as a divergence. The stream is compared up to it; nothing after it can be compared. A wrong mask,
scale or prefix moves logits by far more than any tie margin and still diverges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from kdtree.gates.base import Figure, GateContext, GateResult, verdict
from kdtree.gates.spec import TokenExactGateSpec


@dataclass(frozen=True)
class Stream:
    """One prompt's tokens in one run, from the candidate and from the reference."""

    prompt: str
    run: str
    candidate: Any
    reference: Any
    reference_margins: Optional[Sequence[float]] = None  # oracle's top-1 - top-2 logit at each token
    reference_runner_up: Optional[Sequence[int]] = None  # oracle's second choice at each token


@dataclass(frozen=True)
class RunStats:
    """What a run measured besides tokens (any field may be None: not measured)."""

    run: str
    op_calls_per_step: Optional[Sequence[int]] = None  # op calls in each step of the candidate's run
    candidate_accepted: Optional[float] = None  # mean tokens accepted per step, candidate
    reference_accepted: Optional[float] = None  # the same for the reference
    margin_fraction: Optional[float] = None  # worst |logit drift| / greedy margin on shared inputs
    sensitive: Optional[Mapping[str, int]] = None  # screened decisions the reference flips, per perturbation


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


def _describe(d: dict[str, Any]) -> str:
    where = f"prompt {d['prompt']}" + (f" ({d['run']})" if d["run"] else "")
    text = f"{where}: first divergence at token {d['index']}: {d['candidate']} vs reference {d['reference']}"
    if d["candidate_len"] != d["reference_len"]:
        text += f" (lengths {d['candidate_len']} vs {d['reference_len']})"
    return text


def _as_stream(item: Union[Stream, tuple]) -> Stream:
    if isinstance(item, Stream):
        return item
    pid, cand, ref = item
    return Stream(str(pid), "", cand, ref)


def _run_row(r: RunStats) -> dict[str, Any]:
    """One run's figures for the details (a key only where the run measured it)."""
    row: dict[str, Any] = {"run": r.run}
    if r.op_calls_per_step is not None:
        counts = [int(c) for c in r.op_calls_per_step]
        row.update(steps=len(counts), op_calls=sum(counts), min_op_calls_per_step=min(counts) if counts else 0,
                   steps_without_op_calls=sum(c == 0 for c in counts))
    if r.candidate_accepted is not None and r.reference_accepted is not None:
        ref_acc = float(r.reference_accepted)
        row.update(candidate_accepted=float(r.candidate_accepted), reference_accepted=ref_acc,
                   accept_rel_diff=abs(float(r.candidate_accepted) - ref_acc) / ref_acc if ref_acc > 0 else math.inf)
    if r.margin_fraction is not None:
        row["margin_fraction"] = float(r.margin_fraction)
    if r.sensitive is not None:
        row["sensitive"] = {str(k): int(v) for k, v in r.sensitive.items()}
        row["min_sensitive"] = min(row["sensitive"].values()) if row["sensitive"] else 0
    return row


def _fmt_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} at {k}" for k, v in counts.items())


@dataclass(frozen=True)
class _Bound:
    """A figure of each run (``row[key]``) held to the spec's limit ``field`` with ``op``."""

    field: str  # dotted path into the spec; None there: not checked
    op: str
    figure: str
    key: str
    missing: str  # what no run measured, for the error
    lead: str
    describe: Callable[[dict[str, Any], Any], str]  # (row, limit) -> one run's miss
    tail: str = ""


_BOUNDS = (
    _Bound("min_op_calls_per_step", ">=", "min_op_calls_per_step", "min_op_calls_per_step",
           "no run counted the op's calls", "the op under test was not called in every step: ",
           lambda row, limit: f"run {row['run']!r} had a step with {row['min_op_calls_per_step']} op calls (< {limit})",
           " - its tokens did not come from the op"),
    _Bound("max_accept_rel_diff", "<=", "worst_accept_rel_diff", "accept_rel_diff",
           "no run measured accepted lengths on both sides",
           "mean accepted length per step differs from the reference's: ",
           lambda row, limit: f"run {row['run']!r}: {row['candidate_accepted']:.3g} vs {row['reference_accepted']:.3g} "
                              f"({row['accept_rel_diff']:.3g} > {limit:g})"),
    _Bound("max_margin_fraction", "<=", "worst_margin_fraction", "margin_fraction",
           "no run compared logits with the reference",
           "logits drift from the reference's by a large part of the greedy margin: ",
           lambda row, limit: f"run {row['run']!r}: {row['margin_fraction']:.3g} of the margin (> {limit:g})"),
    _Bound("screen.min_sensitive", ">=", "min_sensitive_decisions", "min_sensitive",
           "no run screened decisions", "too few screened decisions hinge on a small scale error: ",
           lambda row, limit: f"run {row['run']!r} found {row['min_sensitive']} ({_fmt_counts(row['sensitive'])}, "
                              f"< {limit} for some sign)",
           " - the screened run cannot show that such an error changes tokens; screen more decisions"),
)


def _hold(bound: _Bound, spec: TokenExactGateSpec, rows: list[dict[str, Any]], figures: list[Figure],
          parts: list[str]) -> None:
    """One figure with the worst value over the runs that measured ``bound.key``, and a reason
    naming up to three runs that miss the limit. A limit that no run measured is an error
    (ValueError), never a pass."""
    limit: Any = spec
    for name in bound.field.split("."):
        limit = getattr(limit, name) if limit is not None else None
    if limit is None:
        return
    measured = [row for row in rows if bound.key in row]
    if not measured:
        raise ValueError(f"spec.{bound.field} is set but {bound.missing}")
    values = [row[bound.key] for row in measured]
    worst = max(values) if bound.op == "<=" else min(values)
    figures.append(Figure(name=bound.figure, value=worst, op=bound.op, threshold=limit))
    off = [row for row in measured
           if not (row[bound.key] <= limit if bound.op == "<=" else row[bound.key] >= limit)]  # NaN misses
    if off:
        parts.append(bound.lead + "; ".join(bound.describe(row, limit) for row in off[:3]) + bound.tail)


def check_token_exact(spec: TokenExactGateSpec, streams: Iterable[Union[Stream, tuple[Any, Any, Any]]],
                      ctx: GateContext, runs: Iterable[RunStats] = ()) -> GateResult:
    """Compare every stream; see the module docstring.

    Figures: ``exact_fraction`` (key, prompts exact in every run, ``>= spec.min_exact_fraction``),
    ``prompts`` (distinct, ``>= spec.min_prompts``), ``streams``, and when the spec asks for them
    ``min_op_calls_per_step`` (fewest op calls in any step of any run that counted them),
    ``worst_accept_rel_diff``, ``worst_margin_fraction`` and ``min_sensitive_decisions`` (fewest
    screened decisions a run's perturbation flips, over its perturbations). Details:
    ``divergences`` (one row per diverging stream),
    ``empty_references``, ``tokens_compared``, ``runs`` (one row per `RunStats`).
    """
    seen: set[tuple[str, str]] = set()
    divergences: list[dict[str, Any]] = []
    empty: list[str] = []
    near_ties: list[dict[str, Any]] = []
    prompts: dict[str, bool] = {}
    compared = 0
    for item in streams:
        s = _as_stream(item)
        key = (str(s.prompt), str(s.run))
        if key in seen:
            raise ValueError(f"prompt id {key[0]!r} appears twice" + (f" in run {key[1]!r}" if key[1] else ""))
        seen.add(key)
        cand, ref = _tokens(s.candidate), _tokens(s.reference)
        compared += len(ref)
        ok = True
        if not ref:
            empty.append(key[0] + (f" ({key[1]})" if key[1] else ""))
            ok = False
        else:
            d = first_divergence(cand, ref)
            tie = _near_tie(spec, s, d)
            if tie is not None:
                near_ties.append({"prompt": key[0], "run": key[1], **d, **tie})
            elif d is not None:
                divergences.append({"prompt": key[0], "run": key[1], **d})
                ok = False
        prompts[key[0]] = prompts.get(key[0], True) and ok
    n = len(prompts)
    exact = sum(prompts.values())
    fraction = exact / n if n else float("nan")
    figures = [
        Figure(name="exact_fraction", value=fraction, op=">=", threshold=spec.min_exact_fraction, key=True),
        Figure(name="prompts", value=n, op=">=", threshold=spec.min_prompts),
        Figure(name="streams", value=len(seen)),
    ]
    parts = []
    if n < spec.min_prompts:
        parts.append(f"only {n} prompts compared, the spec needs at least {spec.min_prompts}")
    if divergences:
        parts.append(f"{len(divergences)} of {len(seen)} streams diverge ({n - exact} of {n} prompts); "
                     + "; ".join(_describe(d) for d in divergences[:3]))
    if empty:
        parts.append(f"{len(empty)} streams have an empty reference ({', '.join(empty[:5])})")
    if spec.tie_margin is not None:
        tie_prompts = len({t["prompt"] for t in near_ties})
        figures.append(Figure(name="near_tie_prompts", value=tie_prompts, op="<=", threshold=spec.max_near_tie_prompts))
        if tie_prompts > spec.max_near_tie_prompts:
            parts.append(f"near-tie flips in {tie_prompts} prompts (> {spec.max_near_tie_prompts}): "
                         + "; ".join(_describe(t) + f" (oracle margin {t['margin']:.3g})" for t in near_ties[:3]))

    run_rows = [_run_row(r) for r in runs]
    for bound in _BOUNDS:
        _hold(bound, spec, run_rows, figures, parts)
    if not parts:
        tie_margins = ", ".join(f"{t['margin']:.3g}" for t in near_ties[:3])
        parts.append(f"{exact}/{n} prompts token-exact over {len(seen)} streams ({compared} reference tokens)"
                     + (f"; {len(near_ties)} near-tie flips to the oracle's runner-up (margins {tie_margins} "
                        f"< {spec.tie_margin:g})" if near_ties else ""))
    return verdict(spec.name, spec.kind, figures, "; ".join(parts), divergences=divergences,
                   empty_references=empty, tokens_compared=compared, prompts=n, runs=run_rows,
                   near_ties=near_ties)


def _near_tie(spec: TokenExactGateSpec, s: Stream, d: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """{'margin': m} when divergence `d` is a near-tie under the spec (module docstring), else None."""
    if d is None or spec.tie_margin is None or s.reference_margins is None or s.reference_runner_up is None:
        return None
    i = d["index"]
    if i >= min(len(s.reference_margins), len(s.reference_runner_up)) or d["candidate"] is None:
        return None
    margin = float(s.reference_margins[i])
    if margin < spec.tie_margin and int(s.reference_runner_up[i]) == d["candidate"]:
        return {"margin": margin}
    return None
