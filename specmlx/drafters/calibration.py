"""Medusa's tree scores, corrected by depth against what the target went on to say.

A node's score is its guess at its chance of being accepted, and cost-sized trees
(`best_tree_size`) keep the nodes whose guesses pay for their verification. A Medusa path
scores the product of its heads' probabilities, each head guessing its own position from the
same hidden state, and heads trained on little data guess well where they were trained and
overconfidently elsewhere: the Qwen 1.5B target's heads, trained mostly on code, put 1.6×
more mass at their first depth in chat than the target's tokens then reached and 7× more at
the third, so chat paid for trees that lost. `DepthCalibration` learns, per depth, how much
of what the scores predicted the target's tokens reached, and scales the scores by it before
the tree is sized.

Its evidence is free: each proposal's candidates (all the drafter ranked, not only those it
kept) are remembered, and once the context has gone on far enough past them (through any
mix of speculative and plain steps) the depth the target's tokens reach through them is
read off the context. No model runs for it; at T > 0 the context's sampled tokens stand for
acceptance, which is what the sizing needs (the verification rule is untouched, so the
output stays exactly the target's whatever the scores). Sums fade per settled proposal, so the
correction follows the text (code, then prose) within a few dozen steps; a pseudo-count
keeps the heads' own scores until evidence comes.

EAGLE trees do without it: their scores chain the head's conditional probabilities, its
drafted tokens fed back, and on SmolLM2 the correction cut their trees on code and
extraction more than it saved in chat (docs/heads.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# Each settled proposal's weight fades by this much per proposal settled after it: about 20
# proposals of memory, a response's worth of speculative steps.
FADE = 0.95
# The evidence a correction starts from, as predicted mass that was kept in full: without
# evidence the scores stand as the heads give them.
PSEUDO_MASS = 0.5
# The context's last tokens a proposal keeps, to tell that a later context goes on from it
# (another request's context is no evidence).
TAIL = 8


@dataclass(frozen=True)
class _Proposal:
    position: int  # len(context) when proposed: its depth-1 nodes guess context[position]
    tail: tuple[int, ...]  # context[position - TAIL : position]
    parents: tuple[int, ...]  # TreeBuilder's: 0 the root, else an earlier node's index + 1
    tokens: tuple[int, ...]
    scores: tuple[float, ...]


def node_depths(parents: tuple[int, ...] | list[int]) -> list[int]:
    """Each node's depth (1 under the root), parents before children."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent == 0 else depths[parent - 1] + 1)
    return depths


class DepthCalibration:
    """Per-depth ratios of what the target's tokens reached to what the scores predicted.

    Before each proposal `observe(context)` settles earlier ones; `best_first(...)` orders a
    proposal's nodes by their scores scaled by their depths' ratios (what sizes the tree),
    and `remember(...)` keeps its raw scores for when the context has gone on past it.
    """

    def __init__(self, max_depth: int, fade: float = FADE, pseudo_mass: float = PSEUDO_MASS):
        self.max_depth = max_depth
        self.fade, self.pseudo_mass = fade, pseudo_mass
        self.predicted = [0.0] * max_depth  # faded sums of the scores at each depth
        self.reached = [0.0] * max_depth  # faded counts of proposals the target reached it in
        self._pending: deque[_Proposal] = deque()

    @property
    def pending(self) -> int:
        """Proposals remembered and not yet settled."""
        return len(self._pending)

    def ratios(self) -> list[float]:
        """Reached over predicted, by depth (1.0 before any evidence)."""
        return [
            (reached + self.pseudo_mass) / (predicted + self.pseudo_mass)
            for predicted, reached in zip(self.predicted, self.reached, strict=True)
        ]

    def scaled(self, parents: list[int], scores: list[float]) -> list[float]:
        """`scores` (one per node, parents first) scaled by their depths' ratios, at most 1
        and at most the parent's: a node is never likelier than the path to it."""
        ratios = self.ratios()
        out: list[float] = []
        for parent, depth, score in zip(parents, node_depths(parents), scores, strict=True):
            value = min(score * ratios[min(depth, self.max_depth) - 1], 1.0)
            out.append(value if parent == 0 else min(value, out[parent - 1]))
        return out

    def best_first(
        self, parents: list[int], tokens: list[int], scores: list[float]
    ) -> tuple[list[int], list[int], list[float]]:
        """The nodes reordered by their scaled scores, best first, as (parents, tokens,
        scores) in TreeBuilder's numbering: any prefix is a tree, as `best_tree_size` needs.
        Scaling cuts deep levels more than shallow ones where the heads overreach, so the
        heads' own order no longer ranks the nodes. A stable sort keeps a parent before its
        children: a child's scaled score is at most its parent's, and on a tie the parent
        came first."""
        values = self.scaled(parents, scores)
        order = sorted(range(len(values)), key=lambda i: -values[i])
        renumbered = {0: 0} | {old + 1: new + 1 for new, old in enumerate(order)}
        return (
            [renumbered[parents[i]] for i in order],
            [tokens[i] for i in order],
            [values[i] for i in order],
        )

    def remember(
        self, context: list[int], parents: list[int], tokens: list[int], scores: list[float]
    ) -> None:
        """Keep a proposal's candidates and raw scores, proposed after `context`."""
        position = len(context)
        self._pending.append(
            _Proposal(
                position,
                tuple(context[max(0, position - TAIL) :]),
                tuple(parents),
                tuple(tokens),
                tuple(scores),
            )
        )

    def forget(self) -> None:
        """Drop the unsettled proposals: a new response starts (in a chat, the next turn's
        context goes on past the last answer with template tokens the heads never guessed)."""
        self._pending.clear()

    def observe(self, context: list[int]) -> None:
        """Learn from every remembered proposal the context now settles: the target's tokens
        either left its tree or went on to its deepest level. Proposals of another context
        are forgotten."""
        while self._pending:
            proposal = self._pending[0]
            start = proposal.position
            if tuple(context[max(0, start - len(proposal.tail)) : start]) != proposal.tail:
                self._pending.popleft()  # another request: no evidence
                continue
            depth, settled = self._reach(proposal, context[start : start + self.max_depth])
            if not settled:
                return  # later proposals settle later still
            self._pending.popleft()
            self._learn(proposal, depth)

    def _reach(self, proposal: _Proposal, following: list[int]) -> tuple[int, bool]:
        """How deep `following` goes through the proposal's tree, and whether that is final
        (it left the tree, or nothing deeper was guessed)."""
        children: dict[tuple[int, int], int] = {}
        for index, (parent, token) in enumerate(
            zip(proposal.parents, proposal.tokens, strict=True)
        ):
            children.setdefault((parent, token), index + 1)
        node, depth = 0, 0
        for token in following:
            child = children.get((node, token))
            if child is None:
                return depth, True
            node, depth = child, depth + 1
        deeper = any(parent == node for parent in proposal.parents)
        return depth, not deeper or depth >= self.max_depth

    def _learn(self, proposal: _Proposal, depth: int) -> None:
        self.predicted = [value * self.fade for value in self.predicted]
        self.reached = [value * self.fade for value in self.reached]
        for level, score in zip(node_depths(proposal.parents), proposal.scores, strict=True):
            if level <= self.max_depth:
                self.predicted[level - 1] += score
        for level in range(min(depth, self.max_depth)):
            self.reached[level] += 1.0
