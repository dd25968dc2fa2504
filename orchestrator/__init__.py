"""The orchestrator: phases of a plan run through gates, recorded, rendered and checkpointed.

Modules, one job each: `specs` (PlanSpec, RunRecord, ...), `plan` (which plan a project
follows; loading phase modules), `repo` (finding the project), `scaffold` (``init``), `inputs`
(a phase's input files, hash and file stamps), `store` (run records on disk), `preflight`
(writable before the gates, rescued after), `lock` (one writer at a time, the others wait),
`state` (a phase's state now), `runner` (running gates, recording a run), `markers` + `render`
+ `textfile` (the plan's owned blocks), `changelog`, `checkpoint` + `commitset`, `git` (the one
way git is called) + `gitinfo` + `provenance`, `device`, `display`, `cli`.

Importing this package is cheap: nothing here imports torch, triton, jinja2 or rich at module
level, so ``orchestrate status`` stays fast; torch is imported only when a gate asks for CUDA.
"""
