"""The drafter protocol: propose, then learn what the target kept.

A drafter owns whatever state it needs (a draft model's cache, an n-gram index) and rewinds
it itself in `commit`. It never decodes on its own account: the loop asks for k tokens,
verifies them in one target call and reports how many survived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx


@dataclass(frozen=True)
class Draft:
    """Proposed tokens, and the distributions they were drawn from when there are any.

    `probs=None` marks a deterministic proposal (n-gram, lookahead): verification then
    treats each token as drawn from a one-hot distribution.
    """

    tokens: mx.array  # (k,) uint32
    probs: mx.array | None = None  # (k, vocab) warped draft distributions

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


class Drafter(Protocol):
    """What the verify loop needs from a drafting strategy."""

    def prefill(self, context: list[int]) -> None:
        """Take in the context; its last token is the input of the next `propose`."""

    def propose(self, context: list[int], k: int) -> Draft:
        """Up to k tokens to follow `context` (which ends with the last accepted token)."""

    def commit(self, n_accepted: int, accepted: list[int]) -> None:
        """The target kept the first `n_accepted` proposed tokens, whose ids are `accepted`."""
