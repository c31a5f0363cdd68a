"""specmlx: lossless speculative decoding for on-device LLMs on MLX.

The public API is re-exported here lazily, so that `import specmlx` (and `specmlx --help`)
does not pay for importing mlx and mlx-lm.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "load": "specmlx.api.load",
    "generate": "specmlx.api.generate",
    "stream_generate": "specmlx.api.generate",
    "generate_many": "specmlx.api.batch",
    "Request": "specmlx.api.batch",
    "GenerationConfig": "specmlx.api.config",
    "ChatSession": "specmlx.api.chat",
    "Session": "specmlx.api.session",
    "encode_prompt": "specmlx.api.generate",
    "GenerationResult": "specmlx.api.generate",
    "SamplingConfig": "specmlx.engine.sampling",
    "resolve_model": "specmlx.io.resolve",
    "convert_gguf": "specmlx.io.convert",
    "SpecmlxError": "specmlx.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'specmlx' has no attribute {name!r}")
