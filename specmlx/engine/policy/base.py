"""The policy protocol: how far to draft, asked before every step, told what happened after.

The loop always has a policy: `FixedK` for `-k N`, `AdaptiveK` for `-k auto`, and plain
decoding is a policy whose plans are all k = 0. Before each step the loop asks `choose()`
for a `Plan`; after the step's sync it hands the policy the step's one record, the same
`Step` the caller receives (`specmlx.engine.step`).
"""

from __future__ import annotations

from typing import Protocol

from specmlx.engine.step import Plan, Step


class Policy(Protocol):
    """Chooses each step's draft length."""

    def start(self) -> None:
        """A response begins (its first step also pays for setting up)."""

    def choose(self) -> Plan:
        """The plan of the next step."""

    def observe(self, step: Step) -> None:
        """What the step that followed the last plan did."""
