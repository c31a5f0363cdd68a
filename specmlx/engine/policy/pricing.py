"""What a step costs now: the calibrated costs, at the machine's current speed, plus what
speculative steps measured beyond them.

The calibration (`specmlx.engine.costs.CostProfile`) prices a step drafting D tokens and verifying n
as D·c + v(n) one-token target calls. Two things it cannot know are measured as the steps
run (docs/adaptive-k.md):

- speed: how fast one-token calls run now against their calibrated time. Plain steps time a
  target call, a draft model's calls are timed apart from the verify call; both feed one
  decaying mean, because a slow spell of a shared machine slows every call alike. It
  multiplies every price, plain steps' included, so a spell moves no decision.
- a proposal's own cost, for drafters that pay one per step whatever its length (heads'
  trees: `DrafterTraits.proposal_cost`, measured when they load), plus what each level it
  grows adds (an EAGLE tree: `DrafterTraits.level_cost`): priced into every speculative
  step at the depth asked for, an empty proposal's included.
- c: a draft call's cost over a target call's, from the draft calls and the verify call of
  the same step (a spell slows both alike): a draft model calibrated too dear, say by a
  calibration taken while something else ran, is priced as it runs.
- overhead: what a speculative step costs beyond its modelled calls at that speed (host
  syncs, sampling, kernels a GPU builds for a new shape, a calibration point that was off),
  per number of tokens verified, each size leaning on the mean over all sizes (a proposal
  that came back empty, one token verified, leans on the calibration's 0 instead).

`LearnedCosts` lives with the loaded models (`specmlx.api.models.Models`), keyed by drafter kind and
sampler, so a response starts from what earlier ones measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specmlx.engine.costs import CostProfile
from specmlx.engine.policy.estimators import Decaying

# Cost memory: 0.9 per step (about ten steps): timing is precise, and the machine drifts.
COST_DECAY = 0.9
# Speed starts at the calibration, worth half a call: a few timed calls outweigh it.
SPEED_PRIOR_WEIGHT = 0.5
# The calibration's overhead of 0 counts as four steps of evidence that age like the rest:
# believed until several steps disagree, outweighed once many have.
OVERHEAD_SEED_WEIGHT = 4.0
# Steps of evidence the overhead over all sizes counts for in one size's own estimate.
SIZE_PRIOR_WEIGHT = 2.0
# One step moves the estimates only so far: a hiccup (a page fault, another process) is
# not the machine's speed. Speed as a ratio to calibrated; overhead in one-token calls.
SPEED_CLIP = (0.2, 5.0)
OVERHEAD_CLIP = (-1.0, 2.0)
# A long draft's calls count as this many observations of speed, not as many as it drafted.
MAX_CALLS_PER_STEP = 4.0


@dataclass
class LearnedCosts:
    """What steps measured of one combination's costs, beyond its calibration."""

    speed: Decaying = field(default_factory=lambda: Decaying(COST_DECAY, SPEED_PRIOR_WEIGHT))
    overhead: Decaying = field(
        default_factory=lambda: Decaying.seeded(0.0, OVERHEAD_SEED_WEIGHT, COST_DECAY)
    )
    by_size: dict[int, Decaying] = field(default_factory=dict)
    # Measured c over calibrated c; the calibration counts as much as it does for speed.
    c_ratio: Decaying = field(default_factory=lambda: Decaying(COST_DECAY, SPEED_PRIOR_WEIGHT))

    def observe_speed(self, ratio: float, calls: float = 1.0) -> None:
        ratio = min(max(ratio, SPEED_CLIP[0]), SPEED_CLIP[1])
        self.speed.observe(ratio, min(calls, MAX_CALLS_PER_STEP))

    def observe_c_ratio(self, ratio: float) -> None:
        self.c_ratio.observe(min(max(ratio, SPEED_CLIP[0]), SPEED_CLIP[1]))

    def observe_overhead(self, size: int, excess: float) -> None:
        excess = min(max(excess, OVERHEAD_CLIP[0]), OVERHEAD_CLIP[1])
        if size > 1:
            self.overhead.observe(excess)  # an empty proposal is no guide to a draft's
        for own in self.by_size.values():
            own.age()  # a size no longer drafted leans back on its prior
        self.by_size.setdefault(size, Decaying(COST_DECAY, SIZE_PRIOR_WEIGHT)).add(excess)

    def overhead_at(self, size: float) -> float:
        """The overhead of a step verifying `size` tokens (interpolated between sizes).

        A step verifying one token is a proposal that came back empty: its own estimate
        leans on the calibration (0), not on the drafts' pooled overhead. A draft's
        overhead is mostly the calibration's error at its size (v(n) timed dearer or
        cheaper than the loop runs it), which an empty proposal, a one-token call, does not
        share: leaning on the pooled overhead of SmolLM2-135M's 8-token Medusa trees, which
        ran well under their calibrated v(8), an empty proposal was priced below a plain
        step, where it costs a plain step and the heads."""
        pooled = self.overhead.mean()

        def at(n: int) -> float:
            prior = pooled if n > 1 else 0.0
            own = self.by_size.get(n)
            return prior if own is None else own.mean(prior)

        low = int(size)
        share = size - low
        return at(low) if share == 0 else (1 - share) * at(low) + share * at(low + 1)

    def fade(self, factor: float) -> None:
        """Plain steps cannot measure a speculative step's overhead: what was measured above
        the calibration shrinks back toward it. What was measured below stays until
        speculation measures again (faded, the calibration's own error would come back)."""
        for estimate in (self.overhead, *self.by_size.values()):
            if estimate.mean() > 0:
                estimate.fade(factor, toward=0.0)


