"""The MLA model: its configuration, layers, seeded weights and the transformers bridge."""
