"""EAGLE-1's draft head: one decoder layer of the target's own architecture, over features.

Draft position j takes the target's embedding of token j+1 and the feature f_j (the target's
hidden state at token j), mixes them with `fc` (2d -> d, with a bias, as EAGLE-1), and runs
them through ONE decoder layer built from mlx-lm's block class for the target's model_type,
with the target's arguments. The output is the predicted next feature f̂_{j+1}; the target's
own output rows (frozen, for the draft vocabulary) turn it into logits for token j+2. The
features are the target's post-norm states, so the target's final norm is not applied again.

The layer also scores token trees: each input may sit at its own position (its depth in the
tree) and attend to an explicit mask over [cached prefix + new inputs], which lets the
drafter grow an EAGLE-2 tree one level per call in its own KV cache.
"""

from __future__ import annotations

import inspect
import sys
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.utils import _get_classes

from specmlx.engine.cache import SpecKVCache
from specmlx.engine.features import FeatureSpec, backbone
from specmlx.engine.tree import rotated_at
from specmlx.errors import SpecmlxError
from specmlx.heads.base import HeadsConfig, TargetOutput, check_fits, output_rows


def decoder_layer(target_args: dict) -> nn.Module:
    """One decoder layer of the target's architecture, from mlx-lm's own block class.

    Where the family mixes sliding-window and global layers (gemma3, some llamas) the draft
    layer is a global one: its cache then needs no window, and a draft looks at the whole
    context it was trained to read.
    """
    if "model_type" not in target_args:
        raise SpecmlxError("an EAGLE head needs its target's config (target_args with model_type)")
    args = {**target_args, "num_hidden_layers": 1}
    try:
        model_class, args_class = _get_classes(args)
    except (KeyError, ValueError) as e:
        raise SpecmlxError(f"EAGLE heads need a model_type mlx-lm knows: {e}") from None
    block = getattr(sys.modules[model_class.__module__], "TransformerBlock", None)
    if block is None:
        raise SpecmlxError(f"EAGLE heads don't support {args['model_type']}: no TransformerBlock")
    model_args = args_class.from_dict(args)
    accepts = inspect.signature(block).parameters
    extra: dict[str, Any] = {}
    if "layer_idx" in accepts:  # gemma3: layers pattern-1, 2*pattern-1, ... are global
        extra["layer_idx"] = max(1, getattr(model_args, "sliding_window_pattern", 1)) - 1
    if "use_sliding" in accepts:  # llama with layer_types
        extra["use_sliding"] = False
    return block(model_args, **extra)


class EagleHead(nn.Module):
    """fc over [embedding of token j+1, f_j], one decoder layer: the predicted f_{j+1}.

    Trainable: `fc`, `layer` (and `lm_head` when the checkpoint carries its own). The target's
    embedding and output layer are borrowed by reference outside the parameters: never
    trained, never saved. The embedding is the table's own rows (gemma's sqrt(d) input scale
    is not applied: fc learns whatever scale it needs).
    """

    def __init__(
        self,
        config: HeadsConfig,
        embed: nn.Module,
        target_output: TargetOutput | None,
        d2t: mx.array | None = None,
    ):
        super().__init__()
        self.config = config
        d = config.hidden_size
        width = FeatureSpec(config.feature_layers).width(d)
        self.fc = nn.Linear(d + width, d, bias=True)
        self.layer = decoder_layer(config.target_args)
        if not config.input_norm:
            self.layer.input_layernorm = nn.Identity()
        if config.own_lm_head:
            self.lm_head = nn.Linear(d, config.draft_vocab, bias=False)
        self._d2t = d2t  # (V_d,) int32 target ids; an underscore keeps it out of the parameters
        self._target_output = target_output  # None: own lm_head
        # A namespace, not an attribute: a module attribute would be a child, which
        # freeze(), apply_to_modules() and named_modules() would reach into.
        self._borrowed = SimpleNamespace(embed=embed)

    @property
    def d2t(self) -> mx.array | None:
        """Target ids of the draft vocabulary (None: the full vocabulary). # (V_d,)"""
        return self._d2t

    @classmethod
    def create(
        cls, config: HeadsConfig, target_model: nn.Module, d2t: mx.array | None = None
    ) -> EagleHead:
        """A fresh head for `target_model`, which starts out predicting f_{j+1} = f_j.

        fc passes the features through (an identity over them, zero over the embedding) and
        the layer's residual branches start at zero (o_proj, down_proj), so the layer is the
        identity: training starts from "the next feature is the current one", a
        deterministic baseline the regression loss improves on, as Medusa's zero-init
        starts from the target's own next-token head.
        """
        _check(config, target_model, d2t)
        output = None if config.own_lm_head else TargetOutput(target_model, d2t)
        head = cls(config, backbone(target_model).embed_tokens, output, d2t)
        d = config.hidden_size
        taps = max(1, len(config.feature_layers))
        weight = mx.concatenate(
            [mx.zeros((d, d)), *([mx.eye(d) / taps] * taps)], axis=1
        )  # (d, d + width)
        head.fc.weight = weight
        head.fc.bias = mx.zeros((d,))
        for name, module in head.layer.named_modules():
            if name.endswith(("o_proj", "down_proj")) and isinstance(module, nn.Linear):
                module.weight = mx.zeros_like(module.weight)
                if "bias" in module:
                    module.bias = mx.zeros_like(module.bias)
        if config.own_lm_head:
            head.lm_head.weight = output_rows(target_model, d2t)
        mx.eval(head.parameters())
        return head

    def make_cache(self) -> list[SpecKVCache]:
        """The layer's KV cache (one entry, mlx-lm style), trimmable."""
        return [SpecKVCache()]

    def __call__(
        self,
        features: mx.array,
        tokens: mx.array,
        cache: list[Any] | None = None,
        positions: mx.array | None = None,
        mask: mx.array | None = None,
    ) -> mx.array:
        """Predicted next features for draft positions (f_j, token j+1). # (..., n, d)

        features # (..., n, F) the target's features (or predicted ones, in a tree)
        tokens   # (..., n) target ids of the tokens that follow them
        Without `positions` the n inputs follow the cache causally, or attend where `mask`
        (B, 1, n, n) says (training on packed sequences). With them, input i sits at
        position positions[i] and attends where mask[i] is True, over the cached entries
        then the n new ones: `mask` # (n, offset + n) bool.
        """
        embedded = self._borrowed.embed(tokens).astype(features.dtype)
        x = self.fc(mx.concatenate([embedded, features], axis=-1))
        batched = x.ndim == 3
        x = x if batched else x[None]
        c = cache[0] if cache is not None else None
        if positions is None:
            out = self.layer(x, create_attention_mask(x, c) if mask is None else mask, c)
        else:
            offset = c.offset if c is not None else 0
            with rotated_at(self.layer, positions - offset):
                out = self.layer(x, mask, c)
        return out if batched else out[0]

    def logits(self, hidden: mx.array) -> mx.array:
        """Scores over the draft vocabulary. # (..., V_d)"""
        if self._target_output is None:
            return self.lm_head(hidden)
        return self._target_output(hidden)


def _check(config: HeadsConfig, target_model: nn.Module, d2t: mx.array | None) -> None:
    if config.kind != "eagle":
        raise SpecmlxError(f"EagleHead got a config of kind {config.kind!r}")
    check_fits(config, target_model, d2t, "an EAGLE head")
