"""A fixed draft length (`-k N`), optionally cut short on the drafter's own doubt."""

from __future__ import annotations

from dataclasses import dataclass

from specmlx.engine.step import Plan, Step
from specmlx.errors import UsageError


@dataclass
class FixedK:
    """Always ask for k tokens (0: plain decoding). With `p_min`, a drafter that reports
    confidence ends its draft after a token less probable than that (llama.cpp's
    `--draft-p-min`; here that token is still verified, its call being spent)."""

    k: int
    p_min: float | None = None

    def __post_init__(self) -> None:
        if self.k < 0:
            raise UsageError(f"k must be at least 1 (or auto), got {self.k}")
        if self.p_min is not None and not 0 <= self.p_min <= 1:
            raise UsageError(f"p_min must be between 0 and 1, got {self.p_min}")
        self._plan = Plan(self.k, self._confident_enough if self.p_min else None)

    def _confident_enough(self, confidences: tuple[float, ...]) -> bool:
        return confidences[-1] >= self.p_min

    def start(self) -> None:
        pass

    def choose(self) -> Plan:
        return self._plan

    def observe(self, step: Step) -> None:
        pass
