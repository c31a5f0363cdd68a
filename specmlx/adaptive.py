"""Adaptive speculation: pick each step's draft length from measured costs and acceptance.

Before each step the policy asks the drafter for the k tokens that maximize expected tokens
per unit of time,

    E(k) / cost(k),   E(k) = 1 + sum_{j<k} prod_{i<=j} g_i a_i,
                      cost(k) = D(k)*c + v(1 + D(k)),   D(k) = sum_{j<k} prod_{i<=j} g_i,

where a_i is the running (exponentially decaying) rate at which draft position i is accepted
given that it was drafted and the positions before it were accepted (a_0 apart for a draft
that follows a rejected token, which the draft did not expect, and for one that follows a
kept draft or a plain step: the first is kept far less often), g_i the rate at which
the drafter drafts position i when asked for it (g_0 = 1; below 1 for a drafter that stops
on low confidence or runs out of proposals), D(k) the tokens it drafts, c the cost of one
draft-model call and v(n) the cost of an n-token target call, both in one-token target
calls (`specmlx.costs.CostProfile`); a tree drafter's calls cost its tree's size. Plain
decoding is k = 0 with E = cost = 1. When no k beats it, the policy decodes plainly and
probes with a speculative step now and then, so it comes back when acceptance recovers
(soon after a fall-back on few drafts, ever less often while probes lose, at the same pace
while they win); while there is little experience (a response's first tokens are often
missed), it keeps speculating as long as an upper confidence bound of the first position's
rate says it could win.

A draft model ends its draft once one more token no longer pays (llama.cpp's p_min, but
judged on the whole draft so far; the last token is still verified, its call being spent),
so a step that speculates asks it for up to max_k tokens: the rates by position would only
cap a sure stretch. One more token costs a draft call and one more verified token; it
brings a token only if every token drafted before it is kept and then it is too. So the
draft goes on while

    prod_{i<=j} chance(q_i) * a_{j+1} >= p_min,

where q_i is the draft's own probability of token i, chance(q) the rate at which tokens of
that confidence have been kept (`ConfidenceCalibration`: near q at temperature 0, far
higher when sampling), a_{j+1} the next position's running acceptance rate and p_min the
cost of one more token at the rate the policy predicts for its best choice (EAGLE-2 grows
its draft tree by the same product of confidences). Doubt adds up: a few middling tokens
end a draft that one of them alone would not, while a sure stretch runs long. Positions
past the first are drafted only when that expectation covers p_min, so their acceptance
is expected to be no less (and that of first tokens that would have gone on).

The calibrated costs are only a model of a step, measured once; the machine they describe
drifts (other work, heat, a calibration from another day), and a real step costs things the
model leaves out (host syncs, sampling, kernels a GPU builds for a new shape). Both are
measured as they happen. Drift is a scale per model: the draft model's calls, timed apart
from the verify call, against their calibrated time, and plain steps against a one-token
target call (a decaying mean of each ratio), which multiply the draft and the target parts
of every modelled cost. What is left of a speculative step's wall time beyond that is kept
as a decaying mean and added to the cost of speculative steps; and kept apart for each
number of tokens verified, leaning on that mean, since the calibrated curve v(n) is itself
a measurement of a few calls (on a shared CPU it moves by ~15% from one calibration to the
next) and a step of one size may run cheaper or dearer than it says. A response's first
step also pays for setting up (buffers allocated anew after the prefill) and teaches no
costs, nor does the first speculative step after plain ones (the draft model catches up on
the plain stretch); while decoding plainly (past a stretch's first few steps), what
speculative steps measured to cost more than calibrated (the overheads, the draft model's
scale) fades back toward the calibration, so that one slow spell cannot rule speculation out
for good; what they measured to cost less stays until speculative steps measure it again.
The measured costs are the machine's, not a response's: the next response on the same loaded
models starts from them (`LearnedCosts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specmlx.costs import CostProfile

# The start: speculate until the data says otherwise, and let no single rejection decide.
# A drafter that knows it starts worse says so (its `prior_acceptance`).
PRIOR_RATE = 0.7
PRIOR_WEIGHT = 4.0
# Standard errors of the first position's rate added before falling back to plain decoding.
OPTIMISM = 1.0
# Steps of evidence the overhead over all sizes counts for in one size's own estimate.
SIZE_PRIOR = 2.0


@dataclass
class AcceptanceTracker:
    """Decaying counts, per draft position, of how often a drafter went on drafting and how
    often the target accepted what it drafted.

    Position i's acceptance rate is the chance it is accepted given it was drafted and all
    before it were accepted. Its continuation rate (i >= 1) is the chance the drafter drafts
    it when asked, given it drafted position i - 1: below 1 for a drafter that stops on low
    confidence (p_min) or runs out of proposals (an n-gram match that ends).
    """

    decay: float = 0.97  # an effective memory of about 30 steps
    prior_rate: float = PRIOR_RATE  # the first position's rate before any evidence
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    asked: list[float] = field(default_factory=list)
    offered: list[float] = field(default_factory=list)
    # First draft tokens, which are drafted whatever their confidence: after how many the
    # draft would have gone on (`AdaptiveK.goes_on`); and of those drafted on track (see
    # below), how many would have, how often those were kept and their summed chance by
    # confidence.
    first_seen: float = 0.0
    first_passed: float = 0.0
    track_passed: float = 0.0
    track_passed_accepted: float = 0.0
    track_passed_chance: float = 0.0
    steps: int = 0  # steps observed, without decay: how much experience there is
    # The first position again, counted apart after a step that ended on a rejected draft
    # token (the context then ends on a token the draft did not expect) and after one that
    # did not (all kept, or a plain step): [after a miss, on track].
    first_reached: list[float] = field(default_factory=lambda: [0.0, 0.0])
    first_accepted: list[float] = field(default_factory=lambda: [0.0, 0.0])
    missed: bool = False  # whether the last step ended on a rejected draft token

    def age(self) -> None:
        """One step passed: older evidence weighs less."""
        for counts in (self.reached, self.accepted, self.asked, self.offered):
            counts[:] = [x * self.decay for x in counts]
        self.first_seen *= self.decay
        self.first_passed *= self.decay
        self.track_passed *= self.decay
        self.track_passed_accepted *= self.decay
        self.track_passed_chance *= self.decay
        self.first_reached[:] = [x * self.decay for x in self.first_reached]
        self.first_accepted[:] = [x * self.decay for x in self.first_accepted]

    def observe(
        self,
        depth: int,
        n_accepted: int,
        requested: int | None = None,
        first_passed: bool | None = None,
        first_chance: float = 0.0,
    ) -> None:
        """One step that was asked for `requested` positions (default `depth`), drafted
        `depth` and had the first `n_accepted` kept. `first_passed`: whether the draft would
        have gone on after its first token, drafted whatever its confidence (None: the
        drafter reports no confidence); `first_chance`: the chance of being kept that its
        confidence stands for."""
        self.age()
        requested = depth if requested is None else max(requested, depth)
        for counts in (self.reached, self.accepted, self.asked, self.offered):
            counts.extend([0.0] * (requested - len(counts)))
        self.steps += 1
        # Position i (0-based) was reached when all before it were accepted.
        for i in range(min(depth, n_accepted + 1)):
            self.reached[i] += 1
            self.accepted[i] += i < n_accepted
        # Position i >= 1 was asked for when the one before it was drafted.
        for i in range(1, min(depth + 1, requested)):
            self.asked[i] += 1
            self.offered[i] += i < depth
        state = 0 if self.missed else 1
        if depth > 0:
            self.first_reached[state] += 1
            self.first_accepted[state] += n_accepted >= 1
        self.missed = n_accepted < depth
        if first_passed is not None:
            self.first_seen += 1
            self.first_passed += first_passed
            if first_passed and state == 1:
                self.track_passed += 1
                self.track_passed_accepted += n_accepted >= 1
                self.track_passed_chance += first_chance

    def plain_step(self) -> None:
        """A step without a draft: the context goes on with the target's own token, as
        after a draft that was all kept."""
        self.missed = False

    def rates(self, n: int, floor: float = 0.0, optimism: float = 0.0) -> list[float]:
        """Acceptance rates of positions 0..n-1, each given the ones before it were accepted.

        The first position's rate is that of the state the last step left: a draft that
        follows a rejected token (one the draft did not expect) is kept less often than one
        that follows a kept draft or a plain step ("on track"), which is what a later
        position does (far less often, on the Qwen pair, at T = 0 and when sampling). Each
        state's rate leans on the first position's pooled rate, which leans on a fixed
        prior while data is scarce.

        Deep positions are reached rarely, and never while the drafts stay short; each
        one's estimate leans on a prior: the rate of the position before it, or a base rate
        if that is higher (a draft that has matched so far tends to keep matching, so
        conditional acceptance rarely falls with depth). The base rate is that of first
        tokens drafted on track and confident enough for the draft to go on, where the
        drafter reports its confidence (every later position followed such tokens), else
        that of first tokens drafted on track. `floor` raises the prior of positions after
        the first: a drafter that drafts one more token only when it is expected to be kept
        at least that often (p_min) drafts no token it expects to lose more often.
        `optimism` adds that many standard errors to the first position's rate, an error
        that shrinks with the steps seen: an upper bound, for deciding whether to go on
        speculating while there is little experience.
        """
        pooled = self._estimate(self.accepted, self.reached, 0, self.prior_rate)
        first = [
            (accepted + pooled * PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT)
            for accepted, reached in zip(self.first_accepted, self.first_reached, strict=True)
        ]
        if self.track_passed > 0:
            # What a confident token's confidence says is its prior chance of being kept.
            chance = self.track_passed_chance / self.track_passed
            base = (self.track_passed_accepted + chance * PRIOR_WEIGHT) / (
                self.track_passed + PRIOR_WEIGHT
            )
        else:
            base = first[1]
        rates: list[float] = []
        for position in range(n):
            if position == 0:
                rate = first[0] if self.missed else first[1]
                if optimism:
                    error = (rate * (1 - rate) / (self.steps + PRIOR_WEIGHT)) ** 0.5
                    rate = min(1.0, rate + optimism * error)
            else:
                prior = max(base, rates[-1], floor)
                rate = self._estimate(self.accepted, self.reached, position, prior)
            rates.append(rate)
        return rates

    def continuations(self, n: int) -> list[float]:
        """Continuation rates of positions 0..n-1 (position 0 is always drafted: 1).

        Before any data, the share of first tokens after which the draft would have gone on
        (where the drafter reports confidence), else 1; deeper positions lean on the rate
        of the position before them.
        """
        first = (self.first_passed + PRIOR_WEIGHT) / (self.first_seen + PRIOR_WEIGHT)
        result = [1.0]
        for position in range(1, n):
            prior = first if position == 1 else result[-1]
            result.append(self._estimate(self.offered, self.asked, position, prior))
        return result[:n]

    @staticmethod
    def _estimate(hits: list[float], trials: list[float], position: int, prior: float) -> float:
        if position >= len(trials):
            return prior
        return (hits[position] + prior * PRIOR_WEIGHT) / (trials[position] + PRIOR_WEIGHT)

    def rate(self, position: int) -> float:
        """Acceptance rate of `position` given the ones before it were accepted."""
        return self.rates(position + 1)[-1]

    def expected(self, k: int, floor: float = 0.0, optimism: float = 0.0) -> tuple[float, float]:
        """Asked for k, the tokens a step yields (the target's own included) and the tokens
        the drafter drafts, on average."""
        tokens, drafted = 1.0, 0.0
        kept = go = 1.0
        for rate, cont in zip(self.rates(k, floor, optimism), self.continuations(k), strict=True):
            go *= cont
            kept *= cont * rate
            tokens += kept
            drafted += go
        return tokens, drafted

    def expected_tokens(self, k: int, floor: float = 0.0, optimism: float = 0.0) -> float:
        """Tokens a step asked for k yields on average, the target's own token included."""
        return self.expected(k, floor, optimism)[0]


@dataclass
class ConfidenceCalibration:
    """How often a draft token is kept, by the drafter's own probability of it (in bins).

    At temperature 0 a token the draft is sure of is nearly always kept and an unsure one
    about as often as its probability says; when sampling, the drafted token's probability
    says much less (a flat draft distribution meets a flat target one, and rejection
    sampling keeps most of what it draws, whatever the probability of the draw). So what a
    confidence means is measured: each bin starts at its own midpoint (a confidence taken at
    its word) and learns, with decay, from every drafted token whose fate is known. (Also
    when sampling: started from the kept share of all tokens, unsure bins went on drafting
    where a replay of recorded T=1 drafts found stopping paid, in every suite.)
    """

    bins: int = 10
    decay: float = 0.99
    prior_weight: float = 2.0
    kept: list[float] = field(default_factory=list)
    seen: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.seen:
            self.kept = [0.0] * self.bins
            self.seen = [0.0] * self.bins

    def bin_of(self, confidence: float) -> int:
        return min(int(confidence * self.bins), self.bins - 1)

    def observe(self, confidences: tuple[float, ...], n_accepted: int) -> None:
        """A draft's confidences: the first `n_accepted` tokens kept, the next rejected."""
        self.kept = [x * self.decay for x in self.kept]
        self.seen = [x * self.decay for x in self.seen]
        for i, confidence in enumerate(confidences[: n_accepted + 1]):
            b = self.bin_of(confidence)
            self.seen[b] += 1
            self.kept[b] += i < n_accepted

    def _raw(self, b: int) -> float:
        """Bin b's own estimate: its kept share, drawn toward its midpoint."""
        prior = (b + 0.5) / self.bins
        return (self.kept[b] + prior * self.prior_weight) / (self.seen[b] + self.prior_weight)

    def fitted(self) -> list[float]:
        """Every bin's chance of being kept, made non-decreasing in confidence.

        A surer draft token is not less likely to be kept, but a bin with few tokens can
        say so by chance (a sampled step that lost three tokens at 0.6 while 0.5 kept its
        own). Read bin by bin, such a dip would block every bin below it and make the
        threshold jump; pooling adjacent bins that break the order (weighted by their
        evidence: the isotonic least-squares fit) keeps what they say together.
        """
        blocks: list[list[float]] = []  # [weighted sum, weight, bins]
        for b in range(self.bins):
            weight = self.seen[b] + self.prior_weight
            blocks.append([self._raw(b) * weight, weight, 1])
            while len(blocks) > 1 and (
                blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]
            ):
                total, weight, count = blocks.pop()
                blocks[-1][0] += total
                blocks[-1][1] += weight
                blocks[-1][2] += count
        return [total / weight for total, weight, count in blocks for _ in range(int(count))]

    def chance(self, b: int) -> float:
        """The estimated chance a token of bin b is kept."""
        return self.fitted()[b]

    def chance_of(self, confidence: float) -> float:
        return self.chance(self.bin_of(confidence))


