"""Lookahead decoding (Fu et al. 2024): Jacobi iteration fills an n-gram pool, no draft model.

The drafter keeps a window of W columns and N-1 levels of guessed tokens. Column i is the
sequence [last, L0_1 .. L0_i, L1_i .. L{N-2}_i]; the target's prediction after its last
level is the next guess for that column (one Jacobi iteration), and each column's levels
plus that prediction form an N-gram, pooled under its first token. Up to G pooled
(N-1)-grams that start after the last token are the candidates to verify.

Both branches go to the target in ONE call as a token tree (`specmlx.engine.tree`): the lookahead
columns are paths of the tree, the candidates are paths too, and the tree mask keeps them
apart. Any path the target agrees with is accepted, a lookahead column included.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import TYPE_CHECKING

import mlx.core as mx

from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.step import Draft, DrafterTraits, StopRule, Verdict
from specmlx.engine.tree import TreeBuilder

if TYPE_CHECKING:
    from specmlx.engine.cache import Sequence


class LookaheadDrafter:
    """Lookahead decoding with window W, n-gram size N and at most G candidates."""

    # Its pool starts empty and its first Jacobi guesses are random context tokens, so its
    # first proposals are seldom kept: the policy starts from a low prior, and where its tree
    # costs more than a plain call it starts plain and probes rather than paying tree steps
    # to learn that.
    PRIOR_ACCEPTANCE = 0.3

    def __init__(self, window: int = 5, ngram: int = 4, guesses: int = 5, seed: int = 0):
        if window < 1 or ngram < 2 or guesses < 0:
            raise ValueError("lookahead needs W >= 1, N >= 2, G >= 0")
        self.window, self.ngram, self.guesses = window, ngram, guesses
        self._random = random.Random(seed)
        self.levels: list[list[int]] = []  # (N-1) x W guessed tokens; levels[0][0] = last
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self._last_level_nodes: list[int] = []
        # Its Jacobi iteration reads the target's greedy token at every column's last level.
        self.traits = DrafterTraits(
            "lookahead",
            tree_size=self.tree_size,
            prior_acceptance=self.PRIOR_ACCEPTANCE,
            reads_target_tokens=True,
        )

    @property
    def tree_size(self) -> int:
        """Most tokens one target call scores: root, window, and the candidates."""
        return (
            1 + (self.window - 1) + self.window * (self.ngram - 2) + self.guesses * (self.ngram - 1)
        )

    def prefill(self, context: list[int], target: Sequence) -> None:
        # Start the Jacobi window from tokens of the context, as llama.cpp does.
        self.levels = [
            [self._random.choice(context) for _ in range(self.window)]
            for _ in range(self.ngram - 1)
        ]

    def propose(
        self, context: list[int], k: int, sampling: SamplingConfig, stop: StopRule | None = None
    ) -> Draft:
        last = context[-1]
        self.levels[0][0] = last
        builder = TreeBuilder()
        for candidate in reversed(self.pool.get(last, {})):
            builder.add_path(list(candidate[:k]))
        # The level-0 guesses form one chain; column i branches off it after L0_i.
        level0_nodes = [0]
        for i in range(1, self.window):
            level0_nodes.append(builder.add(level0_nodes[-1], self.levels[0][i]))
        self._last_level_nodes = [
            builder.add_path([level[i] for level in self.levels[1:]], level0_nodes[i])[-1]
            if self.ngram > 2
            else level0_nodes[i]
            for i in range(self.window)
        ]
        return Draft(mx.array(builder.tokens, mx.uint32), tree=builder.tree())

    def commit(self, verdict: Verdict) -> None:
        outputs = [verdict.target_tokens[node] for node in self._last_level_nodes]
        for i, output in enumerate(outputs):
            gram = (*(level[i] for level in self.levels), output)
            grams = self.pool.setdefault(gram[0], OrderedDict())
            grams.pop(gram[1:], None)
            grams[gram[1:]] = None  # most recent last
            while len(grams) > self.guesses:
                grams.popitem(last=False)
        self.levels = [*self.levels[1:], outputs]
