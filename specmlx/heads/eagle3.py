"""EAGLE-3's draft head, as published (SafeAILab/EAGLE cnets.py, SpecForge Eagle3 drafts).

EAGLE-3 reads three of the target's layers at once: their outputs, concatenated (low, mid,
high), go through `fc` (3d -> d). The one draft layer ("midlayer") differs from a plain
decoder layer: it normalizes the embedding of token j+1 (`input_layernorm`) and the hidden
state (`hidden_norm`) separately, concatenates them [embedding, hidden], and attends with
q/k/v projections over that 2d-wide input; the residual is the hidden state alone. Its
output is the head's own next hidden state, which goes through a final `norm` and the
head's own `lm_head` over a reduced draft vocabulary; draft token i is target token d2t[i].

Drafting on from its own prediction, the head takes that d-wide hidden state back in place
of the target's 3d-wide features, without `fc` (as the reference does): `__call__` tells the
two apart by their width.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask

from specmlx.engine.cache import SpecKVCache
from specmlx.engine.features import FeatureSpec, backbone
from specmlx.engine.tree import rotated_at
from specmlx.errors import SpecmlxError
from specmlx.heads.base import HeadsConfig, check_fits, output_rows

# The draft layer's config keys the llama block reads (from the checkpoint's config.json).
_LLAMA_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
)


# Attention other than the midlayer's own, given its attention module (projections, rope,
# o_proj) and the layer's input # (B, n, 2d) -> (B, n, d): training's test steps
# (`specmlx.training.eagle3_objective.StepAttention`). None: the module's own, over `cache`.
Attend = Callable[[llama.Attention, mx.array], mx.array] | None


def draft_args(draft_config: dict) -> llama.ModelArgs:
    """mlx-lm llama arguments for the draft layer described by an EAGLE-3 config.json."""
    values = {k: draft_config[k] for k in _LLAMA_KEYS if draft_config.get(k) is not None}
    values.setdefault("rms_norm_eps", 1e-6)  # transformers' LlamaConfig default
    return llama.ModelArgs(
        model_type="llama",
        num_hidden_layers=1,
        vocab_size=int(draft_config.get("vocab_size", 1)),
        tie_word_embeddings=False,
        **values,
    )


def aux_layers(config: dict, n_target_layers: int) -> tuple[int, ...]:
    """The target layers (0-based; their outputs) an EAGLE-3 checkpoint reads: its config's
    (SpecForge / sglang `eagle_aux_hidden_state_layer_ids`), or the reference default for a
    target of `n_target_layers` (the inputs of layers 2, L//2, L-3: these layers' outputs)."""
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ids = ids or config.get("aux_hidden_state_layer_ids")
    n = n_target_layers
    layers = tuple(int(i) for i in ids) if ids else (1, n // 2 - 1, n - 4)
    if any(not 0 <= i < n for i in layers) or len(set(layers)) != len(layers):
        raise SpecmlxError(f"EAGLE-3 reads target layers {list(layers)}: the target has {n}")
    return layers


def draft_ids(offsets: mx.array | None, in_target: mx.array | None, vocab: int) -> mx.array:
    """Target ids of an EAGLE-3 draft vocabulary: draft token i is target token
    i + offsets[i] (`d2t`); `in_target` (`t2d`, (vocab,) bool) marks the same tokens.

    # offsets (V_d,) -> (V_d,) int32
    """
    if offsets is None or offsets.ndim != 1:
        raise SpecmlxError("an EAGLE-3 draft vocabulary smaller than the target's needs its d2t")
    rows = offsets.shape[0]
    ids = mx.arange(rows) + offsets.astype(mx.int64)
    ok = mx.all((ids >= 0) & (ids < vocab))
    if in_target is not None:
        if in_target.shape != (vocab,):
            raise SpecmlxError(
                f"EAGLE-3 t2d covers {in_target.size} tokens, the target has {vocab}"
            )
        # Offsets stored as absolute ids (or the reverse) would fail here.
        fits = mx.sum(in_target.astype(mx.int32)) == rows
        ok = ok & fits & mx.all(in_target.astype(mx.bool_)[mx.clip(ids, 0, vocab - 1)])
    if not ok.item():
        raise SpecmlxError("EAGLE-3 d2t does not map the draft vocabulary into the target's (t2d)")
    return ids.astype(mx.int32)


class Midlayer(nn.Module):
    """EAGLE-3's decoder layer over [input_layernorm(embedding), hidden_norm(hidden)]."""

    def __init__(self, args: llama.ModelArgs):
        super().__init__()
        d = args.hidden_size
        self.self_attn = llama.Attention(args)  # its rope, scale and o_proj; q/k/v widened:
        attn = self.self_attn
        self.self_attn.q_proj = nn.Linear(2 * d, attn.n_heads * attn.head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * d, attn.n_kv_heads * attn.head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * d, attn.n_kv_heads * attn.head_dim, bias=False)
        self.mlp = llama.MLP(args)
        self.input_layernorm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=args.rms_norm_eps)

    def __call__(
        self, embedded: mx.array, hidden: mx.array, mask: Any, cache: Any, attend: Attend = None
    ) -> mx.array:
        x = mx.concatenate([self.input_layernorm(embedded), self.hidden_norm(hidden)], axis=-1)
        attended = self.self_attn(x, mask, cache) if attend is None else attend(self.self_attn, x)
        h = hidden + attended  # (B, n, d): the residual is hidden alone
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """fc over three target layers, the midlayer, then norm and lm_head over the draft vocab.

    Same interface as EagleHead: `__call__(features, tokens, cache, positions, mask)` gives
    the next hidden states, `logits(hidden)` their scores over the draft vocabulary,
    `make_cache()`, `d2t`. The target's embedding is borrowed by reference (the published
    checkpoints copy it from the target: it is never one of the head's parameters).
    `config.target_args` holds the checkpoint's own config.json (a llama draft layer).
    """

    def __init__(self, config: HeadsConfig, embed: nn.Module, d2t: mx.array | None = None):
        super().__init__()
        self.config = config
        args = draft_args(config.target_args)
        d = config.hidden_size
        if args.hidden_size != d:
            raise SpecmlxError(
                f"EAGLE-3 heads of hidden size {args.hidden_size} on a target of {d}: a draft "
                "narrower than its target is not supported"
            )
        width = FeatureSpec(config.feature_layers).width(d)
        if config.target_args.get("fc_norm"):  # newer SpecForge: one norm per target layer
            self.fc_norm = [nn.RMSNorm(d, eps=args.rms_norm_eps) for _ in config.feature_layers]
        self.fc = nn.Linear(width, d, bias=False)
        self.midlayer = Midlayer(args)
        self.norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.lm_head = nn.Linear(d, config.draft_vocab, bias=False)
        self._norm_output = config.target_args.get("norm_output", True)
        self._d2t = d2t  # (V_d,) int32 target ids; an underscore keeps it out of the parameters
        self._borrowed = SimpleNamespace(embed=embed)  # not a child module: never a parameter

    @property
    def d2t(self) -> mx.array | None:
        """Target ids of the draft vocabulary (None: the full vocabulary). # (V_d,)"""
        return self._d2t

    @classmethod
    def create(
        cls, config: HeadsConfig, target_model: nn.Module, d2t: mx.array | None = None
    ) -> Eagle3Head:
        """A fresh head for `target_model` (random layers; lm_head the target's rows)."""
        if config.kind != "eagle3":
            raise SpecmlxError(f"Eagle3Head got a config of kind {config.kind!r}")
        check_fits(config, target_model, d2t, "an EAGLE-3 head")
        head = cls(config, backbone(target_model).embed_tokens, d2t)
        head.lm_head.weight = output_rows(target_model, d2t)
        mx.eval(head.parameters())
        return head

    def make_cache(self) -> list[SpecKVCache]:
        """The midlayer's KV cache (one entry, mlx-lm style), trimmable."""
        return [SpecKVCache()]

    def __call__(
        self,
        features: mx.array,
        tokens: mx.array,
        cache: list[Any] | None = None,
        positions: mx.array | None = None,
        mask: mx.array | None = None,
        attend: Attend = None,
    ) -> mx.array:
        """Next hidden states for draft positions (f_j, token j+1). # (..., n, d)

        features # (..., n, 3d) the target's three layers, or (..., n, d) the head's own
                 # hidden states (drafting on from its predictions: no fc, as EAGLE-3 does)
        tokens   # (..., n) target ids of the tokens that follow them
        Without `positions` the n inputs follow the cache causally, or attend where `mask`
        (B, 1, n, n) says (training on packed sequences). With them, input i sits at
        position positions[i] and attends where mask[i] is True, over the cached entries
        then the n new ones: `mask` # (n, offset + n) bool. `attend`: attention of the
        caller's own (training's test steps, batched), which reads neither `cache` nor
        `mask`; not with `positions`.
        """
        hidden = self._project(features)
        embedded = self._borrowed.embed(tokens).astype(hidden.dtype)
        batched = hidden.ndim == 3
        hidden, embedded = (hidden, embedded) if batched else (hidden[None], embedded[None])
        c = cache[0] if cache is not None else None
        if positions is None:
            causal = create_attention_mask(hidden, c) if mask is None else mask
            out = self.midlayer(embedded, hidden, causal, c, attend)
        else:
            assert attend is None, "attend takes no positions"
            offset = c.offset if c is not None else 0
            with rotated_at(self.midlayer.self_attn, positions - offset):
                out = self.midlayer(embedded, hidden, mask, c)
        return out if batched else out[0]

    def _project(self, features: mx.array) -> mx.array:
        width, d = features.shape[-1], self.config.hidden_size
        if width == self.fc.weight.shape[1]:
            if "fc_norm" in self:
                parts = mx.split(features, len(self.fc_norm), axis=-1)
                features = mx.concatenate(
                    [n(p) for n, p in zip(self.fc_norm, parts, strict=True)], axis=-1
                )
            return self.fc(features)
        if width == d:
            return features
        raise SpecmlxError(f"an EAGLE-3 head takes features of width {d} or 3x that, not {width}")

    def logits(self, hidden: mx.array) -> mx.array:
        """Scores over the draft vocabulary. # (..., V_d)"""
        return self.lm_head(self.norm(hidden) if self._norm_output else hidden)
