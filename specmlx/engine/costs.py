"""The cost model of speculative decoding: what a step costs, what it yields, the speedup.

Following Leviathan et al. (2023), with γ tokens drafted per step and each accepted with
probability α, one step yields E = (1 - α^(γ+1)) / (1 - α) tokens on average (γ + 1 when
α = 1). Measured in one-token target calls, the step costs γ·c (c: one draft call over one
target call; 0 for drafters without a model) plus v(γ+1), the cost of the target scoring
γ + 1 tokens at once (1 in a purely memory-bound regime, up to γ + 1 in a compute-bound one).
The predicted speedup over plain decoding is E / (γ·c + v(γ+1)).

The formulas are pure functions; `measure_costs` times c and v(k) for a loaded pair on this
device, and `CostProfile` combines the two (the bench prints its prediction next to the
measurement; adaptive k picks the γ it says is best).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from specmlx.engine.anatomy import vocab_rows
from specmlx.engine.cache import Sequence


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens one step yields on average: accepted drafts plus the target's own token."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 1:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def acceptance_from_tokens(tokens_per_step: float, gamma: int) -> float:
    """The α for which E(α, γ) equals a measured mean of tokens per step.

    The inverse of `expected_tokens`, found by bisection (E rises with α). This is the α to
    plug into the model: accepted/drafted is not, since drafts after a rejection count as
    drafted but never had their chance (at α = 0.8, γ = 4 it reads 0.59).
    """
    if tokens_per_step <= 1:
        return 0.0
    if tokens_per_step >= gamma + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens(mid, gamma) < tokens_per_step else (low, mid)
    return (low + high) / 2


def step_cost(gamma: int, c: float, v_verify: float) -> float:
    """One step's time in one-token target calls: γ draft calls and one (γ+1)-token call."""
    return gamma * c + v_verify


def predicted_speedup(alpha: float, gamma: int, c: float, v_verify: float) -> float:
    """Tokens per unit time over plain decoding's one token per one-token call."""
    return expected_tokens(alpha, gamma) / step_cost(gamma, c, v_verify)


@dataclass(frozen=True)
class CostProfile:
    """Measured call times of a pair on one device, and the ratios the model needs."""

    target_call_seconds: float  # one-token target call
    draft_call_seconds: float | None  # one-token draft call; None without a draft model
    v: dict[int, float]  # k -> k-token target call over a one-token call (v[1] == 1)
    # Sizes of v not timed (a calibration out of time): interpolated between timed ones.
    interpolated: tuple[int, ...] = ()

    @property
    def c(self) -> float:
        """One draft call over one target call (0 without a draft model)."""
        if self.draft_call_seconds is None:
            return 0.0
        return self.draft_call_seconds / self.target_call_seconds

    def verify_cost(self, n_tokens: int) -> float:
        """v(n), linearly interpolated or extrapolated from the measured points.

        Past the measured range (a 30-token Lookahead tree, say) the line goes on from the
        last point with the slope over the upper half of the range, never downward: the last
        two points alone can slope down by noise, which would make a 30-token call cheaper
        than a 16-token one.
        """
        if n_tokens in self.v:
            return self.v[n_tokens]
        ks = sorted(self.v)
        below = [k for k in ks if k < n_tokens]
        above = [k for k in ks if k > n_tokens]
        if not below:
            return self.v[ks[0]]
        if above:
            lower, upper = below[-1], above[0]
            slope = (self.v[upper] - self.v[lower]) / (upper - lower)
            return self.v[lower] + slope * (n_tokens - lower)
        last = ks[-1]
        start = next((k for k in ks if k >= last / 2 and k < last), None)
        if start is None:
            return self.v[last]
        slope = max((self.v[last] - self.v[start]) / (last - start), 0.0)
        return self.v[last] + slope * (n_tokens - last)

    def speedup(self, alpha: float, gamma: int, *, uses_draft_model: bool = True) -> float:
        """Predicted speedup of drafting γ tokens per step at acceptance rate α."""
        c = self.c if uses_draft_model else 0.0
        return predicted_speedup(alpha, gamma, c, self.verify_cost(gamma + 1))

    def as_dict(self) -> dict:
        return {
            "target_call_seconds": self.target_call_seconds,
            "draft_call_seconds": self.draft_call_seconds,
            "c": self.c,
            "v": {str(k): r for k, r in sorted(self.v.items())},
            "interpolated": list(self.interpolated),
        }


