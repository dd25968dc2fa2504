"""The orchestrator: phases of a plan run through gates, recorded, rendered and checkpointed.

Modules, one job each: `specs` (PlanSpec, RunRecord, ...), `plan` (which plan a repo follows;
loading phase modules), `repo` (finding the repository), `inputs` (a phase's input files and
hash), `store` (run records on disk), `lock` (one writer at a time), `state` (a phase's state
now), `runner` (running gates, recording a run), `markers` + `render` (the plan's owned
blocks), `changelog`, `checkpoint`, `gitinfo`, `device`, `display`, `cli`.

Importing this package is cheap: nothing here imports torch, triton, gitpython, jinja2 or rich
at module level, so ``orchestrate status`` stays fast.
"""
