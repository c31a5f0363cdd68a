"""A head's own KV cache, kept one position behind the target's.

EAGLE heads and MTP layers read, at position p, the target's hidden state h_p with the token
after it, x_{p+1}: their cache holds positions whose next token is confirmed, one behind the
target. `OneBehind` keeps that cache in step with the context: `prefill` feeds all but the
last position (whose output the next proposal needs), `_reuse` keeps what an earlier context
left as far as its tokens still hold, `_rewind` drops positions (a proposal's speculative
ones, or another context's), `_feed` runs the head over the positions the cache lacks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx

from specmlx.engine.cache import PREFILL_STEP, common_prefix

if TYPE_CHECKING:
    from specmlx.engine.cache import Sequence


class OneBehind:
    """The bookkeeping of a head fed (h_p, x_{p+1}): `head(rows, tokens, cache)` returns the
    head's output per position fed; `cache` is its cache list (one KV cache)."""

    head: Any
    cache: list[Any]
    target: Sequence | None
    # Positions p < n_consumed are in the cache, from confirmed tokens; position p read
    # tokens x_0..x_{p+1}, which `_context` keeps to tell when they still hold.
    n_consumed: int
    _context: list[int]

    def prefill(self, context: list[int], target: Sequence) -> None:
        """Feed every position but the last (whose output `propose` needs), in chunks.

        What an earlier response left in the cache is kept as far as its tokens match.
        """
        self.target = target
        self._reuse(context)
        end = len(context) - 2
        while self.n_consumed < end:
            self._feed(context, min(self.n_consumed + PREFILL_STEP, end))
            mx.eval(self.cache[0].state)

    def _reuse(self, context: list[int]) -> None:
        """Keep the positions whose tokens `context` still has, at most len(context) - 2 so
        that a proposal always feeds one (its output is the first prediction)."""
        held = len(self._context)
        same = held if context[:held] == self._context else common_prefix(self._context, context)
        self._rewind(max(0, min(self.n_consumed, same - 1, len(context) - 2)))

    def _rewind(self, keep: int) -> None:
        cache = self.cache[0]
        if cache.offset > keep:
            cache.trim(cache.offset - keep)  # speculative positions, or another context's
        self.n_consumed = keep
        self._context = self._context[: keep + 1]

    def _feed(self, context: list[int], end: int) -> mx.array:
        """Feed positions n_consumed..end-1: (h_p, token p+1). # (end - n_consumed, d)"""
        start = self.n_consumed
        rows = self.target.feature_rows(start)[: end - start]  # (end - start, F)
        tokens = mx.array(context[start + 1 : end + 1], mx.uint32)
        hidden = self.head(rows, tokens, self.cache)
        self.n_consumed = end
        self._context = context[: end + 1]
        return hidden
