"""The drafter protocol: propose, then learn what the target kept.

A drafter owns whatever state it needs (a draft model's cache, an n-gram index) and rewinds
it itself in `commit`. It never decodes on its own account: the loop asks for k tokens,
verifies them in one target call and reports how many survived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from specmlx.tree import Tree


@dataclass(frozen=True)
class Draft:
    """Proposed tokens: a chain, or a tree of candidates.

    `probs=None` marks a deterministic proposal (n-gram, lookahead): verification then
    treats each token as drawn from a one-hot distribution. A `tree` gives the parent of
    each token (node 0 is the last accepted token, token i is node i + 1); trees must be
    deterministic.
    """

    tokens: mx.array  # (k,) uint32
    probs: mx.array | None = None  # (k, vocab) warped draft distributions
    tree: Tree | None = None
    # The drafter's own probability of each token it drafted, where it computed them.
    confidences: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        assert self.tree is None or self.probs is None, "tree drafts are deterministic"

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


@dataclass(frozen=True)
class Verdict:
    """What the target made of a draft."""

    accepted: list[int]  # the accepted draft tokens, in order
    path: list[int] | None = None  # their tree nodes, for a tree draft
    target_tokens: list[int] | None = None  # the target's greedy token at each tree node

    @property
    def n_accepted(self) -> int:
        return len(self.accepted)


class Drafter(Protocol):
    """What the verify loop needs from a drafting strategy.

    Adaptive k also reads three optional attributes: `draft_model`, the model a drafter runs
    once per drafted token (its calls enter the cost model); `tree_size`, the most tokens a
    tree drafter's proposal puts in one target call; and `prior_acceptance`, how often its
    first drafted token is kept before there is any evidence (default
    `specmlx.adaptive.PRIOR_RATE`). It sets a fourth before each proposal, where a drafter
    has it: `goes_on`, a rule that takes the drafter's own probabilities of the tokens
    drafted so far and says whether to draft one more.
    """

    def prefill(self, context: list[int]) -> None:
        """Take in the context; its last token is the input of the next `propose`."""

    def propose(self, context: list[int], k: int) -> Draft:
        """Up to k tokens to follow `context` (which ends with the last accepted token)."""

    def commit(self, verdict: Verdict) -> None:
        """What the target kept of the last proposal; rewind whatever was not kept."""
