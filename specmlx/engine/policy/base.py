"""What the loop and a policy say to each other: a `Plan` before a step, an `Outcome` after.

The loop always has a policy: `FixedK` for `-k N`, `AdaptiveK` for `-k auto`, and plain
decoding is a policy whose plans are all k = 0. Before each step the loop asks `choose()`
for a plan; after the step's one sync it reports what happened with `observe(outcome)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from specmlx.engine.draft import StopRule


@dataclass(frozen=True)
class Plan:
    """What to do in the next step."""

    k: int  # tokens to ask the drafter for; 0: a plain step
    stop: StopRule | None = None  # ends a draft early (drafters that report confidence)
    time_draft: bool = False  # time the drafter's calls apart from the verify call


@dataclass(frozen=True)
class Outcome:
    """What one step did, as the policy learns from it."""

    requested: int  # tokens asked for (after the max_tokens cap); 0: a plain step
    drafted: int  # tokens the target verified besides the last one (tree nodes too)
    depth: int  # the longest path the draft offered
    accepted: int
    seconds: float  # wall time of the step, measured after its sync
    # The drafter's part: tree steps always (their proposal syncs), chains when the plan
    # asked for it. Only a draft model's time is learned from.
    draft_seconds: float | None = None
    confidences: tuple[float, ...] | None = None  # the drafter's, where it reports them
    tree: bool = False

    @property
    def plain(self) -> bool:
        return self.drafted == 0


class Policy(Protocol):
    """Chooses each step's draft length."""

    def start(self) -> None:
        """A response begins (its first step also pays for setting up)."""

    def choose(self) -> Plan:
        """The plan of the next step."""

    def observe(self, outcome: Outcome) -> None:
        """What the step that followed the last plan did."""
