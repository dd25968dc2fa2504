"""Phase 2 (backend): ``SPEC`` (`spec`) and ``CHECKS``, each gate's check as a
``"module:function"`` string into `checks`, imported only when the gate runs."""

from kdtree.phases.phase2.spec import CHECKS, SPEC, TARGETS

__all__ = ["CHECKS", "SPEC", "TARGETS"]
