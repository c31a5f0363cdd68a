"""Adaptive k (`-k auto`): before each step, the draft length with the most tokens per time.

For every k at once the policy computes E(k), the tokens a step asked for k yields, and D(k),
the tokens the drafter drafts (`estimators.expectations`), prices each step (`pricing`), and
takes the k with the best E(k)/cost(k); k = 0, a plain step, yields one token for one call.
A drafter that reports confidence is asked for up to `max_k` whenever speculating wins, and
ends its draft where one more token no longer pays (`goes_on`). While evidence is thin the
policy falls back to plain decoding only if an optimistic bound loses too; once plain, it
probes now and then. docs/adaptive-k.md has the equations and each constant's reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specmlx.engine.costs import CostProfile
from specmlx.engine.policy.estimators import AcceptanceRates, ConfidenceBins, expectations
from specmlx.engine.policy.pricing import LearnedCosts, Pricing
from specmlx.engine.step import DrafterTraits, Plan, Step

# Standard errors added to the first position's acceptance before falling back: one, so a
# response's first misses (its first tokens are often missed) do not decide alone.
OPTIMISM = 1.0
# A probe asks for a short draft: enough to see acceptance, cheap when it loses.
PROBE_K = 4
# The draft-length span over which one more verified token is priced: the mean slope of
# v(n) over a typical draft, not the slope at one (noisy) calibration point.
MARGINAL_SPAN = 8
# A probe must be able to win by this much with every token kept: a smaller win is within
# the noise of timing, and probing for it costs more than it can bring.
MIN_WIN = 0.05
# The stop threshold never demands more than this chance: a draft is always allowed to go
# on where its tokens are all but certain.
MAX_THRESHOLD = 0.95
# The longest run of plain steps committed to at once (the loop double-buffers a run):
# only fading moves the rates meanwhile, slowly, and after this many steps they are read
# again.
MAX_PLAIN_RUN = 16


@dataclass
class Probing:
    """When a policy that fell back to plain decoding tries speculating again.

    A fall-back that rests on few speculative steps is probed as many steps later (at least
    `min_every`): two early misses are weak evidence. Probes that lose come ever less often
    (doubling up to `max_every`), so their cost fades; after one that wins the next comes
    within `min_every` steps.
    """

    every: int = 16  # plain steps before a probe, for a policy plain from its start
    min_every: int = 2
    max_every: int = 256
    # A plain step or two between drafts is part of speculating: costs fade only after
    # this many plain steps in a row, by `fade` per step (a fifth left after 16 more).
    fade_after: int = 3
    fade: float = 0.9
    interval: int = 0  # plain steps before the next probe; 0: not falling back
    since: int = 0  # plain steps since the last speculative step

    def fell_back(self, evidence: int) -> None:
        if not self.interval:
            self.interval = self.every
            if evidence:
                self.interval = min(self.every, max(self.min_every, evidence))

    def due(self) -> bool:
        return self.since >= self.interval

    def probed(self) -> None:
        """A probe starts: the next one, should this one lose, comes twice as late."""
        self.since = 0
        self.interval = min(2 * self.interval, self.max_every)


@dataclass
class Experience:
    """What adaptive k learned of a drafter besides its costs: how often its drafts are
    kept (by position, and by its confidence), the size its trees came to, and when it next
    probes after falling back. Kept with the loaded models, as `LearnedCosts` are, so that
    the next response (a script's next call, the bench's next prompt) starts from what the
    last ones saw rather than from the drafter's prior alone. What they saw counts for a
    new response as a prior does (`AcceptanceRates.carried`), and its probing wait is cut
    back to `Probing.every`: a response of another kind is not held to the last one's
    rates."""

    acceptance: AcceptanceRates
    confidence: ConfidenceBins = field(default_factory=ConfidenceBins)
    probing: Probing = field(default_factory=Probing)
    tree_size: int | None = None  # the tokens its last tree verified


@dataclass
class AdaptiveK:
    """Chooses k per step from calibrated costs and acceptance learned as it goes."""

    profile: CostProfile
    traits: DrafterTraits
    learned: LearnedCosts = field(default_factory=LearnedCosts)
    max_k: int = 16
    p_min: float | None = None  # a user's fixed confidence threshold; None: from the costs
    experience: Experience | None = None  # None: from the drafter's prior
    plain_steps: int = 0

    def __post_init__(self) -> None:
        if self.traits.max_depth is not None:
            # No path is deeper (heads: their count; an EAGLE tree: its levels); a longer k
            # would be priced as if its deeper positions could be drafted.
            self.max_k = min(self.max_k, self.traits.max_depth)
        if self.experience is None:
            self.experience = Experience(AcceptanceRates(self.traits.prior_acceptance))
        self.pricing = Pricing(
            self.profile,
            self.learned,
            self.traits.uses_model,
            self.experience.tree_size or self.traits.tree_size,
            self.traits.proposal,
        )
        self.acceptance = self.experience.acceptance
        self.confidence = self.experience.confidence
        self.probing = self.experience.probing
        self._probe = False  # the step under way is a probe
        self._teaches_costs = False  # the step under way may teach costs
        self._after_plain = True
        self._threshold = 0.0
        self._chances: list[float] = []
        self._following: list[float] = []

    # -- predictions --------------------------------------------------------------------

    def rates(self, optimism: float = 0.0) -> list[float]:
        """Predicted tokens per calibrated call-time of a step asked for k, k = 0..max_k."""
        curve = self.acceptance.curve(self.max_k, optimism)
        tokens, drafted = expectations(curve)
        offered = self.acceptance.offered.mean(1.0)
        plain = [1.0 / self.pricing.plain()]
        return plain + [
            tokens[k] / self.pricing.step(drafted[k], offered, levels=k)
            for k in range(1, self.max_k + 1)
        ]

    def could_win(self) -> bool:
        """Whether some k beats plain decoding if every drafted token were kept: if not,
        the costs alone rule speculation out, and probing would only waste steps."""
        plain = 1.0 / self.pricing.plain()
        return any(
            (k + 1) / self.pricing.step(k, levels=k) > plain * (1 + MIN_WIN)
            for k in range(1, self.max_k + 1)
        )

    # -- the protocol -------------------------------------------------------------------

    def start(self) -> None:
        """A response's first step also pays for setting up (buffers allocated anew after
        the prefill): its time teaches no costs. A probe cut off with the last response
        (Ctrl-C in a chat) is not this one's."""
        self._teaches_costs = False
        self._probe = False
        self.acceptance.carried()
        # A response probes within `every` plain steps whatever the last one's wait came to.
        self.probing.interval = min(self.probing.interval, self.probing.every)

    def choose(self) -> Plan:
        rates = self.rates()
        best = max(range(self.max_k + 1), key=rates.__getitem__)
        if best == 0 and self.traits.tree_size is None:
            # Little experience yet: keep speculating while an optimistic bound could win.
            # (Not for a tree drafter: each of its steps costs the whole tree.)
            hopeful = self.rates(OPTIMISM)
            best = max(range(self.max_k + 1), key=hopeful.__getitem__)
        if best > 0:
            self.probing.interval = self.probing.since = 0
            return self._speculate(best, rates)
        self.probing.fell_back(self.acceptance.steps)
        self.probing.since += 1
        could_win = self.could_win()
        if self.probing.due() and could_win:
            self._probe = True
            self.probing.probed()
            k = max(range(1, min(PROBE_K, self.max_k) + 1), key=rates.__getitem__)
            return self._speculate(k, rates)
        # Plain until the next probe is due: each choice until then would be plain too.
        run = MAX_PLAIN_RUN
        if could_win:
            run = max(1, min(self.probing.interval - self.probing.since, MAX_PLAIN_RUN))
        for since in range(self.probing.since, self.probing.since + run):
            if since > self.probing.fade_after:
                self.learned.fade(self.probing.fade)
        self.probing.since += run - 1  # the run's first step was counted above
        self.plain_steps += run
        return Plan(0, run=run)

    def _speculate(self, k: int, rates: list[float]) -> Plan:
        if not self.traits.reports_confidence:
            return Plan(k)
        # The draft decides its own length: the rates by position would only cap a sure
        # stretch. One more token costs a draft call and one more verified token, at the
        # best rate the time could otherwise earn.
        self._threshold = self.p_min if self.p_min is not None else self._auto_threshold(rates)
        self._chances = self.confidence.fitted()
        self._following = [rate for _, rate in self.acceptance.curve(self.max_k + 1)]
        return Plan(self.max_k, self.goes_on, time_draft=self.traits.uses_model)

    def _auto_threshold(self, rates: list[float]) -> float:
        span = min(MARGINAL_SPAN, self.max_k)
        slope = max((self.profile.verify_cost(1 + span) - 1.0) / span, 0.0)
        marginal = self.pricing.speed * (self.pricing.c + slope)
        return min(MAX_THRESHOLD, max(rates) * marginal)

    def goes_on(self, confidences: tuple[float, ...]) -> bool:
        """Whether a draft of these confidences so far should draft one more token: the
        chance that all are kept and the next one too covers its cost. A user's p_min is a
        confidence the last token must reach, as llama.cpp's."""
        if self.p_min is not None:
            return confidences[-1] >= self.p_min
        kept = 1.0
        for confidence in confidences:
            kept *= self._chances[self.confidence.bin_of(confidence)]
        following = self._following[min(len(confidences), len(self._following) - 1)]
        return kept * following >= self._threshold

    def observe(self, step: Step) -> None:
        teaches, self._teaches_costs = self._teaches_costs, True
        # A proposal that cost something speculated, even when it came back empty.
        empty = step.plain and step.proposed and self.traits.pays_per_proposal
        after_plain, self._after_plain = self._after_plain, step.plain and not empty
        probe, self._probe = self._probe, False
        if step.plain and not empty:
            # A plain call, or a proposal that cost next to nothing and came back empty.
            self.acceptance.plain_step()
            if teaches:
                self.pricing.learn(step.seconds, 0, 1, None, plain=True)
            return
        verified = step.n_drafted + 1
        if self.traits.pays_per_proposal:
            # An empty proposal brought only the target's token for its cost: it lowers the
            # rate at which proposals offer anything, not the acceptance of what they offer.
            self.acceptance.offer(not empty)
        if step.tree:
            self.pricing.tree_size = self.experience.tree_size = verified  # what trees cost now
        levels = step.requested  # an EAGLE tree grows one level per token asked for
        if probe and (step.n_accepted + 1) * self.pricing.plain() > self.pricing.step(
            step.n_drafted, levels=levels
        ):
            # A probe that brought more tokens than plain steps would have in its time: the
            # next one comes soon, so a recovered acceptance is found in a few steps.
            self.probing.interval = self.probing.min_every
        if empty:
            self.acceptance.plain_step()  # the context goes on with the target's own token
        else:
            requested = step.draft_depth if step.tree else step.requested
            self.acceptance.observe(requested, step.draft_depth, step.n_accepted)
        if step.confidences and not step.tree:
            self.confidence.observe(step.confidences, step.n_accepted)
        # The first speculative step after plain ones also pays for the draft model
        # catching up on the plain stretch: a cost of falling back, not of speculating.
        if teaches and not after_plain:
            # A free draft (a suffix match, in a hybrid with a draft model) ran no draft call.
            drafted = 0 if step.free else step.n_drafted
            draft_seconds = None if step.free else step.draft_seconds
            self.pricing.learn(step.seconds, drafted, verified, draft_seconds, levels=levels)
