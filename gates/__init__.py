"""Generic gate mechanisms: they judge the samples and figures a measurement (`kdtree.bench`) hands
them and take no timings. They know nothing of MLA and import nothing else of the project.

`kdtree.gates.base` holds outcomes, results and `run_check`; `kdtree.gates.spec` the specs.
The mechanisms (accuracy, token_exact, speedup, build, sanitizer, ...) are modules of their own,
imported where used so that `orchestrate status` stays free of torch.
"""

from kdtree.gates.base import (  # noqa: F401
    Figure, GateContext, GateResult, Outcome, compare, not_implemented, run_check, verdict,
)
from kdtree.gates.spec import GateSpec, PhaseSpec  # noqa: F401
