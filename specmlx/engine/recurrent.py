"""Recurrent layers that keep their state after every position of a call.

A Gated DeltaNet layer (Qwen3.5, Qwen3-Next: mlx-lm's `linear_attn`) holds, in its
ArraysCache, the last conv_kernel - 1 inputs of its causal convolution (entry 0) and the
recurrent state (entry 1). Both move forward with every token and cannot be trimmed. While
`recording` is on, each such layer's call also leaves behind what a rewind needs: the
convolution's whole input (the window after position p is rows p + 1 .. p + kernel - 1 of
it) and the recurrent state after each position (the recurrence is run one position at a
time, the same arithmetic mlx-lm's own loop does, with the projections still batched). A
rewind then picks the state at the last kept token and runs nothing.

The calls are matched to the layers by order: a forward pass runs each layer once, in order.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn


@dataclass
class Trace:
    """One layer's part of one call: the convolution's input (B, kernel - 1 + n, C) and the
    recurrent state after each of the call's n positions."""

    conv_input: mx.array
    states: list[mx.array]


def recurrent_layers(model: nn.Module, cache: list[Any]) -> list[int] | None:
    """The cache indices of the model's Gated DeltaNet layers, when they are all its
    untrimmable cache entries (None otherwise: another kind of recurrence, e.g. Mamba,
    which rewinds by replay)."""
    layers = getattr(model, "layers", None)
    if layers is None or len(layers) != len(cache):
        return None
    found = [
        i
        for i, layer in enumerate(layers)
        if getattr(layer, "is_linear", False) and _delta_net(layer) is not None
    ]
    untrimmable = [i for i, c in enumerate(cache) if not c.is_trimmable()]
    return found if found and found == untrimmable else None


def _delta_net(layer: nn.Module) -> nn.Module | None:
    module = getattr(layer, "linear_attn", None)
    if module is None or not hasattr(module, "conv1d"):
        return None
    if not hasattr(sys.modules[type(module).__module__], "gated_delta_update"):
        return None
    return module


class _Tap(nn.Module):
    """A module's stand-in that keeps each input it is called with."""

    def __init__(self, inner: nn.Module, sink: list[mx.array]):
        super().__init__()
        self.inner = inner
        self.sink = sink

    def __call__(self, x: mx.array) -> mx.array:
        self.sink.append(x)
        return self.inner(x)


def _stepwise(update: Callable[..., Any], sink: list[list[mx.array]]) -> Callable[..., Any]:
    """`gated_delta_update` one position at a time, keeping the state after each."""

    def step_by_step(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **kwargs):  # noqa: N803
        ys, states = [], []
        for t in range(q.shape[1]):
            one = slice(t, t + 1)
            y, state = update(
                q[:, one],
                k[:, one],
                v[:, one],
                a[:, one],
                b[:, one],
                A_log,
                dt_bias,
                state,
                None if mask is None else mask[:, one],
                **kwargs,
            )
            ys.append(y)
            states.append(state)
        sink.append(states)
        return mx.concatenate(ys, axis=1), state

    return step_by_step


@contextmanager
def recording(model: nn.Module, indices: list[int]) -> Iterator[dict[int, Trace]]:
    """Around one call of the model: the `Trace` of each of its Gated DeltaNet layers, by
    cache index, fills the dict yielded when the block ends."""
    modules = [_delta_net(model.layers[i]) for i in indices]
    convs: list[mx.array] = []
    states: list[list[mx.array]] = []
    namespaces = {id(ns): ns for ns in (sys.modules[type(m).__module__] for m in modules)}
    originals = {key: ns.gated_delta_update for key, ns in namespaces.items()}
    traces: dict[int, Trace] = {}
    for m in modules:
        m.conv1d = _Tap(m.conv1d, convs)
    for key, ns in namespaces.items():
        ns.gated_delta_update = _stepwise(originals[key], states)
    try:
        yield traces
    finally:
        for m in modules:
            m.conv1d = m.conv1d.inner
        for key, ns in namespaces.items():
            ns.gated_delta_update = originals[key]
    assert len(convs) == len(states) == len(indices), "one call runs each layer once"
    traces.update({i: Trace(c, s) for i, c, s in zip(indices, convs, states, strict=True)})
