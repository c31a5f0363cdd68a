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

The calibrated costs are only a model of a step. Whatever a real step costs beyond it
(host syncs, sampling, the draft catching up, kernels a GPU builds for a new shape) is
measured as it happens: each step's wall time, in one-token target calls, minus what the
model predicted for it, is kept as a decaying mean per kind of step (plain, speculative)
and added to that kind's cost.
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

    def rates(self, n: int) -> list[float]:
        """Acceptance rates of positions 0..n-1, each given the ones before it were accepted.

        Deep positions are reached rarely, and never while the drafts stay short; each one's
        estimate leans on a prior: the rate of the position before it, or the rate pooled
        over all positions if that is higher (a draft that has matched so far tends to keep
        matching, so conditional acceptance rarely falls with depth). The pooled rate leans
        on an optimistic prior while there is no data at all.
        """
        pooled = (sum(self.accepted) + PRIOR_RATE * PRIOR_WEIGHT) / (
            sum(self.reached) + PRIOR_WEIGHT
        )
        rates: list[float] = []
        for position in range(n):
            prior = max(pooled, rates[-1]) if rates else pooled
            if position >= len(self.reached):
                rates.append(prior)
            else:
                rates.append(
                    (self.accepted[position] + prior * PRIOR_WEIGHT)
                    / (self.reached[position] + PRIOR_WEIGHT)
                )
        return rates

    def rate(self, position: int) -> float:
        """Acceptance rate of `position` given the ones before it were accepted."""
        return self.rates(position + 1)[-1]

    def expected_tokens(self, k: int) -> float:
        """Tokens a k-token draft yields on average, the target's own token included."""
        total, survive = 1.0, 1.0
        for rate in self.rates(k):
            survive *= rate
            total += survive
        return total


@dataclass
class Overhead:
    """Decaying mean of measured step cost minus modelled step cost, in target calls."""

    decay: float = 0.9
    prior_weight: float = 4.0  # the calibration is believed until several steps disagree
    clip: tuple[float, float] = (-1.0, 2.0)  # one slow step (a hiccup) moves it only so far
    total: float = 0.0
    weight: float = 0.0

    def observe(self, excess: float) -> None:
        excess = min(max(excess, self.clip[0]), self.clip[1])
        self.total = self.total * self.decay + excess
        self.weight = self.weight * self.decay + 1.0

    def age(self, factor: float) -> None:
        """Time passed without a measurement: lean back toward the calibration."""
        self.total *= factor
        self.weight *= factor

    @property
    def value(self) -> float:
        return self.total / (self.weight + self.prior_weight)


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
    plain_overhead: Overhead = field(default_factory=Overhead)
    spec_overhead: Overhead = field(default_factory=Overhead)

    def modelled_cost(self, k: int, n_tokens: int | None = None) -> float:
        """The calibrated cost of a step drafting k tokens, in one-token target calls."""
        if k == 0:
            return 1.0
        c = self.profile.c if self.uses_draft_model else 0.0
        if n_tokens is None:
            n_tokens = self.tree_size if self.tree_size is not None else k + 1
        return k * c + self.profile.verify_cost(n_tokens)

    def predicted(self, k: int) -> float:
        """Predicted tokens per one-token-call time of drafting k tokens, measured
        overheads included (1.0 for k = 0 when plain steps cost what calibration says)."""
        if k == 0:
            return 1.0 / max(1.0 + self.plain_overhead.value, 0.1)
        cost = self.modelled_cost(k) + self.spec_overhead.value
        return self.tracker.expected_tokens(k) / max(cost, 0.1)

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

    def could_win(self) -> bool:
        """Whether some k beats plain decoding if every draft token were accepted.

        If not, the costs alone rule speculation out (a k-token call costs k one-token calls,
        say) and no acceptance could change that: probing would only pay for the draft
        catching up on the plain stretch.
        """
        plain = self.predicted(0)
        for k in range(1, self.max_k + 1):
            cost = self.modelled_cost(k) + self.spec_overhead.value
            if (k + 1) / max(cost, 0.1) > plain:
                return True
        return False

    def best_k(self) -> int:
        """The k in 0..max_k with the best prediction."""
        return max(range(self.max_k + 1), key=self.predicted)

    def __post_init__(self) -> None:
        self._probe_interval = self.probe_every
        self._probing = False  # the step under way is a probe

    def choose(self) -> int:
        best = self.best_k()
        self._probing = False
        if best > 0:
            self.steps_since_probe = 0
            self._probe_interval = self.probe_every
            return best
        self.steps_since_probe += 1
        if self.steps_since_probe >= self._probe_interval and self.could_win():
            # A probe: one short speculative step keeps the acceptance estimate fresh. While
            # probes keep finding speculation a loss they come ever less often, so their
            # cost fades; the first probe that wins resets the interval.
            self.steps_since_probe = 0
            self._probe_interval = min(2 * self._probe_interval, self.max_probe_every)
            self._probing = True
            return max(range(1, min(4, self.max_k) + 1), key=self.predicted)
        self.plain_steps += 1
        self.tracker.age()  # evidence fades with time, not only with drafts
        # So does a measured overhead of speculating (it may have been a passing cost): once
        # it has faded enough, speculative steps measure it again.
        self.spec_overhead.age(self.tracker.decay)
        return 0

    def observe(
        self,
        depth: int,
        n_accepted: int,
        n_drafted: int,
        is_tree: bool,
        seconds: float | None = None,
    ) -> None:
        """One step's outcome; `seconds`, its wall time, refines the cost model."""
        if depth == 0:
            if seconds is not None:
                self.plain_overhead.observe(seconds / self.profile.target_call_seconds - 1.0)
            return
        self.tracker.observe(depth, n_accepted)
        if is_tree:
            self.tree_size = n_drafted + 1
        # A probe also pays for the draft catching up on the plain stretch before it: a
        # cost of falling back, not of speculating, so it does not count here.
        if seconds is not None and not self._probing:
            cost = self.modelled_cost(n_drafted, n_drafted + 1)
            self.spec_overhead.observe(seconds / self.profile.target_call_seconds - cost)
