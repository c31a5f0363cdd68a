"""Warp logits into the distribution a sampler draws from, and draw from it.

Warping and drawing are separate on purpose: rejection sampling needs the warped
distributions of both models, not a sampled token. The same `warp` is applied to the target
and to the drafter, so both are compared on the distributions they actually sample from.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from specmlx.errors import UsageError


@dataclass(frozen=True)
class SamplingConfig:
    """Sampler settings shared by the target and the drafter. temperature 0 is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise UsageError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise UsageError(f"top-k must be >= 0 (0 turns it off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp(logits: mx.array, sampling: SamplingConfig) -> mx.array:
    """Probabilities after temperature, top-k and top-p, in that order. # (..., vocab)

    Greedy settings give the one-hot distribution of the argmax, which is what a greedy
    sampler draws from.
    """
    logits = logits.astype(mx.float32)
    if sampling.greedy:
        vocab = logits.shape[-1]
        return (mx.arange(vocab) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32)
    probs = mx.softmax(logits / sampling.temperature, axis=-1)
    if 0 < sampling.top_k < probs.shape[-1]:
        # The k-th largest probability is the threshold; ties at it are all kept.
        kth = -mx.partition(-probs, sampling.top_k - 1, axis=-1)[..., sampling.top_k - 1]
        probs = mx.where(probs >= kth[..., None], probs, 0.0)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    if sampling.top_p < 1:
        order = mx.argsort(-probs, axis=-1)
        sorted_probs = mx.take_along_axis(probs, order, axis=-1)
        # Keep a token while the mass strictly before it is below top_p: the smallest
        # prefix whose mass reaches top_p, and always the most likely token.
        mass_before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep_sorted = mass_before < sampling.top_p
        keep = mx.put_along_axis(mx.zeros(probs.shape, dtype=mx.bool_), order, keep_sorted, axis=-1)
        probs = mx.where(keep, probs, 0.0)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs


def draw(probs: mx.array) -> mx.array:
    """One token id per row of `probs`. # (...,)"""
    return mx.random.categorical(mx.log(probs), axis=-1).astype(mx.uint32)


def sample(logits: mx.array, sampling: SamplingConfig) -> tuple[mx.array, mx.array | None]:
    """A token per row and, when sampling, the distribution it was drawn from.

    Greedy returns no distribution: greedy verification compares tokens only.
    """
    if sampling.greedy:
        return mx.argmax(logits, axis=-1).astype(mx.uint32), None
    probs = warp(logits, sampling)
    return draw(probs), probs
