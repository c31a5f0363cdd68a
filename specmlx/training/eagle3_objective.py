"""How EAGLE-3 heads of our own are trained (`train-heads --kind eagle3`).

EAGLE-3 (Li et al. 2025) reads three of the target's layers at once, low, middle and high
(`specmlx.heads.eagle3`: fc fuses them, one llama-style layer of its own drafts on), and
drops EAGLE's regression of the next feature: its loss is cross-entropy alone, on tokens.
What makes it draft deep is the training-time test: the head is run `unroll` times over
each window, step s > 1 fed its own output hidden states of step s-1 (d-wide, no fc), as
drafting feeds them. At position j, step 1 takes (f_j, token j+1) and step s takes
(h^{s-1}_j, token j+s); step s's label is the target's greedy token after token j+s (the
token a draft of depth s must match), in draft ids, -1 where the draft vocabulary lacks it
(left out of the loss, a miss in the accuracy). Steps are weighted 0.8 ** (s-1), as
SafeAILab's cnets.py and SpecForge's OnlineEagle3Model weight them.

Attention is the reference's, not an approximation: step s's queries attend to the first
step's keys and values causally (the target's features: the prefix a draft sees), and to
those of steps 2..s at their own position only (the draft's own ancestors), rotated s-1
positions on (SpecForge's `position_ids + lck`). So row j of step s computes exactly what
the drafter computes at depth s of a chain drafted after position j (the tests check it).
EAGLE-1's objective (`specmlx.training.objectives`) instead runs each step as a full causal
pass over the window's own predictions, an approximation this one needs no longer.

Hard labels only: the reference's soft targets (the target's distribution over the draft
vocabulary) need the target's final hidden state, which an EAGLE-3 feature cache keeps
beside its three layers but the batches do not read yet. No feature noise (EAGLE-3 trains
on none: its test steps are the noise that matters).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specmlx.errors import UsageError
from specmlx.training.losses import (
    Batch,
    BatchFn,
    LossFn,
    Objective,
    cross_entropy,
    feature_rows,
    masked_mean,
    segment_mask,
    softmax,
)
from specmlx.training.shards import FeatureData

STEP_DECAY = 0.8  # step s's loss weight: STEP_DECAY ** (s-1), the reference's
MIN_UNROLL = 3  # the fewest test steps: EAGLE-3's point is drafting deep on its own outputs
MIN_LAYERS = 2  # fewer, and fc's input would be as wide as the head's own outputs

# The target's config.json keys the draft layer copies, with the defaults transformers'
# LlamaConfig has (the target's config may leave them out).
_COPIED = {
    "hidden_size": None,
    "intermediate_size": None,
    "num_attention_heads": None,
    "num_key_value_heads": None,  # None: as many as the attention heads
    "head_dim": None,  # None: hidden_size // num_attention_heads
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 2048,
}


def eagle3_batch(
    data: FeatureData,
    pos: np.ndarray,
    end: np.ndarray,
    first: np.ndarray,
    segments: np.ndarray,
    t2d: np.ndarray,
    unroll: int = MIN_UNROLL,
) -> Batch:
    """The fused layers' features f_j (B, L, F), the attention mask (B, 1, L, L), then for
    each test step s = 1..unroll: tokens j+s (B, L), labels: the target's greedy token after
    token j+s in draft ids or -1 (B, L), valid (B, L): that token is in j's sequence and j
    is scored (at or after `first`). Past a sequence's end the tokens repeat its last one:
    read only by row j itself (its own steps), never scored."""
    batch: list[mx.array] = [feature_rows(data, pos), segment_mask(segments)]
    for step in range(1, unroll + 1):
        ahead = np.minimum(pos + step, end - 1)
        valid = (pos + step < end) & (pos >= first)
        labels = np.where(valid, t2d[data.nexts[ahead]], -1)
        batch += [mx.array(data.tokens[ahead]), mx.array(labels), mx.array(valid)]
    return tuple(batch)


class StepAttention:
    """The midlayer's attention over the training-time test, one step per call
    (`Eagle3Head.__call__`'s `attend`): step s's queries attend to the first step's keys
    where `mask` says (the window's own causal attention) and to each step's keys so far at
    their own position only, rotated s-1 positions on (the reference's concatenated keys
    and masks). Only those diagonals are scored, not the L x L blocks they sit in: step s
    costs what step 1 does, not s times it. The scores' softmax is `losses.softmax`.

    mask # (B, 1, L, L) bool"""

    def __init__(self, mask: mx.array):
        self.mask = mask[:, :, None]  # (B, 1, 1, L, L): every query head of a group alike
        self.keys: list[mx.array] = []  # per step so far # (B, kv_heads, 1, L, head_dim)
        self.values: list[mx.array] = []

    def __call__(self, attn: nn.Module, x: mx.array) -> mx.array:
        """attn: the midlayer's llama-style attention; x # (B, L, 2d) -> (B, L, d)"""
        batch, length, _ = x.shape
        heads, kv_heads = attn.n_heads, attn.n_kv_heads
        step = len(self.keys)  # rotated this many positions on, as its draft sits

        def split(proj: nn.Module, n: int) -> mx.array:
            return proj(x).reshape(batch, length, n, -1).transpose(0, 2, 1, 3)

        queries = attn.rope(split(attn.q_proj, heads), offset=step) * attn.scale
        queries = queries.reshape(batch, kv_heads, heads // kv_heads, length, -1)
        keys = attn.rope(split(attn.k_proj, kv_heads), offset=step)
        self.keys.append(keys[:, :, None])
        self.values.append(split(attn.v_proj, kv_heads)[:, :, None])
        window = queries @ self.keys[0].swapaxes(-1, -2)  # (B, kv, group, L, L)
        window = mx.where(self.mask, window, mx.array(-mx.inf, window.dtype))
        own = [(queries * keys_s).sum(-1, keepdims=True) for keys_s in self.keys[1:]]
        probs = softmax(mx.concatenate([window, *own], axis=-1))  # (B, kv, group, L, L + s-1)
        out = probs[..., :length] @ self.values[0]
        for i, values_s in enumerate(self.values[1:]):
            out = out + probs[..., length + i, None] * values_s
        out = out.reshape(batch, heads, length, -1).transpose(0, 2, 1, 3)
        return attn.o_proj(out.reshape(batch, length, -1))


def unrolled(
    head: nn.Module, features: mx.array, mask: mx.array, tokens: list[mx.array]
) -> list[mx.array]:
    """The head's output hidden states at each test step, one per entry of `tokens`.

    features # (B, L, F) the fused layers; mask # (B, 1, L, L) the window's attention;
    tokens[s-1] # (B, L) step s's input tokens -> [(B, L, d)] * len(tokens)"""
    steps = StepAttention(mask)
    inputs, hidden_states = features, []
    for step_tokens in tokens:
        hidden = head(inputs, step_tokens, attend=steps)  # (B, L, d)
        hidden_states.append(hidden)
        inputs = hidden  # the next step reads the head's own output, as drafting does
    return hidden_states


def eagle3_loss(
    head: nn.Module,
    features: mx.array,
    mask: mx.array,
    *steps: mx.array,
    decay: float = STEP_DECAY,
) -> tuple[mx.array, mx.array, mx.array]:
    """Sum over the test steps (each a group of `eagle3_batch`'s tokens, labels, valid) of
    decay ** (s-1) x the step's cross-entropy; each step's cross-entropy (K,) and top-1
    accuracy (K,)."""
    groups = [steps[i : i + 3] for i in range(0, len(steps), 3)]
    hidden_states = unrolled(head, features, mask, [tokens for tokens, _, _ in groups])
    terms, accuracy = [], []
    for hidden, (_, labels, valid) in zip(hidden_states, groups, strict=True):
        logits = head.logits(hidden)  # (B, L, V_d)
        terms.append(masked_mean(cross_entropy(logits, labels), valid & (labels >= 0)))
        accuracy.append(masked_mean(mx.argmax(logits, axis=-1) == labels, valid))
    per_step = mx.stack(terms)  # (K,)
    weights = decay ** mx.arange(per_step.shape[0], dtype=mx.float32)
    return (weights * per_step).sum(), per_step, mx.stack(accuracy)


def draft_layer(target_config: dict, draft_vocab: int) -> dict:
    """The draft layer's own config (HeadsConfig.target_args), llama-style as an EAGLE-3
    checkpoint's config.json has it, from the target's config.json: its width, attention
    and rope, so the head reads the target's features at the target's scale; vocab_size is
    the draft vocabulary's. A one-line UsageError where the target's config cannot give one.
    Qwen3.5-style configs nest the text model's sizes under `text_config` (and its rope base
    under `rope_parameters`): read there.
    """
    target_config = target_config.get("text_config") or target_config
    rope = target_config.get("rope_parameters") or {}
    if target_config.get("rope_theta") is None and rope.get("rope_theta") is not None:
        target_config = {**target_config, "rope_theta": rope["rope_theta"]}
    missing = [
        k
        for k in ("hidden_size", "intermediate_size", "num_attention_heads")
        if not target_config.get(k)
    ]
    if missing:
        raise UsageError(
            f"EAGLE-3 heads copy their layer's shape from the target's config, which lacks "
            f"{', '.join(missing)}"
        )
    config: dict[str, Any] = {"model_type": "llama", "num_hidden_layers": 1}
    for key, default in _COPIED.items():
        value = target_config.get(key)
        config[key] = default if value is None else value
    heads = int(config["num_attention_heads"])
    config["num_key_value_heads"] = config["num_key_value_heads"] or heads
    config["head_dim"] = config["head_dim"] or int(config["hidden_size"]) // heads
    config["vocab_size"] = int(draft_vocab)
    from specmlx.heads.eagle3 import Midlayer, draft_args

    try:
        Midlayer(draft_args(config))  # lazy weights: a check of its shapes and rope only
    except ValueError as e:  # mlx-lm: an unsupported rope_scaling
        raise UsageError(f"EAGLE-3 heads cannot copy the target's attention: {e}") from None
    return config


def eagle3_logits(
    head: nn.Module, features: mx.array, mask: mx.array, *steps: mx.array
) -> tuple[mx.array, mx.array, mx.array]:
    """Each test step's logits on an `eagle3_batch` (K, B, L, V_d), its labels (K, B, L)
    and the positions that count (K, B, L): what the step's temperature is fitted on."""
    groups = [steps[i : i + 3] for i in range(0, len(steps), 3)]
    hidden_states = unrolled(head, features, mask, [tokens for tokens, _, _ in groups])
    logits = mx.stack([head.logits(hidden) for hidden in hidden_states])
    labels = mx.stack([labels for _, labels, _ in groups])
    valid = mx.stack([valid for _, _, valid in groups])
    return logits, labels, valid


# --- the objective ------------------------------------------------------------------------


def _batches(data: FeatureData, t2d: np.ndarray, settings: Any) -> BatchFn:
    return partial(eagle3_batch, data, t2d=t2d, unroll=settings.unroll)


def _loss(head: nn.Module, settings: Any) -> LossFn:
    return partial(eagle3_loss, head, decay=STEP_DECAY)


def _labelled(batch: Batch) -> mx.array:
    return mx.stack([valid.sum() for valid in batch[4::3]])  # each test step's valid


def _shape(settings: Any) -> dict[str, int]:
    """The HeadsConfig fields of fresh heads; refuses (one line) the settings EAGLE-3 heads
    are not trained with."""
    if settings.unroll < MIN_UNROLL:
        raise UsageError(
            f"eagle3 heads train over {MIN_UNROLL} or more test steps (unroll), got "
            f"{settings.unroll}"
        )
    if len(settings.feature_layers) < MIN_LAYERS:
        raise UsageError(
            f"eagle3 heads read {MIN_LAYERS} or more target layers (low, middle, high), got "
            f"{list(settings.feature_layers) or 'the final hidden state'}"
        )
    if settings.soft_targets:
        raise UsageError("eagle3 heads train on the target's greedy tokens, not soft targets")
    # Their lm_head is their own (it starts as the target's rows and is trained).
    return {"num_heads": 1, "num_layers": 1, "own_lm_head": True}


def _default_layers(target: nn.Module) -> tuple[int, ...]:
    """The reference's layers: 1, n/2 - 1 and n - 4 of a target of n (distinct from 7 on)."""
    from specmlx.engine.features import backbone
    from specmlx.heads.eagle3 import aux_layers

    n = len(backbone(target).layers)
    if n < 7:
        raise UsageError(
            f"eagle3 heads read three of the target's layers (1, n/2 - 1, n - 4): a target of "
            f"{n} layers has no three such layers"
        )
    return aux_layers({}, n)


EAGLE3 = Objective(
    _batches,
    _loss,
    _labelled,
    _shape,
    draft_layer=draft_layer,
    feature_layers=_default_layers,
    min_unroll=MIN_UNROLL,
    logits=lambda head, settings: partial(eagle3_logits, head),
)
