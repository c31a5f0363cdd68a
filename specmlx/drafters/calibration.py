"""Medusa's tree scores, corrected by depth against what the target went on to say.

A node's score is its guess at its chance of being accepted, and cost-sized trees
(`best_tree_size`) keep the nodes whose guesses pay for their verification. A Medusa path
scores the product of its heads' probabilities, each head guessing its own position from the
same hidden state, and heads trained on little data guess well where they were trained and
overconfidently elsewhere: the Qwen 1.5B target's heads, trained mostly on code, put 1.6×
more mass on their first token in chat than the target then kept and 6× more at the third,
so chat paid for trees that lost. `DepthCalibration` learns, per depth, how much of what
the scores predicted the target's tokens reached, and scales the scores by it before the
tree is sized.

Its evidence is free: each proposal's candidates (all the drafter ranked, not only those it
kept) are remembered, and once the context has gone on far enough past them (through any
mix of speculative and plain steps) the depth the target's tokens reach through them is
read off the context. No model runs for it; at T > 0 the context's sampled tokens stand for
acceptance, which is what the sizing needs (the verification rule is untouched, so the
output stays exactly the target's whatever the scores). Sums fade per proposal, so the
correction follows the text (code, then prose) within a few dozen steps; a pseudo-count
keeps the heads' own scores until evidence comes.

EAGLE trees do without it: their scores chain the head's conditional probabilities, its
drafted tokens fed back, and on SmolLM2 the correction cut their trees on code and
extraction more than it saved in chat (docs/heads.md).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# Each resolved proposal's weight fades by this much per later one: about 20 proposals of
# memory, a response's worth of steps.
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

    `observe(context)` before each proposal resolves earlier ones; `calibrated(...)` returns
    a proposal's scores scaled by its depths' ratios and remembers the proposal.
    """

    def __init__(self, max_depth: int, fade: float = FADE, pseudo_mass: float = PSEUDO_MASS):
        self.max_depth = max_depth
        self.fade, self.pseudo_mass = fade, pseudo_mass
        self.predicted = [0.0] * max_depth  # faded sums of the scores at each depth
        self.reached = [0.0] * max_depth  # faded counts of proposals the target reached it in
        self._pending: deque[_Proposal] = deque()

    def ratios(self) -> list[float]:
        """Reached over predicted, by depth (1.0 before any evidence)."""
        return [
            (reached + self.pseudo_mass) / (predicted + self.pseudo_mass)
            for predicted, reached in zip(self.predicted, self.reached, strict=True)
        ]

    def calibrated(
        self, context: list[int], parents: list[int], tokens: list[int], scores: list[float]
    ) -> list[float]:
        """`scores` (one per node, parents first) scaled by their depths' ratios, at most 1
        and at most the parent's: a node is never likelier than the path to it."""
        depths = node_depths(parents)
        ratios = self.ratios()
        out: list[float] = []
        for parent, depth, score in zip(parents, depths, scores, strict=True):
            value = min(score * ratios[min(depth, self.max_depth) - 1], 1.0)
            out.append(value if parent == 0 else min(value, out[parent - 1]))
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
        return out

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
            nxt = children.get((node, token))
            if nxt is None:
                return depth, True
            node, depth = nxt, depth + 1
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
