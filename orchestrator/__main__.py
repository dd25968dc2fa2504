"""``python -m kdtree.orchestrator`` is ``orchestrate``."""

from kdtree.orchestrator.cli import main

main()