@dataclass
class Pricing:
    """Prices of steps in calibrated one-token target calls, for one drafter."""

    profile: CostProfile
    learned: LearnedCosts
    uses_model: bool  # drafted tokens cost c each
    tree_size: int | None = None  # every step of a tree drafter verifies its whole tree
    # One proposal's own cost by the levels it grows, in calibrated calls
    # (`DrafterTraits.proposal`); none by default.
    proposal: Callable[[int], float] = lambda levels: 0.0

    @property
    def speed(self) -> float:
        return self.learned.speed.mean(1.0)

    @property
    def c(self) -> float:
        """A drafted token's price in target calls (0 without a model): the calibrated c as
        the steps measured it."""
        return self.profile.c * self.learned.c_ratio.mean(1.0) if self.uses_model else 0.0

    def plain(self) -> float:
        return self.speed

    def modelled(self, drafted: float, verified: float, levels: int = 0) -> float:
        """The calibrated calls of a speculative step: the proposal (`levels` deep), drafted
        tokens at c each, one verify call."""
        return self.proposal(levels) + drafted * self.c + self.profile.verify_cost(verified)

    def verified(self, drafted: float) -> float:
        return self.tree_size if self.tree_size is not None else drafted + 1

    def step(self, drafted: float, offered: float = 1.0, levels: int = 0) -> float:
        """A speculative step drafting `drafted` tokens (an expectation, maybe), at the
        current speed, with its measured overhead. A proposal, `levels` deep, offers a
        draft with chance `offered`; otherwise it paid for itself and a one-token call. A
        tree's size does not depend on what it offers; a chain's expected length counts its
        empty proposals as 0, so when offered it is `drafted / offered` long."""
        if offered < 1.0:
            empty = self.modelled(0, 1, levels) + self.learned.overhead_at(1)
            if offered <= 0.0:
                return max(self.speed * empty, 0.1 * self.speed)
            if self.tree_size is None:
                drafted /= offered
        verified = self.verified(drafted)
        price = self.modelled(drafted, verified, levels) + self.learned.overhead_at(verified)
        if offered < 1.0:
            price = offered * price + (1.0 - offered) * empty
        return max(self.speed * price, 0.1 * self.speed)

    def learn(
        self,
        seconds: float,
        drafted: int,
        verified: int,
        draft_seconds: float | None,
        plain: bool = False,
        levels: int = 0,
    ) -> None:
        """A step's wall time, and its draft calls' part. A plain step times the target's
        speed; a speculative one (an empty proposal's too: it verified the root alone, after
        a proposal `levels` deep) what it cost beyond its model."""
        unit = self.profile.target_call_seconds
        if plain:
            self.learned.observe_speed(seconds / unit)
            return
        draft_call = self.profile.draft_call_seconds
        if draft_seconds is not None and draft_call and self.uses_model and drafted:
            self.learned.observe_speed(draft_seconds / (drafted * draft_call), calls=drafted)
            verify_seconds = seconds - draft_seconds
            if verify_seconds > 0 and self.profile.c > 0:
                # One draft call over one target call, both timed in this step.
                per_call = verify_seconds / self.profile.verify_cost(verified)
                self.learned.observe_c_ratio(draft_seconds / drafted / per_call / self.profile.c)
        excess = seconds / unit / self.speed - self.modelled(drafted, verified, levels)
        self.learned.observe_overhead(verified, excess)
