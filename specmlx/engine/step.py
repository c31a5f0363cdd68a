"""The step contract: what the loop, a drafter and a policy say to each other in one step.

Before a step the policy hands the loop a `Plan` (how many tokens to ask for, and a stop rule
for drafters that report confidence). The loop caps the plan's k once (`draft_length`) and
asks the drafter to `propose(context, k, sampling, stop)`: a `Draft`, a chain or a tree. The
target scores it in one call; the drafter learns what was kept from a `Verdict` and rewinds
its own state in `commit`. The loop then yields one `Step`, which the policy observes and the
caller receives: there is no other record of a step.

A drafter stores no sampler: the sampling comes with every proposal, so a request with
another temperature reuses the loaded drafter and its cache. What the policy needs to know
about a drafter (does it run a model, does it propose trees, does it report its confidence,
how deep can it draft) it declares in `DrafterTraits`; nobody probes it with hasattr.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx

from specmlx.engine.features import FeatureSpec
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.tree import Tree

if TYPE_CHECKING:
    from specmlx.engine.cache import Sequence


# Given the drafter's own probabilities of the tokens drafted so far: draft one more? The
# token where it says no is still proposed (its call is spent).
StopRule = Callable[[tuple[float, ...]], bool]


@dataclass(frozen=True)
class Plan:
    """What the policy asks of the next step."""

    k: int  # tokens to ask the drafter for (the loop caps it); 0: a plain step
    stop: StopRule | None = None  # ends a draft early (drafters that report confidence)
    time_draft: bool = False  # time the drafter's calls apart from the verify call
    # With k = 0: plain steps in a row the policy commits to, which the loop double-buffers
    # as plain decoding does (the next call queued before the host reads the current one).
    run: int = 1


@dataclass(frozen=True)
class DrafterTraits:
    """What a drafting strategy is, as the policy prices it and the loop caps it."""

    kind: str  # the name its measured costs are kept under ("draft", "ngram", ...)
    uses_model: bool = False  # runs a model once per drafted token: each costs c
    # c as the drafter measured it, where its model is no draft model the calibration times
    # (MTP: a layer of the target's own): one drafted token over a one-token target call.
    token_cost: float | None = None
    tree_size: int | None = None  # a tree drafter: tokens every proposal puts in one call
    # The chance its first drafted token is kept, before any evidence.
    prior_acceptance: float = 0.5
    # What one proposal costs, in one-token target calls, besides its verification (heads'
    # trees, measured at load): `proposal_cost` whatever its depth, plus `level_cost` per
    # level it grows (an EAGLE tree runs its head once a level; Medusa's heads run all at
    # once); 0: next to nothing, or priced per token (c). A proposal that costs something is
    # a speculative step even when it comes back empty.
    proposal_cost: float = 0.0
    level_cost: float = 0.0
    # Its drafts carry `confidences` and it honours a stop rule passed to `propose`.
    reports_confidence: bool = False
    # The target's hidden states it drafts from (heads): the target keeps them for it.
    features: FeatureSpec | None = None
    # The longest path it can propose (heads: their count; an EAGLE tree: its levels);
    # None: as long as asked.
    max_depth: int | None = None
    # It learns from the target's greedy token at every tree node (`Verdict.target_tokens`).
    reads_target_tokens: bool = False
    # Its proposal is a lookup in the context, free and with no state to rewind (prompt
    # lookup): where it keeps finding nothing, the loop decodes a plain stretch and asks
    # again after every token (`decode.WATCH_AFTER`).
    looks_up: bool = False

    @property
    def pays_per_proposal(self) -> bool:
        """Its proposals cost something however little of them is offered."""
        return self.proposal_cost > 0 or self.level_cost > 0

    def proposal(self, levels: int) -> float:
        """One proposal `levels` deep, in one-token target calls."""
        return self.proposal_cost + self.level_cost * levels


def draft_length(k: int, room: int, traits: DrafterTraits) -> int:
    """THE cap on a step's draft: the plan's k, never past max_tokens (a step emits at most
    k + 1 tokens, so `room` is the tokens left minus the target's own) and never deeper than
    the drafter can draft. The loop accepts at most this many tokens on any path (a tree
    may hold deeper nodes for its drafter's own use, as Lookahead's columns)."""
    depth = traits.max_depth if traits.max_depth is not None else k
    return max(0, min(k, room, depth))


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
    # Drafted without a model call (a suffix match): no draft cost to learn from its step.
    free: bool = False

    def __post_init__(self) -> None:
        assert self.tree is None or self.probs is None, "tree drafts are deterministic"

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    @property
    def depth(self) -> int:
        """The longest path it offers: its length, or its tree's depth."""
        return self.size if self.tree is None else max(self.tree.depths, default=0)


@dataclass(frozen=True)
class Verdict:
    """What the target made of a draft."""

    accepted: list[int]  # the accepted draft tokens, in order
    path: list[int] | None = None  # their tree nodes, for a tree draft
    # The target's greedy token at each tree node, for a drafter whose traits ask for them
    # (Lookahead's Jacobi iteration); None otherwise.
    target_tokens: list[int] | None = None

    @property
    def n_accepted(self) -> int:
        return len(self.accepted)


@dataclass(frozen=True)
class Step:
    """What one target call did: the one record of a step, which the policy observes and
    the caller receives."""

    tokens: tuple[int, ...]  # accepted drafts, then the target's own token (stop-truncated)
    k: int  # the draft length the policy planned (before the loop's cap); 0: a plain step
    n_drafted: int  # tokens the target verified besides the last one (tree nodes too)
    draft_depth: int  # the longest path the draft offered
    n_accepted: int
    seconds: float  # wall time of the step, measured after its sync
    finish: str | None  # "stop" (a stop token), "length" (max_tokens), or None
    # The proposal's own time, where it was timed apart from the verify call (tree drafts
    # read their tree back anyway; chains when the plan asks).
    draft_seconds: float | None = None
    requested: int = 0  # tokens asked of the drafter after the cap; 0: nothing asked
    confidences: tuple[float, ...] | None = None  # the drafter's, where it reports them
    tree: bool = False
    free: bool = False  # the draft came without a model call (`Draft.free`)

    @property
    def plain(self) -> bool:
        """Nothing was verified besides the last token."""
        return self.n_drafted == 0

    @property
    def proposed(self) -> bool:
        """The drafter was asked for a draft (which may have come back empty)."""
        return self.requested > 0


class Drafter(Protocol):
    """What the verify loop needs from a drafting strategy."""

    traits: DrafterTraits

    def prefill(self, context: list[int], target: Sequence) -> None:
        """Take in the context; its last token is the input of the next `propose`.

        `target` holds context[:-1]; a drafter with `traits.features` reads the target's
        hidden states there (`target.feature_rows`), now and at every later proposal. No
        drafter calls the target.
        """

    def propose(
        self, context: list[int], k: int, sampling: SamplingConfig, stop: StopRule | None = None
    ) -> Draft:
        """Up to k tokens to follow `context` (which ends with the last accepted token): the
        loop has capped k already, and accepts at most k on any path of a tree.

        A drafter with a model draws its tokens as `sampling` says, and reports the warped
        distributions they were drawn from. A drafter that reports confidence ends the draft
        after a token where `stop` says not to go on.
        """

    def commit(self, verdict: Verdict) -> None:
        """What the target kept of the last proposal; rewind whatever was not kept."""