@dataclass
class Overhead:
    """Decaying mean of measured step cost minus modelled step cost, in target calls.

    It starts at the calibration (0), held as `prior_weight` steps of evidence that decay as
    measured steps do: the calibration is believed until several steps disagree, and counts
    for nothing once many have. (A prior that did not decay would hold back a fixed share of
    what the steps say for good: with decay 0.9 they weigh at most 10 together, so a prior
    of 4 kept 29% of the pooled overhead out, whatever the evidence, and with it part of
    the overhead of each size, which leans on the pooled one.)
    """

    decay: float = 0.9
    prior_weight: float = 4.0  # the calibration is believed until several steps disagree
    clip: tuple[float, float] = (-1.0, 2.0)  # one slow step (a hiccup) moves it only so far
    total: float = 0.0
    weight: float | None = None  # None: the prior's alone

    def __post_init__(self) -> None:
        if self.weight is None:
            self.weight = self.prior_weight

    def observe(self, excess: float) -> None:
        excess = min(max(excess, self.clip[0]), self.clip[1])
        self.total = self.total * self.decay + excess
        self.weight = self.weight * self.decay + 1.0

    def age(self, factor: float) -> None:
        """Its evidence counts for less (against a pooled estimate it leans on)."""
        self.total *= factor
        self.weight *= factor

    def fade(self, factor: float) -> None:
        """Time passed without a measurement: what was measured shrinks toward the
        calibration by `factor`, and the calibration regains as much of its weight."""
        value = self.value * factor
        self.weight = self.weight * factor + self.prior_weight * (1 - factor)
        self.total = value * self.weight

    @property
    def value(self) -> float:
        return self.total / self.weight if self.weight else 0.0


