"""Phase 3 (graph capture): ``SPEC`` (`spec`) and ``CHECKS``, each gate's check as a
``"module:function"`` string into `checks`, imported only when the gate runs."""

from kdtree.phases.phase3.spec import CHECKS, SPEC

__all__ = ["CHECKS", "SPEC"]
