"""Prompt lookup: propose what followed the last earlier occurrence of the context's suffix.

No draft model. The longest suffix of the context (n from `max_n` down to `min_n`) that
occurred before is looked up, and the tokens that followed its most recent occurrence are
proposed. The index is updated incrementally: each new token registers the n-grams that
end just before it, mapped to where their continuation starts, so a lookup is a few dict
probes however long the document.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.step import Draft, DrafterTraits, StopRule, Verdict

if TYPE_CHECKING:
    from specmlx.engine.cache import Sequence


class NgramIndex:
    """Most recent continuation start of every n-gram (min_n <= n <= max_n) in a sequence."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._where: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            # The n-grams ending at the current last token now have a continuation: `token`.
            start = len(self.tokens)
            for n in range(self.min_n, min(self.max_n, start) + 1):
                self._where[tuple(self.tokens[start - n : start])] = start
            self.tokens.append(token)

    def lookup(self, k: int) -> list[int]:
        """Up to k tokens that followed the longest suffix seen before, most recent first."""
        end = len(self.tokens)
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            start = self._where.get(tuple(self.tokens[end - n :]))
            if start is not None:
                return self.tokens[start : start + k]
        return []


class NgramDrafter:
    """Drafts by prompt lookup over the prompt and everything generated."""

    # No evidence either way before the first lookup: the midpoint.
    traits = DrafterTraits("ngram", prior_acceptance=0.5, looks_up=True)

    def __init__(self, min_n: int = 1, max_n: int = 4):
        self.min_n, self.max_n = min_n, max_n
        self.index = NgramIndex(min_n, max_n)

    def prefill(self, context: list[int], target: Sequence) -> None:
        if self.index.tokens != context[: len(self.index.tokens)]:
            self.index = NgramIndex(self.min_n, self.max_n)
        self.index.extend(context[len(self.index.tokens) :])

    def propose(
        self, context: list[int], k: int, sampling: SamplingConfig, stop: StopRule | None = None
    ) -> Draft:
        self.index.extend(context[len(self.index.tokens) :])
        return Draft(mx.array(self.index.lookup(k), mx.uint32))

    def commit(self, verdict: Verdict) -> None:
        """Nothing to rewind: the index only ever holds the context."""
