"""What every objective shares: the batch types, the `Objective` record, masked losses.

A step's positions come from packed windows (`objectives.Windows`): B windows of L
positions, each holding several pieces of cached sequences side by side. A `Span` carries,
per position, where it sits in the cache, the end of its sequence, its sequence's first
scored position and its piece (its segment), so that a label never comes from the next
sequence and attention never reaches into another piece (`segment_mask`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specmlx.training.shards import FeatureData

Batch = tuple[mx.array, ...]
# positions in the cache, their sequence's end, its first scored position, its segment id;
# each # (B, L)
Span = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
LossFn = Callable[..., tuple[mx.array, mx.array, mx.array]]  # batch -> loss, terms, accuracy
# batch -> each head's (or step's) logits over the draft vocabulary (K, ..., V_d), its labels
# in draft ids, -1 outside it (K, ...), and the positions that count (K, ...): scored, as in
# the top-1 accuracy
LogitsFn = Callable[..., tuple[mx.array, mx.array, mx.array]]
BatchFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], Batch]  # a Span -> batch


@dataclass(frozen=True)
class Objective:
    """How one kind of heads is trained. `settings` below is the run's TrainConfig (of
    `specmlx.training.train`, which imports the objectives)."""

    batches: Callable[[FeatureData, np.ndarray, Any], BatchFn]  # (data, t2d, settings)
    loss: Callable[[nn.Module, Any], LossFn]  # (heads, settings)
    # Positions that count in each accuracy: those with a token to guess, at or after the
    # first scored one. # (K,)
    labelled: Callable[[Batch], mx.array]
    shape: Callable[[Any], dict[str, int]]  # the HeadsConfig fields the settings give
    target_layer: bool = False  # the heads copy a target layer (HeadsConfig.target_args)
    feature_noise: bool = False  # it takes `feature_noise` (EAGLE trains on noised features)
    # (the target's config.json, the draft vocabulary's size) -> the config of a layer of
    # the heads' own (HeadsConfig.target_args; EAGLE-3's llama-style draft layer)
    draft_layer: Callable[[dict, int], dict] | None = None
    # target -> the layers whose features it reads when the settings name none (EAGLE-3:
    # low, middle, high); None: those the settings name (none: the final hidden state)
    feature_layers: Callable[[nn.Module], tuple[int, ...]] | None = None
    min_unroll: int = 1  # the fewest steps on its own outputs it trains with (`unroll`)
    # (heads, settings) -> the heads' logits on a batch, to fit their temperatures
    # (`specmlx.training.temperature`); None: this kind's are not fitted
    logits: Callable[[nn.Module, Any], LogitsFn] | None = None


def feature_rows(data: FeatureData, pos: np.ndarray) -> mx.array:
    """The cached features at `pos`, as float32. # (B, L, width)"""
    flat = data.features[mx.array(pos.reshape(-1))]
    return flat.reshape(*pos.shape, -1).astype(mx.float32)


def segment_mask(segments: np.ndarray) -> mx.array:
    """Causal attention inside each window that never crosses from one packed piece into
    another: position i sees j <= i of its own piece. # (B, L) -> (B, 1, L, L) bool"""
    length = segments.shape[-1]
    same = segments[:, :, None] == segments[:, None, :]
    causal = np.tril(np.ones((length, length), bool))
    return mx.array((same & causal)[:, None])


def host_math() -> bool:
    """Whether training takes its exponentials in NumPy (`cross_entropy`, and `softmax`
    in EAGLE-3's test steps): on MLX's CPU backend, whose elementwise exp runs about fifteen
    times slower than NumPy's on an x86 CPU (50M: 680 ms against 43), so that a step's
    cross-entropy and attention softmax cost more than its matmuls. Each such op syncs with
    the host; a step that has them is not compiled (`objectives.step_function`): NumPy
    cannot be traced, and compiling bought nothing there (an EAGLE-3 step of SmolLM2's
    recipe, MLX's math: 5.03 s compiled, 4.90 s not)."""
    return mx.default_device() == mx.cpu


def cross_entropy(logits: mx.array, labels: mx.array) -> mx.array:
    """Per position; labels -1 give garbage, masked by the caller. # (...)"""
    if host_math():
        return _host_cross_entropy(logits, labels)
    picked = mx.take_along_axis(logits, mx.maximum(labels, 0)[..., None], axis=-1)[..., 0]
    return mx.logsumexp(logits, axis=-1) - picked


@mx.custom_function
def _host_cross_entropy(logits: mx.array, labels: mx.array) -> mx.array:
    """`cross_entropy` computed in NumPy (float32), its gradient too (below). # (...)"""
    scores, _, picked = _host_scores(logits, labels)
    peak = scores.max(axis=-1, keepdims=True)
    total = np.exp(scores - peak).sum(axis=-1)
    return mx.array(peak[..., 0] + np.log(total) - picked)


@_host_cross_entropy.vjp
def _host_cross_entropy_vjp(
    primals: tuple[mx.array, mx.array], cotangent: mx.array, output: mx.array
) -> tuple[mx.array, mx.array]:
    """d loss / d logits = cotangent x (softmax(logits) - one_hot(label)), the softmax taken
    as exp(logits - logsumexp), the logsumexp being the output plus the picked logit."""
    logits, labels = primals
    scores, at, picked = _host_scores(logits, labels)
    weight = np.asarray(cotangent, dtype=np.float32)[..., None]
    lse = np.asarray(output, dtype=np.float32) + picked
    grad = np.exp(scores - lse[..., None])
    grad *= weight
    np.put_along_axis(grad, at, np.take_along_axis(grad, at, axis=-1) - weight, axis=-1)
    return mx.array(grad).astype(logits.dtype), mx.zeros_like(labels)


def softmax(scores: mx.array) -> mx.array:
    """Softmax over the last axis (float32), taken in NumPy where `host_math`. # (...)"""
    if host_math():
        return _host_softmax(scores)
    return mx.softmax(scores.astype(mx.float32), axis=-1)


@mx.custom_function
def _host_softmax(scores: mx.array) -> mx.array:
    values = np.asarray(scores.astype(mx.float32))
    probs = np.exp(values - values.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return mx.array(probs)


@_host_softmax.vjp
def _host_softmax_vjp(
    primals: tuple[mx.array], cotangent: mx.array, output: mx.array
) -> tuple[mx.array]:
    """d / d scores = probs x (cotangent - sum(cotangent x probs))."""
    probs = np.asarray(output)
    weight = np.asarray(cotangent, dtype=np.float32)
    grad = weight - (weight * probs).sum(axis=-1, keepdims=True)
    grad *= probs
    return (mx.array(grad).astype(primals[0].dtype),)


def _host_scores(logits: mx.array, labels: mx.array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The logits as float32 NumPy, each label's index into them (0 for -1) and the logit
    there. # (..., V), (..., 1), (...)"""
    scores = np.asarray(logits.astype(mx.float32))
    at = np.maximum(np.asarray(labels), 0)[..., None]
    return scores, at, np.take_along_axis(scores, at, axis=-1)[..., 0]


def soft_cross_entropy(logits: mx.array, target_logits: mx.array) -> mx.array:
    """Cross-entropy against the distribution `target_logits` give (no gradient through
    them). # (...)"""
    target_probs = mx.stop_gradient(mx.softmax(target_logits, axis=-1))
    return -(target_probs * nn.log_softmax(logits, axis=-1)).sum(-1)


def masked_mean(values: mx.array, mask: mx.array, axes: Any = None) -> mx.array:
    return (values * mask).sum(axes) / mx.maximum(mask.sum(axes), 1)
