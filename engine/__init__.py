"""The inference engine the gates run on: a seeded DeepSeek-V3-style MLA model, a page_size=1 KV
token pool, attention backends behind the op contract, and tree speculative decoding.

    generate(prompts, *, model=None, config=None, drafter="none", budget=16, backend="torch",
             device="cpu", dtype=None, max_new_tokens=32, seed=0) -> GenerationResult
    build_model(config=None, seed=0, device="cpu", dtype=None) -> MLAModel

Backends (`kdtree.engine.decode.backends`): ``kernel`` (alias ``cuda``: the owned CUDA kernel for verify,
the drafter's decode passes and prefill as 1024-row chain trees), ``triton`` (today's engines),
``torch`` and ``reference`` (any device). Presets include ``dsv3-tp8`` (DeepSeek-V3 / Kimi-K2
attention as one TP-8 shard) and ``tiny-long`` (prompts of 32k tokens and more).

Importing this package imports torch, never triton, and builds nothing for CUDA.
"""

from kdtree.engine.api import GenerationResult, build_model, check_device, default_dtype, generate  # noqa: F401
from kdtree.engine.decode.backends import AttentionBackend, get_backend, known_backends, register_backend  # noqa: F401
from kdtree.engine.model.config import ModelConfig, preset  # noqa: F401
from kdtree.engine.decode.drafters import DRAFTER_NAMES, get_drafter  # noqa: F401
from kdtree.engine.kv.kv_pool import KVPool  # noqa: F401
from kdtree.engine.model.model import MLAModel  # noqa: F401
from kdtree.engine.decode.tree import TokenTree  # noqa: F401
