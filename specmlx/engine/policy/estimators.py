"""What adaptive k learns as it goes: decaying means, acceptance by position, confidence bins.

Every running estimate is a `Decaying` mean: recent steps weigh most, so the policy follows a
text that changes character (boilerplate, then prose). `AcceptanceRates` holds one per draft
position and state; `ConfidenceBins` one per bin of the drafter's own probability. The
equations and the reason for each constant are in docs/adaptive-k.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Evidence a prior counts for, in steps: enough that one early rejection does not decide,
# little enough that a handful of steps outweighs it.
PRIOR_WEIGHT = 4.0
# Acceptance memory: 0.97 per step is an effective window of about 30 steps, a paragraph.
ACCEPTANCE_DECAY = 0.97


@dataclass
class Decaying:
    """A mean of observations whose weights shrink by `decay` each time the estimate ages.

    `mean(prior)` reads it as if `prior_weight` observations of `prior` were added (a prior
    that lasts: a position never reached keeps its prior). Evidence that should age like
    observations instead starts in `total`/`weight` (`Decaying.seeded`).
    """

    decay: float
    prior_weight: float = PRIOR_WEIGHT
    total: float = 0.0
    weight: float = 0.0

    @classmethod
    def seeded(cls, value: float, weight: float, decay: float) -> Decaying:
        """Starts at `value`, held as `weight` observations that age like the rest."""
        return cls(decay, 0.0, value * weight, weight)

    def age(self) -> None:
        self.total *= self.decay
        self.weight *= self.decay

    def add(self, value: float, weight: float = 1.0) -> None:
        self.total += value * weight
        self.weight += weight

    def observe(self, value: float, weight: float = 1.0) -> None:
        """Age, then add one observation."""
        self.age()
        self.add(value, weight)

    def mean(self, prior: float = 0.0) -> float:
        denominator = self.weight + self.prior_weight
        return (self.total + prior * self.prior_weight) / denominator if denominator else prior

    def lighten(self, most: float) -> None:
        """Keep the mean, but let the evidence count for at most `most` observations."""
        if self.weight > most:
            self.total *= most / self.weight
            self.weight = most

    def fade(self, factor: float, toward: float) -> None:
        """Time passed without a measurement: the evidence's departure from `toward` shrinks
        by `factor`, its weight unchanged."""
        self.total = toward * self.weight + (self.total - toward * self.weight) * factor

    @property
    def evidence(self) -> float:
        return self.weight


@dataclass
class AcceptanceRates:
    """Per draft position: how often it is kept when reached, how often it is drafted when
    asked for.

    Position j's acceptance is the chance it is kept given every position before it was.
    The first position is counted in two states: after a step that ended on a rejected draft
    token ("after a miss": the context ends on the target's correction, which the drafter
    did not expect) and otherwise ("on track"). Pooled, the misses would make every position
    look bad; apart, drafts run long on track and short after a miss.
    """

    prior: float  # the first position's acceptance before any evidence
    decay: float = ACCEPTANCE_DECAY
    kept: list[Decaying] = field(default_factory=list)  # positions 1.. (0 is `first`)
    drafted: list[Decaying] = field(default_factory=list)  # continuation of positions 1..
    first: tuple[Decaying, Decaying] = field(init=False)  # (after a miss, on track)
    pooled: Decaying = field(init=False)  # the first position in either state
    # How often a proposal offers anything at all: a cost-sized tree comes back empty where
    # no node pays for its verification (1 until such a drafter says otherwise).
    offered: Decaying = field(init=False)
    missed: bool = False
    # Speculative steps the estimates rest on, undecayed: this response's, plus at most
    # `carried`'s `most` for everything earlier ones saw.
    steps: int = 0

    def __post_init__(self) -> None:
        self.first = (Decaying(self.decay), Decaying(self.decay))
        self.pooled = Decaying(self.decay)
        self.offered = Decaying(self.decay)

    def observe(self, requested: int, depth: int, accepted: int) -> None:
        """A step asked for `requested` positions, drafted `depth`, had `accepted` kept."""
        self.steps += 1
        grow = max(requested, depth) - 1 - len(self.kept)
        self.kept += [Decaying(self.decay) for _ in range(max(grow, 0))]
        self.drafted += [Decaying(self.decay) for _ in range(max(grow, 0))]
        for estimate in (*self.first, self.pooled, *self.kept, *self.drafted):
            estimate.age()
        if depth > 0:
            self.first[0 if self.missed else 1].add(accepted >= 1)
            self.pooled.add(accepted >= 1)
        # Position j (j >= 1) was reached when all before it were kept, and asked for when
        # the one before it was drafted.
        for j in range(1, min(depth, accepted + 1)):
            self.kept[j - 1].add(j < accepted)
        for j in range(1, min(depth + 1, requested)):
            self.drafted[j - 1].add(j < depth)
        self.missed = accepted < depth

    def carried(self, most: float = PRIOR_WEIGHT) -> None:
        """A new response starts from what earlier ones saw, worth at most `most` steps of
        evidence per estimate (as much as the prior): a few of its own steps outweigh it, so
        an extraction after a chat is not held to the chat's rates for long. Nor is its
        confidence in them: however many steps they rested on, they count as `most` when
        the policy bounds what it does not know yet (`curve`'s optimism, the wait before
        a probe)."""
        for estimate in (*self.first, self.pooled, *self.kept, *self.drafted, self.offered):
            estimate.lighten(most)
        self.steps = min(self.steps, round(most))
        self.missed = False  # the context ends on the prompt: nothing was missed

    def offer(self, offered: bool) -> None:
        """A proposal of a drafter that may offer nothing (`DrafterTraits.proposal_cost`):
        did it? An empty one teaches nothing of acceptance."""
        self.offered.observe(offered)

    def plain_step(self) -> None:
        """A step without a draft: the context goes on with the target's own token, as after
        a draft that was all kept."""
        self.missed = False

    def curve(self, n: int, optimism: float = 0.0) -> list[tuple[float, float]]:
        """(continuation, acceptance) of positions 0..n-1; position 0 is drafted when the
        proposal offers anything (`offered`).

        The first position's acceptance is that of the state the last step left, leaning on
        the first position's rate in both states, which leans on the prior; `optimism` adds
        that many standard errors to it (an upper bound, for deciding while evidence is thin).
        A deeper position leans on the one before it, or on the first position on track if
        that is higher (a draft that has matched so far tends to go on matching).
        Continuations lean on the position before them, from 1.
        """
        pooled = self.pooled.mean(self.prior)
        on_track = self.first[1].mean(pooled)
        state = self.first[0 if self.missed else 1]
        rate = state.mean(pooled)
        if optimism:
            spread = rate * (1 - rate) / (self.steps + state.prior_weight)
            rate = min(1.0, rate + optimism * spread**0.5)
        result = [(self.offered.mean(1.0), rate)]
        for j in range(1, n):
            cont_prior = result[-1][0]
            kept_prior = max(result[-1][1], on_track)
            if j - 1 < len(self.kept):
                kept = self.kept[j - 1].mean(kept_prior)
                cont = self.drafted[j - 1].mean(cont_prior)
            else:
                kept, cont = kept_prior, cont_prior
            result.append((cont, kept))
        return result


def expectations(curve: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """For every k from 0 to len(curve), in one pass: E(k), the tokens a step asked for k
    yields (the target's own included), and D(k), the tokens the drafter drafts.

    E(k) = 1 + sum_{j<k} prod_{i<=j} g_i a_i,   D(k) = sum_{j<k} prod_{i<=j} g_i.
    """
    tokens, drafted = [1.0], [0.0]
    kept = go = 1.0
    for cont, acceptance in curve:
        go *= cont
        kept *= cont * acceptance
        tokens.append(tokens[-1] + kept)
        drafted.append(drafted[-1] + go)
    return tokens, drafted


# Confidence memory: slower than acceptance's (0.99: about 100 drafted tokens), since each
# bin sees only a share of the tokens.
CONFIDENCE_DECAY = 0.99
# A bin starts at its own midpoint (a confidence taken at its word), worth this many tokens.
CONFIDENCE_PRIOR_WEIGHT = 2.0


@dataclass
class ConfidenceBins:
    """How often a draft token is kept, by the drafter's own probability of it.

    At temperature 0 a token the draft is sure of is nearly always kept and an unsure one
    about as often as its probability says; when sampling, rejection sampling keeps much of
    what a flat draft distribution draws, whatever the draw's probability. So what a
    confidence means is measured per bin, and fitted to rise with the confidence.
    """

    bins: int = 10
    kept: list[Decaying] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.kept:
            self.kept = [
                Decaying(CONFIDENCE_DECAY, CONFIDENCE_PRIOR_WEIGHT) for _ in range(self.bins)
            ]

    def bin_of(self, confidence: float) -> int:
        return min(int(confidence * self.bins), self.bins - 1)

    def observe(self, confidences: tuple[float, ...], accepted: int) -> None:
        """A draft's confidences: the first `accepted` tokens kept, the next one rejected,
        the rest never judged."""
        for estimate in self.kept:
            estimate.age()
        for i, confidence in enumerate(confidences[: accepted + 1]):
            self.kept[self.bin_of(confidence)].add(i < accepted)

    def fitted(self) -> list[float]:
        """Every bin's chance of being kept, made non-decreasing in confidence.

        A bin with few tokens can dip below the one under it by chance; read bin by bin,
        the dip would block every bin below it. Pooling adjacent bins that break the order,
        weighted by their evidence (the isotonic least-squares fit), keeps them together.
        """
        blocks: list[list[float]] = []  # [weighted sum, weight, bins]
        for b, estimate in enumerate(self.kept):
            weight = estimate.evidence + estimate.prior_weight
            blocks.append([estimate.mean((b + 0.5) / self.bins) * weight, weight, 1])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                total, weight, count = blocks.pop()
                blocks[-1][0] += total
                blocks[-1][1] += weight
                blocks[-1][2] += count
        return [total / weight for total, weight, count in blocks for _ in range(int(count))]