@dataclass
class Scale:
    """Decaying mean of measured over calibrated time of one-token calls (1: as calibrated)."""

    decay: float = 0.9
    prior_weight: float = 0.5  # timing is precise: a few calls outweigh the calibration
    clip: tuple[float, float] = (0.2, 5.0)
    total: float = 0.0
    weight: float = 0.0

    def observe(self, ratio: float, calls: float = 1.0) -> None:
        ratio = min(max(ratio, self.clip[0]), self.clip[1])
        calls = min(calls, 4.0)  # a long draft counts for a few calls, not for many
        self.total = self.total * self.decay + ratio * calls
        self.weight = self.weight * self.decay + calls

    def fade(self, factor: float) -> None:
        """Time passed without a measurement: the measured scale's distance from the
        calibration shrinks by `factor`, and it counts for less against the next one."""
        value = 1.0 + (self.value - 1.0) * factor
        self.weight *= factor
        self.total = value * (self.weight + self.prior_weight) - self.prior_weight

    @property
    def value(self) -> float:
        return (self.total + self.prior_weight) / (self.weight + self.prior_weight)


@dataclass
class LearnedCosts:
    """What steps measured of a combination's costs beyond its calibration.

    The calibration is a few calls per size, measured once (on a shared CPU its points move
    by ~10% between measurements); what the loop measures is the better evidence, and it is
    evidence about the machine, not about one response. Kept with the loaded models, it
    lets each response start from what earlier ones learned rather than from the
    calibration's error again (on the Qwen pair at T = 0, a draft at break-even that the
    calibration priced ~10% too dear left two of three responses to one prompt plain
    after their first misses).
    """

    draft_scale: Scale = field(default_factory=Scale)  # draft-model calls
    target_scale: Scale = field(default_factory=Scale)  # plain steps
    spec_overhead: Overhead = field(default_factory=Overhead)
    # The same, per number of tokens verified (its evidence fades with every speculative
    # step, so a size that stops being drafted leans back on the overhead over all sizes).
    size_overhead: dict[int, Overhead] = field(default_factory=dict)


