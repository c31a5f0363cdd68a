"""The drafter protocol: say what you are, propose, then learn what the target kept.

A drafter owns whatever state it needs (a draft model's cache, an n-gram index) and rewinds
it itself in `commit`. It never decodes on its own account: the loop asks for up to k
tokens, verifies them in one target call and reports what survived. What the policy needs
to know about a drafter (does it run a model, does it propose trees, does it report its
confidence) it declares in `traits`; nobody probes it with hasattr.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx

from specmlx.engine.features import FeatureSpec
from specmlx.engine.tree import Tree

if TYPE_CHECKING:
    from specmlx.engine.cache import Sequence

# Given the drafter's own probabilities of the tokens drafted so far: draft one more?
StopRule = Callable[[tuple[float, ...]], bool]


@dataclass(frozen=True)
class DrafterTraits:
    """What a drafting strategy is, as the policy prices it."""

    kind: str  # the name its measured costs are kept under ("draft", "ngram", ...)
    uses_model: bool = False  # runs a model once per drafted token: each costs c
    tree_size: int | None = None  # a tree drafter: tokens every proposal puts in one call
    # The chance its first drafted token is kept, before any evidence.
    prior_acceptance: float = 0.5
    # Its drafts carry `confidences` and it honours a stop rule passed to `propose`.
    reports_confidence: bool = False
    # The target's hidden states it drafts from (heads): the target keeps them for it.
    features: FeatureSpec | None = None


@dataclass(frozen=True)
class Draft:
    """Proposed tokens: a chain, or a tree of candidates.

    `probs=None` marks a deterministic proposal (n-gram, lookahead): verification then
    treats each token as drawn from a one-hot distribution. A `tree` gives the parent of
    each token (node 0 is the last accepted token, token i is node i + 1); trees must be
    deterministic.
    """

    tokens: mx.array  # (n,) uint32
    probs: mx.array | None = None  # (n, vocab) warped draft distributions
    tree: Tree | None = None
    # The drafter's own probability of each token it drafted, where it reports them.
    confidences: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        assert self.tree is None or self.probs is None, "tree drafts are deterministic"

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    @property
    def depth(self) -> int:
        """The longest path it offers: its length, or its tree's depth."""
        return self.size if self.tree is None else max(self.tree.depths)


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
    """What the verify loop needs from a drafting strategy."""

    traits: DrafterTraits

    def prefill(self, context: list[int], target: Sequence) -> None:
        """Take in the context; its last token is the input of the next `propose`.

        `target` holds context[:-1]; a drafter with `traits.features` reads the target's
        hidden states there (`target.feature_rows`), now and at every later proposal. No
        drafter calls the target.
        """

    def propose(self, context: list[int], k: int, stop: StopRule | None = None) -> Draft:
        """Up to k tokens to follow `context` (which ends with the last accepted token).

        A drafter that reports confidence ends the draft after a token where `stop` says
        not to go on (that token is still proposed: its call is spent already).
        """

    def commit(self, verdict: Verdict) -> None:
        """What the target kept of the last proposal; rewind whatever was not kept."""
