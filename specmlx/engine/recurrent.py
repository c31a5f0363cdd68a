"""Recurrent layers that keep their state after every position of a call.

Two kinds of layer hold, in a two-entry ArraysCache, the last conv_kernel - 1 inputs of a
causal convolution (entry 0) and a recurrent state (entry 1), both moving forward with every
token and impossible to trim: Gated DeltaNet (Qwen3.5, Qwen3-Next: mlx-lm's `linear_attn`,
stepped by `gated_delta_update`) and Mamba-2 SSM mixers (Mamba-2, Nemotron-H, Granite 4
hybrids, PLaMo 2: a `mixer` or `mamba` module, stepped by `ssm_update`). A layer whose cache
entry is anything else (Falcon-H1's list of an SSM and an attention cache) rewinds by
replay. While `recording` is on, each such layer's call also leaves behind what a rewind
needs: the convolution's whole input (the window after position p is rows
p + 1 .. p + kernel - 1 of it) and the recurrent state after each position (the recurrence
is run one position at a time, the same arithmetic mlx-lm's own code does for one token,
with the projections still batched). A rewind then picks the state at the last kept token
and runs nothing.

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
from mlx_lm.models.cache import ArraysCache

from specmlx.errors import SpecmlxError


@dataclass
class Trace:
    """One layer's part of one call: the convolution's input (B, kernel - 1 + n, C) and the
    recurrent state after each of the call's n positions."""

    conv_input: mx.array
    states: list[mx.array]


# Each kind of recurrent layer: the attributes its decoder layer keeps the mixer under, and
# the function of the mixer's module that runs its recurrence.
KINDS = ((("linear_attn",), "gated_delta_update"), (("mixer", "mamba"), "ssm_update"))


@dataclass(frozen=True)
class Mixer:
    """A recurrent layer's mixer, and the name of the function its module steps it with."""

    module: nn.Module
    update: str  # "gated_delta_update" or "ssm_update"


def recurrent_layers(model: nn.Module, cache: list[Any]) -> dict[int, Mixer] | None:
    """The model's recurrent mixers by cache index, when they are all its untrimmable
    cache entries (None otherwise: another kind of recurrence, e.g. Mamba-1, which rewinds
    by replay). Layers without a cache entry (Nemotron-H's MLP blocks) are skipped: the
    mixers and the untrimmable entries pair up in order."""
    layers = getattr(model, "layers", None)
    if layers is None:
        return None
    mixers = [(i, m) for i, layer in enumerate(layers) if (m := _mixer(layer)) is not None]
    untrimmable = [i for i, c in enumerate(cache) if not c.is_trimmable()]
    if not mixers or len(mixers) != len(untrimmable):
        return None
    if not all(isinstance(cache[i], ArraysCache) and len(cache[i].cache) == 2 for i in untrimmable):
        return None  # not (conv window, state) alone
    if len(layers) == len(cache) and [i for i, _ in mixers] != untrimmable:
        return None
    return {c: m for c, (_, m) in zip(untrimmable, mixers, strict=True)}


def _mixer(layer: nn.Module) -> Mixer | None:
    for attributes, update in KINDS:
        for attribute in attributes:
            module = getattr(layer, attribute, None)
            if (
                module is not None
                and hasattr(module, "conv1d")
                and hasattr(sys.modules[type(module).__module__], update)
            ):
                return Mixer(module, update)
    return None


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


def _stepwise_ssm(update: Callable[..., Any], sink: list[list[mx.array]]) -> Callable[..., Any]:
    """`ssm_update` one position at a time, keeping the state after each."""

    def step_by_step(
        x,
        A_log,  # noqa: N803
        B,  # noqa: N803
        C,  # noqa: N803
        D,  # noqa: N803
        dt,
        dt_bias,
        state=None,
        time_step_limit=None,
        mask=None,
        lengths=None,
    ):
        if lengths is not None:
            raise SpecmlxError("a traced SSM call runs one sequence, without padded lengths")
        limit = {} if time_step_limit is None else {"time_step_limit": time_step_limit}
        ys, states = [], []
        for t in range(x.shape[1]):
            one = slice(t, t + 1)
            y, state = update(
                x[:, one],
                A_log,
                B[:, one],
                C[:, one],
                D,
                dt[:, one],
                dt_bias,
                state,
                mask=None if mask is None else mask[..., one],
                **limit,
            )
            ys.append(y)
            states.append(state)
        sink.append(states)
        return mx.concatenate(ys, axis=1), state

    return step_by_step


STEPWISE = {"gated_delta_update": _stepwise, "ssm_update": _stepwise_ssm}


@contextmanager
def recording(layers: dict[int, Mixer]) -> Iterator[dict[int, Trace]]:
    """Around one call of the model: the `Trace` of each of its recurrent mixers (`layers`,
    by cache index), filled into the dict yielded when the block ends."""
    convs: list[mx.array] = []
    states: list[list[mx.array]] = []
    patched: dict[int, tuple[Any, str, Callable[..., Any]]] = {}
    for mixer in layers.values():
        ns = sys.modules[type(mixer.module).__module__]
        patched.setdefault(id(ns), (ns, mixer.update, getattr(ns, mixer.update)))
    traces: dict[int, Trace] = {}
    for mixer in layers.values():
        mixer.module.conv1d = _Tap(mixer.module.conv1d, convs)
    for ns, update, original in patched.values():
        setattr(ns, update, STEPWISE[update](original, states))
    try:
        yield traces
    finally:
        for mixer in layers.values():
            mixer.module.conv1d = mixer.module.conv1d.inner
        for ns, update, original in patched.values():
            setattr(ns, update, original)
    assert len(convs) == len(states) == len(layers), "one call runs each layer once"
    traces.update({i: Trace(c, s) for i, c, s in zip(layers, convs, states, strict=True)})
