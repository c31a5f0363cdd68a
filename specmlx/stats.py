"""Running statistics of a generation: what `stream_generate` reports after each step."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx

from specmlx.decode import Step


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
        }


def _count_positions(counts: tuple[int, ...], n: int, length: int = 0) -> tuple[int, ...]:
    """Add one to each of the first n positions, growing the tuple to at least `length`."""
    grown = counts + (0,) * max(0, n - len(counts), length - len(counts))
    return tuple(c + (i < n) for i, c in enumerate(grown))


def merge(total: Stats, turn: Stats) -> Stats:
    """Totals over several generations (chat turns)."""
    return replace(
        total,
        prompt_tokens=total.prompt_tokens + turn.prompt_tokens,
        tokens=total.tokens + turn.tokens,
        target_calls=total.target_calls + turn.target_calls,
        drafted=total.drafted + turn.drafted,
        accepted=total.accepted + turn.accepted,
        decode_seconds=total.decode_seconds + turn.decode_seconds,
        plain_steps=total.plain_steps + turn.plain_steps,
        peak_memory_gb=max(total.peak_memory_gb, turn.peak_memory_gb),
    )
