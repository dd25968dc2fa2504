"""The SGLang attention backend: SGLang 0.5.23's Triton backend with the MLA target-verify path on the kernel.

- `converter`: SGLang's verify metadata -> the op contract (docs/design.md section 3), on the GPU, into
  preallocated buffers (no host sync, no allocation);
- `backend`: `backend_class()`, a subclass of SGLang's ``TritonAttnBackend`` that overrides only
  the MLA target-verify path of ``forward_extend``; every other call goes to the parent;
- `plugin`: ``register()``, the ``sglang.srt.plugins`` entry point that makes
  ``--attention-backend triton`` build that subclass in every SGLang process.

Importing this package imports neither SGLang nor triton; `backend_class()` imports SGLang.
"""

from kdtree.integrations.sglang.converter import OpMetadata, VerifyConverter, convert_reference  # noqa: F401
