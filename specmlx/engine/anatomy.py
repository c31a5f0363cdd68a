"""Where a loaded model keeps its text decoder's sizes and output layer.

mlx-lm builds most families as `model.{args, model, lm_head}`. Families released as
multimodal checkpoints (qwen3_5, gemma3, ...) nest the text model as `model.language_model`
and keep only the raw text config on the outer `args` (`args.text_config`, a dict), so
`model.args.vocab_size` does not exist there. Whatever needs a size or the output layer
reads it here, from the text model.
"""

from __future__ import annotations

from typing import Any

import mlx.nn as nn

from specmlx.engine.features import backbone


def text_model(model: nn.Module) -> nn.Module:
    """The text decoder with its own args and output layer: `model.language_model` where
    the family nests one, else the model itself."""
    inner = model.get("language_model") if isinstance(model, nn.Module) else None
    return inner if isinstance(inner, nn.Module) else model


def text_args(model: nn.Module) -> Any:
    """The text decoder's args (hidden_size, vocab_size, max_position_embeddings, ...)."""
    return text_model(model).args


def vocab_rows(model: nn.Module) -> int:
    """The rows of a model's output layer: its vocabulary, padding included."""
    return int(text_args(model).vocab_size)


def hidden_size(model: nn.Module) -> int:
    return int(text_args(model).hidden_size)


def output_layer(model: nn.Module) -> nn.Module:
    """The layer that turns the final hidden state into logits: lm_head, or the tied
    embedding (mlx-lm models drop `lm_head` when the embeddings are tied)."""
    inner = text_model(model)
    return inner["lm_head"] if "lm_head" in inner else backbone(model).embed_tokens
