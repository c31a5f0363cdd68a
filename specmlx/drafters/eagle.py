"""EAGLE-2 drafting (Li et al. 2024): a dynamic token tree grown by an EAGLE head.

The head has its own KV cache over draft positions j, each fed (embedding of token j+1,
f_j) with f_j the target's real hidden state. A proposal first feeds the positions the
cache lacks: the tokens of the last accepted path, and any the loop decoded plainly in
between (the drafter is not told of those, the target's feature rows cover them). The last
position's output predicts the token after `last`: the root's children.

Then the tree grows level by level. Each level's frontier (the `width` nodes of highest
cumulative draft probability among the children of the last level) goes into the head in
ONE call, every node at the position of its depth and attending to the prefix and its
ancestors, which sit in the cache from earlier levels. After `depth` levels (never deeper
than the k the loop asks for) all generated nodes are reranked by cumulative probability
and the best tree_size - 1 kept: a node never scores above its parent, so a kept node's
ancestors are kept too. EAGLE-2 observes that this draft confidence approximates the
chance a node is accepted, which also lets `best_tree_size` size the tree from costs.

The whole tree is built lazily: the one host sync of a proposal reads every candidate at
the end (tokens, scores, parents in one transfer). The tree's entries in the draft cache
are dropped in `commit`: the next proposal feeds the accepted tokens again, with the
target's real features instead of the predicted ones, as EAGLE does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import mlx.core as mx

from specmlx.drafters.behind import OneBehind
from specmlx.engine.features import FeatureSpec
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.step import Draft, DrafterTraits, StopRule, Verdict
from specmlx.engine.tree import TreeBuilder
from specmlx.errors import UsageError
from specmlx.heads.base import HeadsConfig

if TYPE_CHECKING:
    from specmlx.engine.cache import Sequence as TargetSequence


class FeatureHead(Protocol):
    """What the drafter needs of a head: `specmlx.heads.eagle.EagleHead`, or `Eagle3Head`."""

    config: HeadsConfig

    @property
    def d2t(self) -> mx.array | None: ...  # (V_d,) target ids of the draft vocabulary

    def __call__(
        self,
        features: mx.array,
        tokens: mx.array,
        cache: list[Any] | None = None,
        positions: mx.array | None = None,
        mask: mx.array | None = None,
    ) -> mx.array: ...  # (n, F), (n,) -> (n, d): predicted next features

    def logits(self, hidden: mx.array) -> mx.array: ...  # (n, d) -> (n, V_d)

    def make_cache(self) -> list[Any]: ...


def best_tree_size(
    cum_probs_sorted: Sequence[float], verify_cost: Callable[[int], float], step_cost: float
) -> int:
    """How many of the best nodes to verify: n maximizing tokens per unit of time,

        (1 + sum of the first n cumulative probabilities) / (verify_cost(n + 1) + step_cost)

    The sum is the expected number of accepted drafts when each node's cumulative draft
    probability is its chance of acceptance (EAGLE-2's observation), the 1 the target's own
    token; verify_cost(m) prices a target call over m tokens (root included) and step_cost
    the drafting, in the same unit. The smallest best n wins ties; 0: drafting does not pay.

    cum_probs_sorted # (N,) non-increasing, as the drafter ranks its nodes
    """
    best_n, best_rate, tokens = 0, 1.0 / (verify_cost(1) + step_cost), 1.0
    for n, prob in enumerate(cum_probs_sorted, start=1):
        tokens += prob
        rate = tokens / (verify_cost(n + 1) + step_cost)
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n


class EagleDrafter(OneBehind):
    """EAGLE-2 dynamic trees from one EAGLE head.

    tree_size: most nodes a proposal holds, root included. depth: most levels (tokens on a
    path). width: frontier nodes expanded per level, and children drawn from each. Given a
    `verify_cost` (target call cost by tokens, as `CostProfile.verify_cost`) and the
    drafting's own cost, `step_cost` plus `level_cost` per level grown (the head runs once a
    level), each proposal keeps the `best_tree_size` of its nodes, tree_size - 1 at most.
    `chains`: width 1, a chain a target with recurrent layers verifies (they score no trees). The defaults are smaller than EAGLE-2's (60 nodes, width 10) on
    datacenter GPUs: on a Mac a target call's cost rises sooner with the tokens it scores.
    """

    # EAGLE (Li et al. 2024) reports a trained head's first drafted token accepted ~0.8 of
    # the time on chains; a tree's first level does better, a head trained briefly on our
    # own data worse: the policy starts between the midpoint and that.
    PRIOR_ACCEPTANCE = 0.7

    def __init__(
        self,
        head: FeatureHead,
        tree_size: int = 32,
        depth: int = 6,
        width: int = 8,
        verify_cost: Callable[[int], float] | None = None,
        step_cost: float = 0.0,
        chains: bool = False,
        level_cost: float = 0.0,
    ):
        if tree_size < 2 or depth < 1 or width < 1:
            raise UsageError("EAGLE trees need tree_size >= 2, depth >= 1 and width >= 1")
        self.head = head
        self.tree_size, self.depth = tree_size, depth
        # Children per node, distinct tokens; one makes every proposal a chain.
        self.chains = chains
        self.width = 1 if chains else min(width, head.config.draft_vocab)
        self.verify_cost, self.step_cost, self.level_cost = verify_cost, step_cost, level_cost
        self.cache = head.make_cache()
        self.target: TargetSequence | None = None
        # Draft positions j < n_consumed are in the cache, all from confirmed tokens; position
        # j read tokens x_0..x_{j+1}, which `_context` keeps to tell when they still hold.
        self.n_consumed = 0
        self._context: list[int] = []
        # It runs no model per drafted token: its levels are its proposal's cost.
        self.traits = DrafterTraits(
            "eagle",
            tree_size=None if chains else tree_size,
            prior_acceptance=self.PRIOR_ACCEPTANCE,
            proposal_cost=step_cost,
            level_cost=level_cost,
            features=FeatureSpec(head.config.feature_layers),
            max_depth=depth,  # the tree's levels
        )

    def propose(
        self, context: list[int], k: int, sampling: SamplingConfig, stop: StopRule | None = None
    ) -> Draft:
        """A tree of at most tree_size nodes, k levels deep. One host sync."""
        assert self.target is not None, "propose before prefill"
        assert len(self.target.tokens) == len(context) - 1, "the target must hold context[:-1]"
        if len(context) < 2:
            return Draft(mx.array([], mx.uint32))  # no hidden state yet: a plain step
        self._reuse(context)
        root = self._feed(context, len(context) - 1)[-1:]  # predicts the token after `last`
        assert k <= self.depth, "the loop caps k at traits.max_depth"
        ids, scores, parents = self._grow(root, k)
        host = mx.concatenate(
            [self._target_ids(ids).astype(mx.float32), scores, parents.astype(mx.float32)]
        ).tolist()  # the proposal's one sync; token ids below 2**24 are exact in float32
        n = len(host) // 3
        tokens, cum_scores, parent_of = host[:n], host[n : 2 * n], host[2 * n :]
        # Best first; a tie puts the parent (earlier) first, so a kept node's parent is kept.
        order = sorted(range(n), key=lambda i: (-cum_scores[i], i))[: self.tree_size - 1]
        if self.verify_cost is not None:
            probs = [math.exp(cum_scores[i]) for i in order]
            spent = self.traits.proposal(k)
            order = order[: best_tree_size(probs, self.verify_cost, spent)]
        builder, node_of = TreeBuilder(), {-1: 0}
        for i in order:
            node_of[i] = builder.add(node_of[int(parent_of[i])], int(tokens[i]))
        tree = None if self.chains else builder.tree()  # width 1: a chain
        return Draft(mx.array(builder.tokens, mx.uint32), tree=tree)

    def commit(self, verdict: Verdict) -> None:
        """Drop the tree from the cache: the accepted tokens come back with real features."""
        self._rewind(self.n_consumed)

    # -- the tree --------------------------------------------------------------------------

    def _grow(self, root: mx.array, levels: int) -> tuple[mx.array, mx.array, mx.array]:
        """Every candidate node, lazily: its draft-vocab id, its log cumulative probability,
        and its parent (the index of an earlier candidate, -1 for the root).

        root # (1, d) the predicted feature after `last`
        """
        w = self.width
        ids, scores = _top(self._log_probs(root), w)  # (1, w): level 1, all of it the frontier
        ids, scores = ids[0], scores[0]
        all_ids, all_scores, all_parents = [ids], [scores], [mx.full((w,), -1, mx.int32)]
        frontier = mx.arange(w, dtype=mx.int32)  # the frontier's candidate indices
        hidden = mx.broadcast_to(root, (w, root.shape[-1]))  # its parents' outputs
        # The frontier's ancestors among the tree entries already in the cache.
        ancestors = mx.zeros((w, 0), mx.bool_)  # (w, w * (level - 1))
        prefix, n_candidates = self.cache[0].offset, w
        for level in range(1, levels):
            own = mx.eye(w, dtype=mx.bool_)
            mask = mx.concatenate([mx.ones((w, prefix), mx.bool_), ancestors, own], axis=1)
            # The frontier is at depth `level`: draft position prefix + level - 1.
            positions = mx.full((w,), prefix + level - 1, mx.int32)
            hidden = self.head(hidden, self._target_ids(ids), self.cache, positions, mask)
            child_ids, child_lp = _top(self._log_probs(hidden, level), w)  # (w, w)
            child_scores = (scores[:, None] + child_lp).reshape(-1)  # (w * w,)
            all_ids.append(child_ids.reshape(-1))
            all_scores.append(child_scores)
            all_parents.append(mx.repeat(frontier, w))
            # The next frontier: the best w children; `src` their parents in this level.
            pick = mx.argpartition(-child_scores, w - 1)[:w].astype(mx.int32)
            src = pick // w
            frontier = n_candidates + pick
            n_candidates += w * w
            ids, scores = child_ids.reshape(-1)[pick], child_scores[pick]
            hidden = hidden[src]
            ancestors = mx.concatenate([ancestors, own], axis=1)[src]
        return mx.concatenate(all_ids), mx.concatenate(all_scores), mx.concatenate(all_parents)

    def _log_probs(self, hidden: mx.array, level: int = 0) -> mx.array:
        """Draft log probabilities at the level's temperature (level 0: the first drafted
        token), never above 0: a child never outscores its parent. # (n, V_d)"""
        logits = self.head.logits(hidden).astype(mx.float32)
        if self.head.config.temperatures:
            logits = logits * (1 / self.head.config.temperature(level))
        return mx.minimum(logits - mx.logsumexp(logits, axis=-1, keepdims=True), 0.0)

    def _target_ids(self, ids: mx.array) -> mx.array:
        d2t = self.head.d2t
        return ids if d2t is None else d2t[ids]


def _top(log_probs: mx.array, w: int) -> tuple[mx.array, mx.array]:
    """The w best entries of each row, in no particular order: ids and values. # (n, w)"""
    ids = mx.argpartition(-log_probs, w - 1, axis=-1)[..., :w]
    return ids, mx.take_along_axis(log_probs, ids, axis=-1)
