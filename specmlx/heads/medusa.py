"""Medusa heads (Cai et al. 2024): K small heads guess the tokens 1..K positions further on.

Each head reads the target's newest hidden state f (the one from which the target predicted
the last token) and guesses one token further ahead: head i the token i + 1 positions past
the last one. A head is Medusa's stack of residual blocks, x + SiLU(W x + b), whose output
goes through the target's own output rows for the draft vocabulary (frozen, borrowed, never
saved) or through the checkpoint's own lm_head. W and b start at zero, as in Medusa, so a
fresh head is the identity on f: it starts as the target's own next-token head.

Parameter names follow Medusa's own layout under `heads.`: `heads.{i}.{j}.linear.weight|bias`
for block j of head i, and `heads.{i}.{num_layers}.weight` for a head's own lm_head.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from specmlx.errors import SpecmlxError
from specmlx.heads.base import HeadsConfig, TargetOutput, check_fits, output_rows


class ResBlock(nn.Module):
    """Medusa's block: x + SiLU(W x + b)."""

    def __init__(self, size: int):
        super().__init__()
        self.linear = nn.Linear(size, size)

    def __call__(self, x: mx.array) -> mx.array:
        return x + nn.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K Medusa heads over one target's hidden states."""

    def __init__(
        self, config: HeadsConfig, target_output: TargetOutput | None, d2t: mx.array | None
    ):
        super().__init__()
        self.config = config
        self._d2t = d2t  # (V_d,) int32 target ids; an underscore keeps it out of the parameters
        self._target_output = target_output  # None: own lm_heads
        size, vocab = config.hidden_size, config.draft_vocab
        self.heads = [
            [ResBlock(size) for _ in range(config.num_layers)]
            + ([nn.Linear(size, vocab, bias=False)] if config.own_lm_head else [])
            for _ in range(config.num_heads)
        ]

    @property
    def d2t(self) -> mx.array | None:
        return self._d2t

    @classmethod
    def create(
        cls, config: HeadsConfig, target_model: nn.Module, d2t: mx.array | None = None
    ) -> MedusaHeads:
        """Fresh heads for `target_model`: every block zero, so each head starts as the
        target's own next-token head (an own lm_head starts as a copy of its rows)."""
        _check(config, target_model, d2t)
        output = None if config.own_lm_head else TargetOutput(target_model, d2t)
        heads = cls(config, output, d2t)
        for head in heads.heads:
            for block in head[: config.num_layers]:
                block.linear.weight = mx.zeros_like(block.linear.weight)
                block.linear.bias = mx.zeros_like(block.linear.bias)
            if config.own_lm_head:
                head[-1].weight = output_rows(target_model, d2t)
        mx.eval(heads.parameters())
        return heads

    def __call__(self, features: mx.array, n_heads: int | None = None) -> mx.array:
        """Each head's logits over the draft vocabulary. # (n, F) -> (K, n, V_d)

        `n_heads` runs only the first heads (a proposal shorter than K needs no more).
        """
        hidden = []
        for head in self.heads[:n_heads]:
            x = features
            for block in head[: self.config.num_layers]:
                x = block(x)
            hidden.append(x)
        if self._target_output is None:
            return mx.stack([head[-1](x) for head, x in zip(self.heads, hidden, strict=False)])
        return self._target_output(mx.stack(hidden))  # one matmul for all heads

    def target_logits(self, features: mx.array) -> mx.array:
        """The target's own logits over the draft vocabulary at `features` (its final hidden
        states): what soft-target training matches. # (..., F) -> (..., V_d)"""
        if self._target_output is None:
            raise SpecmlxError("Medusa heads with their own lm_heads hold no target rows")
        return self._target_output(features)

    def top_candidates(
        self, features_row: mx.array, width: int, n_heads: int | None = None
    ) -> tuple[mx.array, mx.array]:
        """Each head's `width` most probable tokens (target ids), most probable first, and
        their probabilities under the head's softmax at its temperature; lazily.

        features_row # (F,) -> ids # (K, width) int32, probs # (K, width) float32
        """
        logits = self(features_row[None], n_heads)[:, 0].astype(mx.float32)  # (K, V_d)
        if self.config.temperatures:  # honest probabilities: the trees' sizes rest on them
            scale = [1 / self.config.temperature(i) for i in range(logits.shape[0])]
            logits = logits * mx.array(scale)[:, None]
        probs = mx.softmax(logits, axis=-1)
        width = min(width, probs.shape[-1])
        top = mx.argpartition(-probs, width - 1, axis=-1)[:, :width]  # unordered
        top_probs = mx.take_along_axis(probs, top, axis=-1)
        order = mx.argsort(-top_probs, axis=-1)
        top = mx.take_along_axis(top, order, axis=-1)
        top_probs = mx.take_along_axis(top_probs, order, axis=-1)
        ids = top if self._d2t is None else self._d2t[top]
        return ids.astype(mx.int32), top_probs


def _check(config: HeadsConfig, target_model: nn.Module, d2t: mx.array | None) -> None:
    if config.kind != "medusa":
        raise SpecmlxError(f"MedusaHeads got a config of kind {config.kind!r}")
    if len(config.feature_layers) > 1:
        raise SpecmlxError("Medusa heads read one hidden state: at most one feature layer")
    if config.num_heads < 1 or config.num_layers < 0:
        raise SpecmlxError("Medusa needs at least one head and no negative number of blocks")
    check_fits(config, target_model, d2t, "heads")
