"""Integrations of the kernel into serving stacks (``kdtree.integrations.sglang``)."""
