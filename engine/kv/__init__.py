"""The page_size=1 KV token pool: slot allocators (Tier 0), relocation (Tier 1), run-length metadata, device mirrors and the native core."""
