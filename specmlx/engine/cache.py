"""A model, its cache, and exact rewind for every cache kind.

`Sequence` owns one model's cache and mirrors on the host the tokens the cache holds, so
the loop can keep a verified prefix and drop the rest after every step, and a chat can keep
the common prefix of two turns. Rewind is exact for each cache kind:

- KVCache, QuantizedKVCache: trim.
- RotatingKVCache (sliding-window layers): replaced at creation by a `SpecKVCache`, a
  plain KVCache that applies the same window through the attention mask. It keeps the
  whole history, so it can always be trimmed, where a rotating buffer past its window has
  overwritten what a rewind would need.
- Gated DeltaNet and Mamba-2 layers (ArraysCache of Qwen3.5 / Qwen3-Next, Mamba-2 and
  Nemotron-H-style hybrids; not Falcon-H1's CacheList): the verify call itself keeps their
  state after each position (`specmlx.engine.recurrent`); a rewind sets the state at the
  last kept token and runs nothing.
- Anything else that can't be trimmed (Mamba-1, Falcon-H1): checkpoint
  the state before the unverified tokens go in, and on rewind restore it and replay the
  tokens that were kept.

No recurrent layer can verify a token tree in one call: a tree on such a model is refused.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import (
    KVCache,
    RotatingKVCache,
    create_attention_mask,
    make_prompt_cache,
)

from specmlx.engine import device
from specmlx.engine.compiled import CompiledForward, compilable, compiled_forward
from specmlx.engine.features import FeatureSpec, capturing
from specmlx.engine.recurrent import Trace, recording, recurrent_layers
from specmlx.engine.tree import Tree, tree_call
from specmlx.errors import SpecmlxError

PREFILL_STEP = 512


class SpecKVCache(KVCache):
    """A KVCache that can take a token tree, and optionally attends to a sliding window.

    The window is applied through the mask, so the cache keeps its whole history and can
    always be trimmed; it gives the same attention as RotatingKVCache(max_size=window,
    keep=keep): each query sees the first `keep` tokens and the last `window - keep` up to
    itself. While `tree_mask` is set (by `specmlx.engine.tree.tree_call`, for one call), the new
    tokens attend to the prefix and to their ancestors only, at the positions of their depths.
    """

    def __init__(self, window: int | None = None, keep: int = 0):
        super().__init__()
        self.window = window
        self.keep = keep
        self.tree_mask: mx.array | None = None  # (n, n) ancestors among the new tokens
        self.tree_depths: mx.array | None = None  # (n,)

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array | str | None:
        window = window_size or (self.window - self.keep if self.window else None)
        if self.tree_mask is None and window is None:
            return create_attention_mask(N, self.offset, return_array, None)
        if self.tree_mask is None:
            mask = create_causal_mask(N, self.offset, window_size=window)
            query_pos = mx.arange(self.offset, self.offset + N)
        else:
            prefix = mx.ones((N, self.offset), dtype=mx.bool_)
            mask = mx.concatenate([prefix, self.tree_mask], axis=1)
            query_pos = self.offset + self.tree_depths
            if window is not None:
                key_pos = mx.concatenate([mx.arange(self.offset), query_pos])
                mask = mask & (query_pos[:, None] - key_pos[None] < window)
        if window is not None and self.keep:
            sinks = (mx.arange(self.offset + N) < self.keep)[None]
            mask = mask | (sinks & (mx.arange(self.offset + N)[None] <= query_pos[:, None]))
        return mask

    def compact(self, base: int, path: list[int]) -> None:
        """Move the entries of new tokens `path` (indices after `base`) to follow `base`."""
        if path == list(range(len(path))):
            return
        index = mx.array([base + i for i in path])
        end = base + len(path)
        self.keys[..., base:end, :] = self.keys[..., index, :]
        self.values[..., base:end, :] = self.values[..., index, :]


def make_cache(model: nn.Module) -> list[Any]:
    """The model's own cache, with plain and rotating KV layers as SpecKVCache."""
    caches = []
    for c in make_prompt_cache(model):
        if type(c) is KVCache:
            c = SpecKVCache()
        elif isinstance(c, RotatingKVCache):
            c = SpecKVCache(c.max_size, c.keep)
        caches.append(c)
    return caches


def takes_trees(model: nn.Module) -> bool:
    """Whether one call of the model can verify a token tree: every cache trims (no
    recurrent layer)."""
    return all(c.is_trimmable() for c in make_cache(model))


