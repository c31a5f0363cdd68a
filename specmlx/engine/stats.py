"""Running statistics of a generation: what `stream_generate` reports after each step.

`Stats.merge` adds up several generations (a chat session's turns): counts are summed,
position by position too, the peak memory is the highest, and the time to first token is
the mean over the responses merged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import zip_longest
from typing import Any

import mlx.core as mx

from specmlx.engine.step import Step


@dataclass(frozen=True)
class Stats:
    """Running totals of a generation. Times are wall seconds after a sync."""

    prompt_tokens: int = 0
    tokens: int = 0
    target_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_by_position: tuple[int, ...] = ()
    accepted_by_position: tuple[int, ...] = ()
    time_to_first_token: float = 0.0
    decode_seconds: float = 0.0
    peak_memory_gb: float = 0.0
    plain_steps: int = 0  # steps without a draft (k = 0), e.g. adaptive k falling back
    responses: int = 1  # generations these totals cover; time_to_first_token is their mean

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        return tuple(
            a / d if d else 0.0
            for a, d in zip(self.accepted_by_position, self.drafted_by_position, strict=True)
        )

    def add(self, step: Step, elapsed: float) -> Stats:
        """These totals after one more step; `elapsed` is the time since the start."""
        drafted = _count_positions(self.drafted_by_position, step.draft_depth)
        accepted = _count_positions(self.accepted_by_position, step.n_accepted, len(drafted))
        return replace(
            self,
            tokens=self.tokens + len(step.tokens),
            target_calls=self.target_calls + 1,
            drafted=self.drafted + step.n_drafted,
            accepted=self.accepted + step.n_accepted,
            drafted_by_position=drafted,
            accepted_by_position=accepted,
            time_to_first_token=self.time_to_first_token or elapsed,
            decode_seconds=self.decode_seconds + step.seconds,
            peak_memory_gb=mx.get_peak_memory() / 1e9,
            plain_steps=self.plain_steps + (step.k == 0),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "tokens": self.tokens,
            "target_calls": self.target_calls,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_call": self.tokens_per_call,
            "acceptance_by_position": list(self.acceptance_by_position),
            "tokens_per_sec": self.tokens_per_sec,
            "time_to_first_token": self.time_to_first_token,
            "decode_seconds": self.decode_seconds,
            "peak_memory_gb": self.peak_memory_gb,
            "plain_steps": self.plain_steps,
            "responses": self.responses,
        }

    def merge(self, other: Stats) -> Stats:
        """Totals over the generations of both (chat turns); `Stats(responses=0)` is none."""
        responses = self.responses + other.responses
        ttft_sum = (
            self.time_to_first_token * self.responses + other.time_to_first_token * other.responses
        )
        return Stats(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            tokens=self.tokens + other.tokens,
            target_calls=self.target_calls + other.target_calls,
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            drafted_by_position=_sum_positions(self.drafted_by_position, other.drafted_by_position),
            accepted_by_position=_sum_positions(
                self.accepted_by_position, other.accepted_by_position
            ),
            time_to_first_token=ttft_sum / responses if responses else 0.0,
            decode_seconds=self.decode_seconds + other.decode_seconds,
            peak_memory_gb=max(self.peak_memory_gb, other.peak_memory_gb),
            plain_steps=self.plain_steps + other.plain_steps,
            responses=responses,
        )


def _count_positions(counts: tuple[int, ...], n: int, length: int = 0) -> tuple[int, ...]:
    """Add one to each of the first n positions, growing the tuple to at least `length`."""
    grown = counts + (0,) * max(0, n - len(counts), length - len(counts))
    return tuple(c + (i < n) for i, c in enumerate(grown))


def _sum_positions(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Position-wise sums; the shorter is padded with zeros (a turn may draft deeper)."""
    return tuple(x + y for x, y in zip_longest(a, b, fillvalue=0))