@dataclass
class AdaptiveK:
    """Chooses k per step; k = 0 means a plain step (speculation predicted to lose)."""

    profile: CostProfile
    uses_draft_model: bool
    max_k: int = 16
    probe_every: int = 16  # plain steps between probes; doubles while probes keep losing
    max_probe_every: int = 256
    # A fall-back that rests on few speculative steps (a response's first drafts, missed
    # by chance) is checked sooner: its first probe comes as many steps after it as there
    # were speculative steps, at least this many (at most `probe_every`; a policy plain
    # from the start waits `probe_every`).
    min_probe_every: int = 2
    # Per plain step, how much of what speculative steps measured beyond the calibration
    # (a slower draft model, an overhead) remains, past the first `fade_after` of a plain
    # stretch: a fifth after 16 more. Plain steps cannot time the draft model, so a slow
    # spell, once passed, must fade: merely weighing it less would leave its mean, and
    # speculation off for good.
    cost_fade: float = 0.9
    # A plain step or two between drafts (after a miss, where the next draft is kept less
    # often) is part of speculating, not time away from it: the fade starts after this
    # many plain steps in a row. (Faded from the first, the measurements that alternate
    # with such steps were pulled back toward the calibration as fast as the steps taught
    # them; with the calibration's prior that did not age, one-token steps stayed priced
    # 3% dearer than they ran, two-token steps 12%, on creative text at T = 1.)
    fade_after: int = 3
    tracker: AcceptanceTracker = field(default_factory=AcceptanceTracker)
    tree_size: int | None = None  # tokens a tree drafter's proposals cost, once seen
    fixed_p_min: float | None = None  # the user's confidence threshold; None: from costs
    # The drafter ends each draft where `goes_on` says: then every token it drafts past the
    # first is expected to pay, and a step asks for up to max_k.
    drafter_cuts: bool = False
    steps_since_probe: int = 0
    plain_steps: int = 0
    calibration: ConfidenceCalibration = field(default_factory=ConfidenceCalibration)
    # What steps measured beyond the calibration; shared by the policies of one loaded
    # combination (`specmlx.api.make_policy`), so a response starts from what earlier ones
    # learned.
    costs: LearnedCosts = field(default_factory=LearnedCosts)

    def modelled_cost(self, k: float, n_tokens: float | None = None) -> float:
        """The calibrated cost of a step drafting k tokens (an expected number, maybe) and
        verifying `n_tokens` (default k + 1, a tree's size for a tree drafter), in one-token
        target calls."""
        return self._cost(k, n_tokens, measured=False)

    def scaled_cost(self, k: float, n_tokens: float | None = None) -> float:
        """`modelled_cost` with each model's calls at their measured scale, plus the
        measured overhead of a speculative step (k > 0) of its size."""
        cost = self._cost(k, n_tokens, measured=True)
        if k == 0:
            return cost
        return max(cost + self.overhead(self._size(k, n_tokens)), 0.1)

    def overhead(self, n_tokens: float) -> float:
        """The measured cost, beyond the model, of a speculative step verifying `n_tokens`
        (an expected number, maybe: interpolated between the sizes around it): each size's
        own decaying mean, drawn toward the mean over all sizes while it has little
        evidence."""
        pooled = self.costs.spec_overhead.value

        def at(n: int) -> float:
            own = self.costs.size_overhead.get(n)
            if own is None:
                return pooled
            return (own.total + pooled * SIZE_PRIOR) / (own.weight + SIZE_PRIOR)

        low = int(n_tokens)
        share = n_tokens - low
        return at(low) if share == 0 else (1 - share) * at(low) + share * at(low + 1)

    def _age_sizes(self) -> None:
        """A step passed: each size's own overhead counts for less against the pooled one."""
        for own in self.costs.size_overhead.values():
            own.age(self.tracker.decay)

    def _size(self, k: float, n_tokens: float | None) -> float:
        """Tokens a step drafting k verifies: k + 1, or a tree's size."""
        if n_tokens is not None:
            return n_tokens
        return self.tree_size if self.tree_size is not None else k + 1

    def _cost(self, k: float, n_tokens: float | None, measured: bool) -> float:
        draft_scale = self.costs.draft_scale.value if measured else 1.0
        target_scale = self.costs.target_scale.value if measured else 1.0
        if k == 0:
            return max(target_scale, 0.1)
        c = self.profile.c if self.uses_draft_model else 0.0
        verify = self.profile.verify_cost(self._size(k, n_tokens))
        return k * c * draft_scale + verify * target_scale

    def step_cost(self, k: int, optimism: float = 0.0) -> float:
        """The expected cost of a step asked for k tokens (0: plain), in calibrated
        one-token target calls: what the drafter is expected to draft (it may stop early),
        costed by `scaled_cost`."""
        return self._expected(k, optimism)[1]

    def predicted(self, k: int, optimism: float = 0.0) -> float:
        """Predicted tokens per calibrated one-token-call time of a step asked for k tokens
        (1.0 for k = 0 while plain steps cost what calibration says); `optimism`: see
        `AcceptanceTracker.rates`."""
        tokens, cost = self._expected(k, optimism)
        return tokens / cost

    def _expected(self, k: int, optimism: float) -> tuple[float, float]:
        """The tokens and the cost of a step asked for k tokens, on average."""
        if k == 0:
            return 1.0, self.scaled_cost(0)
        tokens, drafted = self.tracker.expected(k, self.threshold, optimism)
        if self.tree_size is not None:  # every step costs the whole tree
            return tokens, self.scaled_cost(k)
        return tokens, self.scaled_cost(drafted)

    def p_min(self) -> float:
        """The least chance of being kept that makes one more draft token pay.

        One more draft token costs a draft call and one more verified token, at the measured
        scales. The time could instead go into steps as they run, at the best predicted
        rate (tokens per call-time): the token pays only if its chance of bringing a token
        covers its cost at that rate. (Weighed against plain decoding's one token per call
        instead, the threshold would come out too low and keep drafting tokens that cost
        more than they bring.) `goes_on` weighs each draft's chance against it; a user's
        fixed p_min is a confidence already.
        """
        if not self.uses_draft_model:
            return 0.0
        if self.fixed_p_min is not None:
            return self.fixed_p_min
        rate = max(self.predicted(k) for k in range(self.max_k + 1))
        marginal_verify = max((self.profile.verify_cost(9) - 1.0) / 8, 0.0)
        marginal = (
            self.costs.draft_scale.value * self.profile.c
            + self.costs.target_scale.value * marginal_verify
        )
        return min(0.95, rate * marginal)

    def could_win(self) -> bool:
        """Whether some k beats plain decoding if every draft token were accepted.

        If not, the costs alone rule speculation out (a k-token call costs k one-token calls,
        say) and no acceptance could change that: probing would only pay for the draft
        catching up on the plain stretch.
        """
        plain = self.predicted(0)
        for k in range(1, self.max_k + 1):
            if (k + 1) / self.scaled_cost(k) > plain:
                return True
        return False

    def best_k(self) -> int:
        """The k in 0..max_k with the best prediction."""
        return max(range(self.max_k + 1), key=self.predicted)

    def __post_init__(self) -> None:
        self._probe_interval = 0  # plain steps before the next probe; 0: not falling back
        self._probing = 0  # the step under way is a probe: the interval it was due after
        self._after_plain = False  # the last step observed was plain
        self._setting_up = False  # the step under way is a response's first
        # For the step under way: the chance of bringing a token that one more draft token
        # must have to pay for itself (also the least acceptance expected of tokens past
        # the first), and what `goes_on` weighs against it: the chance of being kept by
        # confidence bin and the acceptance rate by draft position.
        self.threshold = self.fixed_p_min or 0.0
        self._chances = self.calibration.fitted()  # chance of being kept, by confidence bin
        self._following = [self.tracker.prior_rate]  # acceptance rate by draft position

    def choose(self) -> int:
        """The draft length of the next step (0: plain); sets what `goes_on` weighs."""
        self.threshold = self.p_min()
        self._chances = self.calibration.fitted()
        self._following = self.tracker.rates(self.max_k + 1)
        best = self.best_k()
        if best == 0 and self.tree_size is None:
            # Little experience yet (a response's first tokens are often missed): speculate
            # while an upper bound of the acceptance still says it could win. Not for a tree
            # drafter: every step of it costs the whole tree, however short the draft asked.
            hopeful = max(range(1, self.max_k + 1), key=lambda k: self.predicted(k, OPTIMISM))
            if self.predicted(hopeful, OPTIMISM) > self.predicted(0):
                best = hopeful
        if best > 0:
            self.steps_since_probe = 0
            self._probe_interval = 0  # set by the next fall-back
            if self.drafter_cuts and self.fixed_p_min is None:
                # The average rates by position only cap a draft that would go on further
                # where its own confidence says each token pays (sure stretches of text).
                return self.max_k
            return best
        self.steps_since_probe += 1
        if not self._probe_interval:
            # The estimate that falls back has as many speculative steps behind it as the
            # tracker has seen; the first probe weighs it against fresh evidence as many
            # steps later. (Two early misses, by chance, would otherwise leave a response
            # plain for `probe_every` steps where most drafts are kept.) A policy that its
            # prior keeps plain before any draft (a tree dearer than a plain step) probes at
            # the usual pace: no chance streak sent it there.
            self._probe_interval = self.probe_every
            if self.tracker.steps:
                evidence = max(self.min_probe_every, self.tracker.steps)
                self._probe_interval = min(self.probe_every, evidence)
        if self.steps_since_probe >= self._probe_interval and self.could_win():
            # A probe: one short speculative step keeps the acceptance estimate fresh. While
            # probes keep finding speculation a loss they come ever less often, so their
            # cost fades (one that wins keeps the pace: `observe`); once speculation
            # resumes, the next fall-back sets the interval afresh.
            self.steps_since_probe = 0
            self._probing = self._probe_interval
            self._probe_interval = min(2 * self._probe_interval, self.max_probe_every)
            return max(range(1, min(4, self.max_k) + 1), key=self.predicted)
        self.plain_steps += 1
        if self.steps_since_probe <= self.fade_after:
            return 0
        # The acceptance estimate stays as it was (fading it toward the prior would bring
        # speculation back on no evidence; probes refresh it), but a measured overhead of
        # speculating, or a slow spell of the draft model, may have been passing: once
        # faded, speculative steps measure them again. (Kept, one slow step could rule
        # speculation out for good: plain steps never time the draft model.) Only what
        # makes speculating dearer than calibrated fades: steps measured to run cheaper
        # are measured again as soon as speculation resumes, while fading them would
        # restore the calibration's error (a point of the curve ~10% too dear, measured
        # once) and, at break-even, keep a response plain.
        if self.costs.spec_overhead.value > 0:
            self.costs.spec_overhead.fade(self.cost_fade)
        if self.costs.draft_scale.value > 1:
            self.costs.draft_scale.fade(self.cost_fade)
        for own in self.costs.size_overhead.values():
            if own.value > 0:
                own.fade(self.cost_fade)
        return 0

    def new_response(self) -> None:
        """A response starts: its first step also pays for setting up (buffers allocated
        anew after the prefill, a cache that grows), not only for its calls, so its time
        teaches no costs."""
        self._setting_up = True
        self._probing = 0  # a probe cut off (Ctrl-C in a chat) is not this response's

    def goes_on(self, confidences: tuple[float, ...]) -> bool:
        """Whether a draft of these confidences so far should draft one more token: the
        chance that all of them are kept and the next one too covers its cost (`p_min`);
        a user's fixed p_min is a confidence the last token must reach, as llama.cpp's."""
        if self.fixed_p_min is not None:
            return confidences[-1] >= self.fixed_p_min
        kept = 1.0
        for confidence in confidences:
            kept *= self._chances[self.calibration.bin_of(confidence)]
        following = self._following[min(len(confidences), len(self._following) - 1)]
        return kept * following >= self.threshold

    def observe(
        self,
        depth: int,
        n_accepted: int,
        n_drafted: int,
        is_tree: bool,
        seconds: float | None = None,
        draft_seconds: float | None = None,
        *,
        requested: int | None = None,
        confidences: tuple[float, ...] | None = None,
    ) -> None:
        """One step's outcome: a draft of `depth` positions (`n_drafted` tokens, a tree's
        nodes for a tree) where `requested` were asked for (default: as many as drafted),
        `n_accepted` kept. `seconds`, its wall time, and `draft_seconds`, the part the draft
        model's calls took (measured apart only for a draft model), refine the costs;
        `confidences`, the draft's probability of each token, what its confidence says."""
        unit = self.profile.target_call_seconds
        setting_up, self._setting_up = self._setting_up, False
        after_plain, self._after_plain = self._after_plain, depth == 0
        probing, self._probing = self._probing, 0
        if depth == 0:
            self.tracker.plain_step()
            if seconds is not None and not setting_up:
                self.costs.target_scale.observe(seconds / unit)
            return
        if probing and (n_accepted + 1) * self.scaled_cost(0) > self.scaled_cost(n_drafted):
            # A probe that brought more tokens than plain steps would have in its time (as
            # the costs price it) is no sign that speculation keeps losing: the next one
            # comes as soon as this one did. (Doubled on every probe, at break-even a few
            # misses by chance kept a response plain.)
            self._probe_interval = probing
        requested = depth if is_tree or requested is None else requested
        passed, chance = None, 0.0
        if confidences and not is_tree:
            passed = self.goes_on(confidences[:1])
            chance = self.calibration.chance_of(confidences[0])
            self.calibration.observe(confidences, n_accepted)
        self.tracker.observe(depth, n_accepted, requested, passed, chance)
        if is_tree:
            self.tree_size = n_drafted + 1
        # The first speculative step after plain ones (a probe, or speculation coming back)
        # also pays for the draft model catching up on the plain stretch: a cost of falling
        # back, not of speculating. Counted, it would time the draft model slow and send
        # the policy back to plain decoding, whose next return would pay it again.
        if after_plain or setting_up:
            return
        draft_call = self.profile.draft_call_seconds
        if draft_seconds is not None and draft_call and self.uses_draft_model:
            self.costs.draft_scale.observe(
                draft_seconds / (n_drafted * draft_call), calls=n_drafted
            )
        if seconds is not None:
            # The step's cost as modelled at the measured scales, its overhead left out.
            excess = seconds / unit - self._cost(n_drafted, None, measured=True)
            self.costs.spec_overhead.observe(excess)
            self._age_sizes()
            self.costs.size_overhead.setdefault(n_drafted + 1, Overhead(prior_weight=0.0)).observe(
                excess
            )
