"""The target's hidden states, taken from its own forward pass.

Heads (Medusa, EAGLE) draft from the target's features: the final hidden state (the output
of the last norm, which the LM head turns into logits) or, for EAGLE-3, the outputs of a few
decoder layers. `capturing` records them during a call the loop makes anyway: it swaps taps
in place of the modules whose outputs are wanted, for the duration of one `with` block, so
the logits are those of the plain call and the model is left as it was. Every model family
mlx-lm builds as `model.model.{layers, norm}` (llama, qwen2, gemma3, ...) is covered.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specmlx.errors import SpecmlxError


@dataclass(frozen=True)
class FeatureSpec:
    """Which hidden states a drafter reads: the final one (`layers=()`), or the outputs of
    the named decoder layers (0-based), concatenated in that order."""

    layers: tuple[int, ...] = ()

    def width(self, hidden_size: int) -> int:
        return hidden_size * max(1, len(self.layers))


class _Tap(nn.Module):
    """Calls the module it wraps and keeps its output."""

    def __init__(self, inner: nn.Module, store: list[mx.array]):
        super().__init__()
        self.inner = inner
        self.store = store

    def __getattr__(self, key: str) -> Any:
        # The model may read its layer's attributes (llama: `use_sliding`): the inner's.
        try:
            return super().__getattr__(key)
        except AttributeError:
            inner = self.get("inner")
            if inner is None:
                raise
            return getattr(inner, key)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        self.store.append(out)
        return out


def backbone(model: nn.Module) -> nn.Module:
    """The decoder stack (`model.model`): embed_tokens, layers, norm."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "norm"):
        raise SpecmlxError(
            f"heads need a decoder with layers and a final norm; {type(model).__name__} has none"
        )
    return inner


class Capture:
    """What the taps saw inside one `capturing` block."""

    def __init__(self, n_taps: int):
        self.taps: list[list[mx.array]] = [[] for _ in range(n_taps)]

    def latest(self) -> mx.array:
        """The features of the newest call, taps joined on the last axis. # (batch, n, width)"""
        parts = [outputs[-1] for outputs in self.taps]
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)


@contextmanager
def capturing(model: nn.Module, spec: FeatureSpec) -> Iterator[Capture]:
    """Within the block, every call of `model` records its features in the yielded Capture.

    On exit, also by an exception, the model holds its own modules again.
    """
    inner = backbone(model)
    n_layers = len(inner.layers)
    if any(not 0 <= i < n_layers for i in spec.layers):
        raise SpecmlxError(f"feature layers {spec.layers} out of range: the target has {n_layers}")
    capture = Capture(max(1, len(spec.layers)))
    norm = inner.norm
    layers = list(inner.layers)
    try:
        if not spec.layers:
            inner.norm = _Tap(norm, capture.taps[0])
        for tap, i in enumerate(spec.layers):
            inner.layers[i] = _Tap(layers[i], capture.taps[tap])
        yield capture
    finally:
        inner.norm = norm
        for i, layer in enumerate(layers):
            inner.layers[i] = layer
