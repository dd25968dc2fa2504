"""Moved to `kdtree.bench.token_probe` (the measurement layer). `decoy_step` stays importable here
for phase 2's checks until they import it from there."""

from kdtree.bench.token_probe import decoy_step  # noqa: F401
