"""Medusa drafting: a tree of the heads' most probable continuations, verified in one call.

At each proposal the heads read the target's newest hidden state (the one from which the
target predicted the last token; the target kept it during the call that scored that token,
whether a speculative step or a plain one) and each head i scores the token i + 1 positions
past the last one. A path through the heads' top `width` tokens scores the product of its
tokens' probabilities under their heads; the tree is the `tree_size - 1` best paths of at
most min(k, K) tokens. Scores only shrink along a path, so the best paths form a tree: a
best-first search from the root finds them, parents before children.

Sized by costs, a tree's scores are first corrected by how far the target's tokens went along
earlier proposals' candidates, depth by depth (`specmlx.drafters.calibration`). The heads
are stateless, so there is nothing to rewind in `commit`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

import mlx.core as mx

from specmlx.drafters.calibration import DepthCalibration
from specmlx.drafters.eagle import best_tree_size
from specmlx.engine.features import FeatureSpec
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.step import Draft, DrafterTraits, StopRule, Verdict
from specmlx.engine.tree import Tree, TreeBuilder
from specmlx.errors import UsageError
from specmlx.heads.medusa import MedusaHeads

if TYPE_CHECKING:
    from specmlx.engine.cache import Sequence


class MedusaDrafter:
    """Token trees from Medusa heads: at most `tree_size` nodes (root included), built from
    each head's top `width` tokens. Given a `verify_cost` (target call cost by tokens, as
    `CostProfile.verify_cost`) and the heads' own cost in the same unit, `step_cost` plus
    `level_cost` per head run (a proposal k deep runs the first k), each proposal keeps the
    `best_tree_size` of its nodes. `chains`: each head's top token only, a
    chain a target with recurrent layers verifies (they score no trees)."""

    # Medusa (Cai et al. 2024) reports its first head's top-1 guess right ~60% of the time
    # and its top-5 ~80% on Vicuna-7B; the tree offers several first tokens, but heads
    # trained briefly on little data do worse: the policy starts from the top-1 rate.
    PRIOR_ACCEPTANCE = 0.6

    def __init__(
        self,
        heads: MedusaHeads,
        tree_size: int = 32,
        width: int = 8,
        verify_cost: Callable[[int], float] | None = None,
        step_cost: float = 0.0,
        chains: bool = False,
        level_cost: float = 0.0,
    ):
        if tree_size < 2 or width < 1:
            raise UsageError(
                f"a Medusa tree needs tree_size >= 2 and width >= 1, got {tree_size} and {width}"
            )
        self.heads = heads
        self.tree_size = tree_size
        # Given the target's verify costs, each proposal keeps only the nodes that pay for
        # their verification (`best_tree_size`, the paths' scores as acceptance estimates).
        self.verify_cost, self.step_cost, self.level_cost = verify_cost, step_cost, level_cost
        # The scores that size trees, corrected by how far the target went along them.
        self.calibration = DepthCalibration(heads.config.num_heads)
        self.chains = chains
        self.width = 1 if chains else min(width, heads.config.draft_vocab)
        self.traits = DrafterTraits(
            "medusa",
            tree_size=None if chains else tree_size,
            prior_acceptance=self.PRIOR_ACCEPTANCE,
            proposal_cost=step_cost,
            level_cost=level_cost,
            features=FeatureSpec(heads.config.feature_layers),
            max_depth=heads.config.num_heads,  # head i drafts the token i + 1 ahead
        )
        self._target: Sequence | None = None

    def prefill(self, context: list[int], target: Sequence) -> None:
        self._target = target  # its newest feature row is read at every proposal
        self.calibration.forget()  # a new response: the last one's open proposals are no guide

    def propose(
        self, context: list[int], k: int, sampling: SamplingConfig, stop: StopRule | None = None
    ) -> Draft:
        target = self._target
        assert target is not None, "propose before prefill"
        n_cached = len(target.tokens)
        assert n_cached == len(context) - 1, "the target must hold the context but its last token"
        if self.verify_cost is not None:
            self.calibration.observe(context)
        if n_cached == 0:
            return Draft(mx.array([], mx.uint32), tree=Tree(()))  # nothing to read: plain step
        newest = target.feature_rows(n_cached - 1)[0]  # (F,) it predicted context[-1]
        assert k <= self.heads.config.num_heads, "the loop caps k at traits.max_depth"
        ids, probs = self.heads.top_candidates(newest, self.width, k)  # (k, width)
        host = mx.concatenate([ids.astype(mx.float32), probs]).tolist()  # the one sync here
        builder, scores = self._best_paths(host[:k], host[k:])
        parents, tokens, n = builder.parents, builder.tokens, len(builder.tokens)
        if self.verify_cost is not None:
            self.calibration.remember(context, parents, tokens, scores)
            parents, tokens, scores = self.calibration.best_first(parents, tokens, scores)
            n = best_tree_size(scores, self.verify_cost, self.step_cost + self.level_cost * k)
        # Nodes come best first, parents before children: any prefix of them is a tree.
        tree = None if self.chains else Tree(tuple(parents[:n]))  # width 1: a chain
        return Draft(mx.array(tokens[:n], mx.uint32), tree=tree)

    def _best_paths(
        self, ids: list[list[float]], probs: list[list[float]]
    ) -> tuple[TreeBuilder, list[float]]:
        """The tree of the tree_size - 1 best paths through the heads' candidates.

        A path is a tuple of ranks, one per head from the first; its score is the product of
        the ranked tokens' probabilities (each capped at 1 against rounding, so a child never
        outscores its parent, and on a tie the shorter tuple, the parent, pops first). Also
        the nodes' scores, in the order they were added (non-increasing).
        """
        depth = len(ids)
        builder, scores = TreeBuilder(), []
        nodes: dict[tuple[int, ...], int] = {(): 0}
        frontier = [(-min(p, 1.0), (rank,)) for rank, p in enumerate(probs[0])]
        heapq.heapify(frontier)
        while frontier and len(builder.tokens) < self.tree_size - 1:
            neg_score, path = heapq.heappop(frontier)
            head = len(path) - 1
            nodes[path] = builder.add(nodes[path[:-1]], round(ids[head][path[-1]]))
            scores.append(-neg_score)
            if head + 1 < depth:
                for rank, p in enumerate(probs[head + 1]):
                    heapq.heappush(frontier, (neg_score * min(p, 1.0), (*path, rank)))
        return builder, scores

    def commit(self, verdict: Verdict) -> None:
        pass  # stateless: the next proposal reads the target's newest row, nothing to rewind
