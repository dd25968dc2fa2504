"""The plan's phases, one module each, in the order they must pass:

phase1_kernel, phase2_backend, phase3_graph, phase4_defrag.

Each module exports ``SPEC`` (a `kdtree.gates.spec.PhaseSpec`: objective, deliverables, input
globs and gates with their thresholds) and ``CHECKS`` (gate name -> ``check(spec, ctx) ->
GateResult``). Phase modules import no orchestrator code and keep torch imports inside their
check functions, so loading a SPEC is cheap. The plan that lists them is
`kdtree.orchestrator.plan.DEFAULT_PLAN`.
"""