def measure_costs(
    target: nn.Module,
    draft: nn.Module | None = None,
    ks: Iterable[int] = range(1, 17),
    *,
    reps: int = 5,
    context: int = 32,
    budget: float | None = None,
    on_call: Callable[[int, int], None] | None = None,
    thin: bool = True,
) -> CostProfile:
    """Time one-token draft calls and k-token target calls after a short prefill.

    Each call is timed after its sync, then all but its first token is trimmed back off the
    cache, as after a step that rejected every draft: the context grows by one token per
    call, so, as in the loop, no two calls see the same shapes. (Backends that compile a
    kernel per new shape, as MLX's CUDA backend does for multi-token attention, pay that on
    every verify call; a measurement at one fixed context would hide it.) Repetitions are
    interleaved over k, so drift hits every k alike. Each size keeps its fastest call: on a
    shared machine noise only ever adds time, and the loop measures the current speed
    itself (`specmlx.engine.policy.pricing`); the ratios are then made to rise with k
    (`monotone`), since a bigger call never costs less.

    `budget`: seconds the whole measurement should take. The smallest and largest sizes are
    timed first (their warm-up calls); where the plan would take longer, it takes fewer
    repetitions (down to one), then fewer sizes (the smallest and largest always), and the
    sizes left out are interpolated (`CostProfile.interpolated`); without `thin` it keeps
    every size and gives up only repetitions. `on_call(done, total)` follows the calls.
    """
    ks = sorted(set(ks) | {1})
    start = time.perf_counter()
    target_seq = _prefilled(target, context)
    draft_seq = _prefilled(draft, context) if draft is not None else None
    first = {k: _time_call(target_seq, k) for k in dict.fromkeys([1, ks[-1]])}  # warm-ups
    draft_first = _time_call(draft_seq, 1) if draft_seq is not None else 0.0
    left = None if budget is None else budget - (time.perf_counter() - start)
    timed, reps = _plan(ks, reps, first, draft_first, left, thin)
    done, total = 0, len(first) + bool(draft_seq) + len(set(timed) - set(first))
    total += reps * (len(timed) + bool(draft_seq))
    if on_call is not None:
        done = len(first) + bool(draft_seq)
        on_call(done, total)

    def called() -> None:
        nonlocal done
        done += 1
        if on_call is not None:
            on_call(done, total)

    for k in timed:  # warm-up: first calls of a shape pay for allocation
        if k not in first:
            _time_call(target_seq, k)
            called()
    target_times: dict[int, list[float]] = {k: [] for k in timed}
    draft_times: list[float] = []
    for _ in range(reps):
        for k in timed:
            target_times[k].append(_time_call(target_seq, k))
            called()
        if draft_seq is not None:
            draft_times.append(_time_call(draft_seq, 1))
            called()
    one = min(target_times[1])
    v = monotone({k: min(times) / one for k, times in target_times.items()})
    skipped = tuple(k for k in ks if k not in v)
    interpolated = CostProfile(one, None, v)
    return CostProfile(
        target_call_seconds=one,
        draft_call_seconds=min(draft_times) if draft_times else None,
        v={k: v[k] if k in v else interpolated.verify_cost(k) for k in ks},
        interpolated=skipped,
    )


def _plan(
    ks: list[int],
    reps: int,
    first: dict[int, float],
    draft: float,
    budget: float | None,
    thin: bool = True,
) -> tuple[list[int], int]:
    """The sizes to time and the repetitions, within `budget` seconds where one is given:
    each call's time guessed from the warm-ups (a line from the smallest size's to the
    largest's), fewer repetitions first, then (where `thin`) every other size of those in
    between."""
    if budget is None:
        return ks, reps
    low, high = first[1], first[ks[-1]]

    def guess(k: int) -> float:
        return low if len(ks) == 1 else low + (high - low) * (k - 1) / (ks[-1] - 1)

    def cost(sizes: list[int], n: int) -> float:
        warmups = sum(guess(k) for k in sizes if k not in first)
        return warmups + n * (sum(guess(k) for k in sizes) + draft)

    sizes = list(ks)
    while True:
        for n in range(reps, 0, -1):
            if cost(sizes, n) <= budget:
                return sizes, n
        if len(sizes) <= 2 or not thin:
            return sizes, 1
        inner = sizes[1:-1]
        sizes = [sizes[0], *inner[1::2], sizes[-1]] if len(inner) > 1 else [sizes[0], sizes[-1]]


def monotone(v: dict[int, float]) -> dict[int, float]:
    """The closest non-decreasing curve (least squares, pooling adjacent sizes that break
    the order): a 16-token call measured cheaper than a 12-token one is noise, and so is one
    measured cheaper than a one-token call (v(1) = 1 by definition)."""
    blocks: list[list[float]] = []  # [sum, count]
    for k in sorted(v):
        blocks.append([1.0 if k == 1 else max(v[k], 1.0), 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    values = [total / count for total, count in blocks for _ in range(int(count))]
    return dict(zip(sorted(v), values, strict=True))


def _prefilled(model: nn.Module, context: int) -> Sequence:
    sequence = Sequence(model)
    vocab = vocab_rows(model)
    ids = [(17 * i + 11) % vocab for i in range(context + 1)]
    sequence.sync(ids)  # the cache now holds `context` tokens
    return sequence


def _time_call(sequence: Sequence, n_tokens: int) -> float:
    vocab = vocab_rows(sequence.model)
    inputs = mx.array([(31 * i + 7) % vocab for i in range(n_tokens)], mx.uint32)
    mx.eval(inputs)
    start = time.perf_counter()
    logits = sequence.forward(inputs)  # (n_tokens, vocab)
    mx.eval(logits)
    seconds = time.perf_counter() - start
    sequence.settle([int(inputs[0].item())])  # keep one token, trim the rest
    return seconds
