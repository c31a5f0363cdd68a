"""A target call as one compiled graph, for llama-shaped models.

Calling an mlx-lm model builds its graph op by op in Python (about 4 ms a call for
SmolLM2-135M's 30 layers on this CPU) and runs it op by op. `CompiledForward` traces the whole
call once per (tokens, cache capacity) with `mx.compile` and replays it: the cache's KV
buffers go in and come out (the new tokens written at the cache's offset, given as an array),
attention runs over the whole buffer with a mask (the prefix, then the new tokens' own causal
or tree mask), and each token is rotated at its position (offset + depth for a tree node).
Replaying still costs about 3 ms, and the CPU backend fuses the elementwise ops; end to end,
SmolLM2-135M decodes about 7% faster (docs/how-it-works.md#compiled-calls).

Only models whose mlx-lm module wires its layers as llama does (llama, qwen2: embed, then per
layer x + attn(norm(x)), h + mlp(norm(h)), a final norm, the LM head or tied embeddings), with
plain KV caches and no sliding window, are compiled; everything else calls the model as it is.
`Sequence` uses it for every call after the prefill: the cache it leaves is the same KVCache.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specmlx.engine.features import FeatureSpec
from specmlx.engine.tree import PositionedRoPE

# A buffer grows by this many positions (mlx-lm's KVCache step): a call's graph is traced
# once per capacity, so a capacity lasts 256 tokens.
STEP = 256
# mlx-lm modules whose models wire their layers as llama does.
LLAMA_SHAPED = frozenset({"mlx_lm.models.llama", "mlx_lm.models.qwen2"})


def compilable(model: nn.Module) -> bool:
    """Whether `model` is llama-shaped, with every layer attending to the whole context."""
    if not isinstance(model, nn.Module) or type(model).__module__ not in LLAMA_SHAPED:
        return False
    inner = getattr(model, "model", None)
    if inner is None or getattr(inner, "pipeline_size", 1) != 1:
        return False
    for layer in getattr(inner, "layers", []):
        attn = getattr(layer, "self_attn", None)
        if getattr(layer, "use_sliding", False) or attn is None:
            return False
        if not all(hasattr(attn, name) for name in ("n_heads", "n_kv_heads", "scale", "rope")):
            return False
    return True


class CompiledForward:
    """One llama-shaped model's calls, compiled: `logits, features = self(cache, inputs,
    ancestors, depths)`. `cache` is the model's list of KVCaches, holding at least one token;
    `features` are the hidden states `spec` names (None: none kept)."""

    def __init__(self, model: nn.Module, spec: FeatureSpec | None):
        # Weakly: a shared instance must not keep its model alive (`compiled_forward`).
        self._model = weakref.ref(model)
        self.spec = spec
        self._call: Callable[..., list[mx.array]] = mx.compile(self._graph)

    def _graph(
        self, tokens: mx.array, offset: mx.array, ancestors: mx.array, depths: mx.array, *kv: Any
    ) -> list[mx.array]:
        """tokens (n,), offset (), ancestors (n, n) bool, depths (n,), then each layer's keys
        and values buffers (1, kv_heads, capacity, dim) -> logits (n, vocab), features (n, W)
        (or a placeholder), then each layer's buffers with the tokens written at offset."""
        model = self._model()
        inner = model.model
        n, capacity = tokens.shape[0], kv[0].shape[2]
        relative = mx.arange(capacity) - offset
        own = mx.take(ancestors, mx.clip(relative, 0, n - 1), axis=1) & (relative < n)
        mask = ((relative < 0)[None] | (own & (relative >= 0)[None]))[None, None]
        start = offset.reshape(1)
        h = inner.embed_tokens(tokens[None])
        kept: dict[int, mx.array] = {}
        buffers = []
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            queries = attn.q_proj(x).reshape(1, n, attn.n_heads, -1).transpose(0, 2, 1, 3)
            keys = attn.k_proj(x).reshape(1, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            values = attn.v_proj(x).reshape(1, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            rope = PositionedRoPE(attn.rope, depths)  # token i at offset + depths[i]
            queries, keys = rope(queries, offset=offset), rope(keys, offset=offset)
            all_keys = mx.slice_update(kv[2 * i], keys.astype(kv[2 * i].dtype), start, (2,))
            all_values = mx.slice_update(
                kv[2 * i + 1], values.astype(kv[2 * i + 1].dtype), start, (2,)
            )
            buffers += [all_keys, all_values]
            out = mx.fast.scaled_dot_product_attention(
                queries, all_keys, all_values, scale=attn.scale, mask=mask
            )
            h = h + attn.o_proj(out.transpose(0, 2, 1, 3).reshape(1, n, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            if self.spec is not None and i in self.spec.layers:
                kept[i] = h
        normed = inner.norm(h)
        if getattr(model.args, "tie_word_embeddings", False):
            logits = inner.embed_tokens.as_linear(normed)
        else:
            logits = model.lm_head(normed)
        features = mx.zeros((1,))
        if self.spec is not None and not self.spec.layers:
            features = normed[0]
        elif kept:
            ordered = [kept[i] for i in self.spec.layers]
            features = (ordered[0] if len(ordered) == 1 else mx.concatenate(ordered, -1))[0]
        return [logits[0], features, *buffers]

    def __call__(
        self,
        cache: list[Any],
        inputs: mx.array,
        ancestors: mx.array | None = None,
        depths: mx.array | None = None,
    ) -> tuple[mx.array, mx.array | None]:
        """Logits for `inputs` (n,) after what `cache` holds, and their features; the cache
        then holds them too (its offset moved by n). Without `ancestors` the inputs are a
        chain (each attends to those before it) at depths 0..n-1."""
        n = inputs.shape[0]
        offset = cache[0].offset
        for c in cache:
            _make_room(c, offset + n)
        if ancestors is None:
            ancestors = mx.tril(mx.ones((n, n), dtype=mx.bool_))
            depths = mx.arange(n)
        kv = [a for c in cache for a in (c.keys, c.values)]
        out = self._call(
            inputs, mx.array(offset, mx.int32), ancestors, depths.astype(mx.int32), *kv
        )
        for i, c in enumerate(cache):
            c.keys, c.values = out[2 + 2 * i], out[3 + 2 * i]
            c.offset += n
        return out[0], out[1] if self.spec is not None else None


# One CompiledForward per (model, features kept), shared by the model's sequences (a session
# reset, the bench's next row): its traces outlive them. Keyed by id(model) and dropped with it.
_SHARED: dict[tuple[int, FeatureSpec | None], CompiledForward] = {}


def compiled_forward(model: nn.Module, spec: FeatureSpec | None) -> CompiledForward:
    key = (id(model), spec)
    found = _SHARED.get(key)
    if found is None or found._model() is not model:
        found = _SHARED[key] = CompiledForward(model, spec)
        weakref.finalize(model, _SHARED.pop, key, None)
    return found


def _make_room(cache: Any, needed: int) -> None:
    """Grow the cache's buffers to a multiple of STEP positions that holds `needed`."""
    capacity = cache.keys.shape[2]
    if needed <= capacity:
        return
    grown = -(-needed // STEP) * STEP
    kept = cache.offset

    def extend(buffer: mx.array) -> mx.array:
        batch, heads, _, dim = buffer.shape
        room = mx.zeros((batch, heads, grown - kept, dim), buffer.dtype)
        return mx.concatenate([buffer[..., :kept, :], room], axis=2)

    cache.keys, cache.values = extend(cache.keys), extend(cache.values)
