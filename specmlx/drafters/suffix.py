"""Suffix decoding (Oliaro et al., NeurIPS 2025): drafts from what earlier text went on with.

No model. The longest suffix of the context that occurred before, in the prompt and what has
been generated (this drafter's own index) or in earlier answers of the same target (the
shared `SuffixStore`), is looked up; the tokens that followed each of its occurrences form a
tree whose nodes are scored by how many occurrences went that way (the fraction of them: the
product of each step's frequency). The best-scored nodes are proposed, at most `factor` times
the match's length (a long match earns a long draft) and `k` deep, dropping a branch that
fewer than `min_prob` of its parent's occurrences took. A share is believed as far as the
target went on as such proposals said before (`Trust`, by match length, kept with the
store): with the target's verify costs the proposal keeps as many nodes as
pay (`best_tree_size`, the believed scores as chances of acceptance), none where short
matches have not paid. A tree that is one path goes as a chain. Verification is the
loop's: lossless at any temperature.

With a `fallback` drafter (the draft model, or heads) the step drafts from the suffix where
its proposal expects at least `min_score` tokens kept, and from the fallback elsewhere
(SuffixDecoding's hybrid): one drafter to the loop, the fallback's traits for the policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import mlx.core as mx

from specmlx.drafters.eagle import best_tree_size
from specmlx.drafters.suffix_store import RECENT, SuffixIndex, SuffixStore, Trust
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.step import Draft, Drafter, DrafterTraits, StopRule, Verdict
from specmlx.engine.tree import shape_of

if TYPE_CHECKING:
    from specmlx.engine.cache import Sequence


@dataclass(frozen=True)
class _Candidate:
    """A suffix proposal made at context length `at` from a match `length` tokens long."""

    at: int
    length: int
    tokens: list[int]
    parents: list[int]
    shares: list[float]


class SuffixDrafter:
    """Drafts the most frequent continuations of the longest earlier match of the context."""

    # Prompt lookup's midpoint: a proposal comes only from text that occurred before.
    PRIOR_ACCEPTANCE = 0.5

    def __init__(
        self,
        store: SuffixStore | None,
        *,
        tree_size: int = 16,
        factor: float = 2.0,
        min_prob: float = 0.1,
        verify_cost: Callable[[int], float] | None = None,
        fallback: Drafter | None = None,
        min_score: float = 2.0,
        chains: bool = False,
    ):
        self.store = store
        self.tree_size, self.factor, self.min_prob = tree_size, factor, min_prob
        self.verify_cost = verify_cost
        self.fallback, self.min_score = fallback, min_score
        self.chains = chains  # only the best child of each node: a target that takes no trees
        self.trust = Trust() if store is None else store.trust
        self.local = SuffixIndex()
        self._doc = self.local.open()
        self._fallback_proposed = False
        # The last proposal before the verify costs cut it, for `trust` to learn from what
        # the target went on with, proposed or not (see `_learn`).
        self._candidate: _Candidate | None = None
        if fallback is None:
            self.traits = DrafterTraits("suffix", prior_acceptance=self.PRIOR_ACCEPTANCE)
        else:
            # The policy prices the fallback's steps; a suffix step is one of them that
            # drafted for free (`Draft.free`). Depth is the suffix's: the fallback is asked
            # for no more than it can draft, and its proposals are priced at their deepest.
            own = fallback.traits
            self.traits = replace(
                own,
                kind=f"suffix+{own.kind}",
                max_depth=None,
                proposal_cost=own.proposal(own.max_depth or 0),
                level_cost=0.0,
            )

    def prefill(self, context: list[int], target: Sequence) -> None:
        self._candidate = None  # a new request: what follows is not the candidate's to learn
        held = self.local.docs[self._doc]
        if held.tolist() != context[: len(held)]:
            self.local = SuffixIndex()  # another conversation: this request's index anew
            self._doc = self.local.open()
        self.local.extend(self._doc, context[len(self.local.docs[self._doc]) :])
        if self.fallback is not None:
            self.fallback.prefill(context, target)

    def propose(
        self, context: list[int], k: int, sampling: SamplingConfig, stop: StopRule | None = None
    ) -> Draft:
        self.local.extend(self._doc, context[len(self.local.docs[self._doc]) :])
        draft, expected = self.speculate(context, k)
        self._fallback_proposed = False
        if self.fallback is None or expected >= self.min_score:
            return draft
        self._fallback_proposed = True
        depth = self.fallback.traits.max_depth
        return self.fallback.propose(context, min(k, depth or k), sampling, stop)

    def commit(self, verdict: Verdict) -> None:
        """The indexes hold only the context; the fallback rewinds what it proposed."""
        if self._fallback_proposed:
            self.fallback.commit(verdict)

    def _learn(self, context: list[int]) -> None:
        """Teach `trust` how the last candidate fared against the tokens that came after
        it: each level whose parent came is one trial, won if one of its children came.
        This is its verdict where it was verified (a draft token is kept when it is what
        the target goes on with; at T > 0 a fixed token is kept with exactly the chance
        the target samples it), and what it would have been where it was not proposed, so
        a length priced out goes on learning for free."""
        candidate, self._candidate = self._candidate, None
        if candidate is None or len(context) <= candidate.at:
            return
        node = 0
        for token in context[candidate.at :]:
            offered, found = 0.0, None
            for i, (parent, share) in enumerate(
                zip(candidate.parents, candidate.shares, strict=True)
            ):
                if parent == node:
                    offered += share
                    if candidate.tokens[i] == token:
                        found = i + 1
            if offered == 0:
                return
            self.trust.observe(candidate.length, offered, found is not None)
            if found is None:
                return
            node = found

    def speculate(self, context: list[int], k: int) -> tuple[Draft, float]:
        """The suffix proposal for `context`, at most k deep, and the tokens it expects kept."""
        self._learn(context)
        empty = Draft(mx.array([], mx.uint32), free=True)
        sources = [(self.local, self.local.match(context))]
        if self.store is not None:
            sources.append((self.store.index, self.store.index.match(context)))
        found = [(index, m) for index, m in sources if m is not None]
        if not found or k < 1:
            return empty, 0.0
        longest = max(m.length for _, m in found)
        budget = min(self.tree_size - 1, math.ceil(self.factor * longest))
        depth = min(k, budget)
        paths = [
            index.continuation(serial, offset, depth)
            for index, m in found
            if m.length == longest
            for serial, offset in m.places
        ][:RECENT]
        tokens, parents, shares, scores = self._best_nodes(paths, budget, self.trust.q(longest))
        self._candidate = _Candidate(len(context), longest, tokens, parents, shares)
        if self.verify_cost is not None:
            n = best_tree_size(scores, self.verify_cost, 0.0)
            tokens, parents, scores = tokens[:n], parents[:n], scores[:n]
        if not tokens:
            return empty, 0.0
        draft = Draft(mx.array(tokens, mx.uint32), tree=shape_of(parents), free=True)
        return draft, sum(scores)

    def _best_nodes(
        self, paths: list[list[int]], budget: int, q: float
    ) -> tuple[list[int], list[int], list[float], list[float]]:
        """The trie of `paths` (count: the paths through a node), its best `budget` nodes by
        score (q^depth times the node's share of the paths), parents before children:
        tokens, parents (0 the root, i the i-th node kept), each node's share of its
        parent's paths, and the scores."""
        children: dict[tuple[int, int], int] = {}
        token_of, parent_of, count, depth = [0], [0], [len(paths)], [0]
        for path in paths:
            node = 0
            for token in path:
                child = children.get((node, token))
                if child is None:
                    child = children[(node, token)] = len(token_of)
                    token_of.append(token)
                    parent_of.append(node)
                    count.append(0)
                    depth.append(depth[node] + 1)
                count[child] += 1
                node = child
        score = [q ** depth[i] * count[i] / count[0] for i in range(len(token_of))]
        # A child never outscores its parent (q <= 1), and was made after it: parents first.
        order = sorted(range(1, len(token_of)), key=lambda i: (-score[i], i))
        kept: dict[int, int] = {0: 0}  # trie node -> its place in the proposal (root 0)
        tokens, parents, shares, scores = [], [], [], []
        for node in order:
            if len(tokens) == budget:
                break
            parent = parent_of[node]
            if parent not in kept or count[node] < self.min_prob * count[parent]:
                continue
            if self.chains and kept[parent] in parents:
                continue  # the parent has its best child already
            tokens.append(token_of[node])
            parents.append(kept[parent])
            shares.append(count[node] / count[parent])
            scores.append(score[node])
            kept[node] = len(tokens)
        return tokens, parents, shares, scores
