"""Adaptive speculation: pick each step's draft length from measured costs and acceptance.

Before each step the policy chooses the draft length k that maximizes expected tokens per
unit of time,

    E(k) / cost(k),   E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i,   cost(k) = k*c + v(n(k)),

where a_i is the running (exponentially decaying) rate at which draft position i is accepted
given that the positions before it were, c the cost of one draft-model call and v(n) the cost
of an n-token target call, both in one-token target calls (`specmlx.costs.CostProfile`), and
n(k) the tokens the target scores: k + 1 for a chain, the tree's size for a tree drafter.
Plain decoding is k = 0 with E = cost = 1. When no k beats it, the policy decodes plainly and
probes with a speculative step now and then, so it comes back when acceptance recovers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specmlx.costs import CostProfile

# The start: speculate until the data says otherwise, and let no single rejection decide.
PRIOR_RATE = 0.7
PRIOR_WEIGHT = 4.0


@dataclass
class AcceptanceTracker:
    """Decaying counts of how often draft position i was reached and accepted."""

    decay: float = 0.97  # an effective memory of about 30 steps
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def age(self) -> None:
        """One step passed: older evidence weighs less."""
        self.reached = [r * self.decay for r in self.reached]
        self.accepted = [a * self.decay for a in self.accepted]

    def observe(self, depth: int, n_accepted: int) -> None:
        """One step that offered `depth` positions and kept the first `n_accepted`."""
        self.age()
        while len(self.reached) < depth:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        # Position i (0-based) was reached when all before it were accepted.
        for i in range(min(depth, n_accepted + 1)):
            self.reached[i] += 1
            self.accepted[i] += i < n_accepted

    def rate(self, position: int) -> float:
        """Acceptance rate of `position` given the ones before it were accepted.

        Deep positions are reached rarely; their estimate leans on the rate pooled over all
        positions, which leans on an optimistic prior while there is no data at all.
        """
        pooled = (sum(self.accepted) + PRIOR_RATE * PRIOR_WEIGHT) / (
            sum(self.reached) + PRIOR_WEIGHT
        )
        if position >= len(self.reached):
            return pooled
        return (self.accepted[position] + pooled * PRIOR_WEIGHT) / (
            self.reached[position] + PRIOR_WEIGHT
        )

    def expected_tokens(self, k: int) -> float:
        """Tokens a k-token draft yields on average, the target's own token included."""
        total, survive = 1.0, 1.0
        for position in range(k):
            survive *= self.rate(position)
            total += survive
        return total


@dataclass
class AdaptiveK:
    """Chooses k per step; k = 0 means a plain step (speculation predicted to lose)."""

    profile: CostProfile
    uses_draft_model: bool
    max_k: int = 16
    probe_every: int = 16  # plain steps between probes; doubles while probes keep losing
    max_probe_every: int = 256
    tracker: AcceptanceTracker = field(default_factory=AcceptanceTracker)
    tree_size: int | None = None  # tokens a tree drafter's proposals cost, once seen
    steps_since_probe: int = 0
    plain_steps: int = 0

    def predicted(self, k: int) -> float:
        """Predicted tokens per one-token-call time of drafting k tokens (1.0 for k = 0)."""
        if k == 0:
            return 1.0
        c = self.profile.c if self.uses_draft_model else 0.0
        n_tokens = self.tree_size if self.tree_size is not None else k + 1
        return self.tracker.expected_tokens(k) / (k * c + self.profile.verify_cost(n_tokens))

    def p_min(self) -> float:
        """Draft confidence below which one more draft token is predicted not to pay.

        A draft token costs one draft call and one more verified token, and saves about one
        target call when it is accepted; the draft's own probability stands in for the
        chance it is accepted.
        """
        if not self.uses_draft_model:
            return 0.0
        marginal_verify = (self.profile.verify_cost(17) - 1.0) / 16
        return min(0.9, self.profile.c + max(marginal_verify, 0.0))

    def best_k(self) -> int:
        """The k in 0..max_k with the best prediction."""
        return max(range(self.max_k + 1), key=self.predicted)

    def __post_init__(self) -> None:
        self._probe_interval = self.probe_every

    def choose(self) -> int:
        best = self.best_k()
        if best > 0:
            self.steps_since_probe = 0
            self._probe_interval = self.probe_every
            return best
        self.steps_since_probe += 1
        if self.steps_since_probe >= self._probe_interval:
            # A probe: one short speculative step keeps the acceptance estimate fresh. While
            # probes keep finding speculation a loss they come ever less often, so their
            # cost fades; the first probe that wins resets the interval.
            self.steps_since_probe = 0
            self._probe_interval = min(2 * self._probe_interval, self.max_probe_every)
            return max(range(1, min(4, self.max_k) + 1), key=self.predicted)
        self.plain_steps += 1
        self.tracker.age()  # evidence fades with time, not only with drafts
        return 0

    def observe(self, depth: int, n_accepted: int, n_drafted: int, is_tree: bool) -> None:
        if depth == 0:
            return
        self.tracker.observe(depth, n_accepted)
        if is_tree:
            self.tree_size = n_drafted + 1