def calls_compiled() -> bool:
    """Whether `Sequence` compiles the calls of models that can be (`compile_calls`)."""
    if Sequence.compile_calls is not None:
        return Sequence.compile_calls
    return device.backend() == "cpu"


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Sequence:
    """One model with its cache, and the host-side record of what the cache holds.

    `tokens` are the confirmed tokens in the cache; `forward` may append unconfirmed ones
    (drafts under verification) whose values need not be known on the host yet; `settle`
    confirms a prefix of those and drops the rest. After `capture(spec)` every call also
    keeps the hidden states `spec` names, one row per confirmed token (`feature_rows`).
    """

    # False: rewind traced recurrent layers by replay too (`bench --overhead` compares both).
    trace_recurrent = True
    # Whether llama-shaped models' calls after the prefill run compiled
    # (`specmlx.engine.compiled`); None: on the CPU backend, where it was measured (on a GPU
    # they are called as mlx-lm builds them until a device run has measured both).
    compile_calls: bool | None = None

    def __init__(self, model: nn.Module, prefill_step: int = PREFILL_STEP):
        self.model = model
        self.prefill_step = prefill_step
        self.cache = make_cache(model)
        self.tokens: list[int] = []
        self.n_unconfirmed = 0
        self.trimmable = all(c.is_trimmable() for c in self.cache)
        # The recurrent mixers by cache index (rewound from their traces), None where
        # rewinding replays from a checkpoint.
        traced = not self.trimmable and self.trace_recurrent
        self.recurrent = recurrent_layers(model, self.cache) if traced else None
        self._checkpoint: list[Any] | None = None
        # Since the last settle: each recurrent layer's (conv window, state) before the
        # unconfirmed tokens, and each call's input count and traces.
        self._before: dict[int, tuple[mx.array, mx.array]] = {}
        self._traces: list[tuple[int, dict[int, Trace]]] = []
        self._busy = False  # a call that changes the cache is under way
        self.feature_spec: FeatureSpec | None = None
        self._features: list[mx.array] = []  # chunks of rows, one row per confirmed token
        self._pending: mx.array | None = None  # rows of the unconfirmed tokens
        self._compilable: tuple[Any, bool] | None = None  # (the model it was asked of, answer)

    @property
    def offset(self) -> int:
        return len(self.tokens) + self.n_unconfirmed

    def reset(self) -> None:
        self.cache = make_cache(self.model)
        self.tokens = []
        self.n_unconfirmed = 0
        self._checkpoint = None
        self._before, self._traces = {}, []
        self._busy = False
        self._features = []
        self._pending = None

    def capture(self, spec: FeatureSpec | None) -> None:
        """Keep the hidden states `spec` names from now on (None: keep none).

        Tokens already cached without them are dropped: the next `sync` computes them again.
        """
        if spec != self.feature_spec:
            self.feature_spec = spec
            self.reset()

    def feature_rows(self, start: int = 0) -> mx.array:
        """The kept hidden states of tokens[start:]. # (len(tokens) - start, width)"""
        assert self.feature_spec is not None, "capture() was not asked for"
        rows, n = [], len(self.tokens)
        for chunk in reversed(self._features):
            if n <= start:
                break
            rows.append(chunk[max(0, start - (n - chunk.shape[0])) :])
            n -= chunk.shape[0]
        if not rows:
            return mx.zeros((0, 0))
        return rows[0] if len(rows) == 1 else mx.concatenate(rows[::-1])

    def _call(self, inputs: mx.array, traced: bool = False) -> mx.array:
        """The model on `inputs` (n,) with the cache; the features go to `_pending`, and
        when `traced`, the recurrent layers' traces to `_traces`."""
        if traced:
            with recording(self.recurrent) as traces:
                logits = self._call(inputs)
            self._traces.append((inputs.shape[0], traces))
            return logits
        if self.feature_spec is None:
            return self.model(inputs[None], cache=self.cache)[0]
        with capturing(self.model, self.feature_spec) as seen:
            logits = self.model(inputs[None], cache=self.cache)[0]
        self._pending = seen.latest()[0]
        return logits

    def sync(self, context: list[int]) -> None:
        """Make the cache hold exactly context[:-1], reusing the common prefix.

        The last token of the context is left out: it is the input of the next call.
        """
        self._repair()
        wanted = context[:-1]
        keep = common_prefix(self.tokens, wanted)
        if keep < len(self.tokens):
            if self.trimmable:
                for c in self.cache:
                    c.trim(len(self.tokens) - keep)
                if self.feature_spec is not None and keep:
                    self._features = [self.feature_rows(0)[:keep]]
                elif self.feature_spec is not None:
                    self._features = []
                self.tokens = self.tokens[:keep]
            else:
                self.reset()
                keep = 0
        rest = wanted[keep:]
        self._busy = True
        for start in range(0, len(rest), self.prefill_step):
            chunk = rest[start : start + self.prefill_step]
            self._call(mx.array(chunk, mx.uint32))
            mx.eval([c.state for c in self.cache], [] if self._pending is None else self._pending)
            self.tokens.extend(chunk)
            if self._pending is not None:
                self._features.append(self._pending)
                self._pending = None
        self._busy = False
        if rest:
            mx.clear_cache()

    def _repair(self) -> None:
        """Drop whatever the cache holds beyond the confirmed tokens.

        Unconfirmed tokens, and the partial state of a call that Ctrl-C cut short, go.
        Trimmable caches know their own length; the others start over if anything is off.
        """
        if self.trimmable:
            for c in self.cache:
                extra = getattr(c, "offset", len(self.tokens)) - len(self.tokens)
                if extra > 0:
                    c.trim(extra)
            self.n_unconfirmed = 0
        elif self.n_unconfirmed or self._busy:
            self.reset()
        self._busy = False
        self._pending = None

    def forward(self, inputs: mx.array, tree: Tree | None = None) -> mx.array:
        """Logits for each input token, appended to the cache unconfirmed. # (n, vocab)

        With a tree, inputs[i] is node i of the tree (inputs[0] its root) and each node
        attends to the prefix and its ancestors only, at the position of its depth.
        """
        compiled = self._compiled()
        if compiled is not None:
            self.n_unconfirmed += inputs.shape[0]
            ancestors = depths = None
            if tree is not None:
                ancestors, depths = tree.ancestor_mask(), mx.array(tree.depths)
            logits, features = compiled(self.cache, inputs, ancestors, depths)
            self._pending = features
            return logits
        if tree is not None:
            return self._forward_tree(inputs, tree)
        traced = self.recurrent is not None
        if traced and self.n_unconfirmed == 0:
            self._before = {i: (self.cache[i][0], self.cache[i][1]) for i in self.recurrent}
            self._traces = []
        elif not self.trimmable and self.n_unconfirmed == 0:
            # Copy the containers (the arrays themselves are immutable) so the later
            # in-place updates of the cache lists do not reach the checkpoint.
            self._checkpoint = [tree_map(lambda x: x, c.state) for c in self.cache]
        self.n_unconfirmed += inputs.shape[0]
        return self._call(inputs, traced)

    def _compiled(self) -> CompiledForward | None:
        """The compiled call, where the model has one and the cache holds a token (the
        prefill, and a call on an empty cache, go as mlx-lm builds them)."""
        if not calls_compiled() or getattr(self.cache[0], "keys", None) is None:
            return None
        if self._compilable is None or self._compilable[0] is not self.model:
            # Asked again of a model put in place of the first (a test's counting wrapper).
            plain = all(type(c) is SpecKVCache and c.window is None for c in self.cache)
            self._compilable = (self.model, plain and compilable(self.model))
        if not self._compilable[1]:
            return None
        return compiled_forward(self.model, self.feature_spec)

    def _forward_tree(self, inputs: mx.array, tree: Tree) -> mx.array:
        if not self.trimmable:
            raise SpecmlxError(
                "this model has recurrent layers, which cannot verify a token tree in one "
                "call: draft chains (--method ngram, draft, mtp)"
            )
        with tree_call(self.model, self.cache, tree):
            return self.forward(inputs)

    def settle(self, kept: list[int], path: list[int] | None = None) -> None:
        """Confirm `kept` and drop the other unconfirmed tokens.

        `kept` are the first len(kept) unconfirmed tokens, or, after a tree call, the nodes
        `path` (indices among the unconfirmed tokens, in order).
        """
        assert len(kept) <= self.n_unconfirmed, "settling more tokens than were fed"
        if path is not None:
            for c in self.cache:
                c.compact(len(self.tokens), path)
        drop = self.n_unconfirmed - len(kept)
        if kept and self._pending is not None:
            rows = self._pending[mx.array(path)] if path is not None else self._pending[: len(kept)]
            self._features.append(rows)
        self._pending = None
        self.n_unconfirmed = 0
        if drop and self.trimmable:
            for c in self.cache:
                c.trim(drop)
        elif drop and self.recurrent is not None:
            self._rewind(len(kept), drop)
        elif drop:
            for c, state in zip(self.cache, self._checkpoint, strict=True):
                c.state = state
            if kept:
                self.model(mx.array(kept, mx.uint32)[None], cache=self.cache)
        self._checkpoint = None
        self._before, self._traces = {}, []
        self.tokens.extend(kept)

    def _rewind(self, n_kept: int, drop: int) -> None:
        """Trim the KV layers by `drop`; set each recurrent layer to its state after the
        first `n_kept` unconfirmed tokens, from the traces of the calls that fed them."""
        for i, c in enumerate(self.cache):
            if i not in self._before:
                c.trim(drop)
        if n_kept == 0:
            for i, (conv, state) in self._before.items():
                self.cache[i][0], self.cache[i][1] = conv, state
            return
        p, call = n_kept - 1, 0  # the last kept position, within the call that fed it
        while p >= self._traces[call][0]:
            p -= self._traces[call][0]
            call += 1
        n, traces = self._traces[call]
        for i, trace in traces.items():
            window = trace.conv_input.shape[1] - n
            self.cache[i][0] = mx.contiguous(trace.conv_input[:, p + 1 : p + 1 + window])
            self.cache[i][1] = trace.states[p]
