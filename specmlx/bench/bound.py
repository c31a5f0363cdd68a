"""How far any lookup can go: the bound a run's own text puts on prompt lookup and suffix
decoding.

A drafter that proposes text found earlier (prompt lookup: in the request, its prompt and
answer so far; suffix decoding: in the earlier answers too) drafts continuations of that
text, so a step keeps only as much as the answer goes on with something the text holds
verbatim: at answer position p at most `found(p)` tokens, the longest prefix of the rest of
the answer that occurs in the text there (at most `depth`, the longest draft any row may
make). `found` does not depend on how earlier steps went: the text at p is the prompt, the
answer's first p tokens and the memory, whatever the steps were.

- **Calls.** Always keeping `found(p)` is never behind any such drafter, chain or tree: if
  it is at or behind where the other's kept stretch ends, the rest of that stretch occurs in
  the text, which only grows, so it reaches the stretch's end too. Its tokens per call bound
  theirs.
- **Cost.** A call that verifies n tokens costs v(n) one-token calls (the calibrated curve).
  Fewer calls are not always cheaper where v jumps, so the cheapest way through the answer
  is found apart: cost(p) = min over j <= found(p) of v(j + 1) + cost(p + j + 1). What the
  target alone spends (one call per token) over it bounds such a drafter's speedup at those
  costs.

`lookup_bound` reads the target alone's greedy answers in the order they ran; earlier answers
are seen as the suffix memory keeps them (`PROMPT_TAIL` tokens of their prompt, then the
answer), with no budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specmlx.drafters.suffix_store import PROMPT_TAIL

VerifyCost = Callable[[int], float] | None


class Grams:
    """Every run of 1..depth tokens that occurs in some document of a growing text."""

    def __init__(self, depth: int):
        self.depth = depth
        self._seen: set[tuple[int, ...]] = set()

    def add(self, document: Sequence[int], start: int = 0) -> None:
        """Register the runs of `document` that end at `start` or later (its earlier tokens
        were added before)."""
        for end in range(max(start, 0), len(document)):
            for n in range(1, min(self.depth, end + 1) + 1):
                self._seen.add(tuple(document[end - n + 1 : end + 1]))

    def longest(self, tokens: Sequence[int]) -> int:
        """The longest prefix of `tokens` (at most `depth`) that occurs: a run occurs only if
        its own prefixes do, so the first miss ends it."""
        n = 0
        while n < min(self.depth, len(tokens)) and tuple(tokens[: n + 1]) in self._seen:
            n += 1
        return n


@dataclass(frozen=True)
class Lookup:
    """One answer through the bounding lookups: the fewest calls, and the least calibrated
    cost in one-token target calls (None: no costs to price them with)."""

    tokens: int
    calls: int
    cost: float | None


def found_along(
    prompt: Sequence[int], answer: Sequence[int], memory: Grams | None, depth: int
) -> list[int]:
    """found(p) for every answer position p: how many of the next tokens a step there may
    keep, from the prompt, the answer before p and `memory` (not changed here); never the
    last token, which the target emits."""
    own = Grams(depth)
    text = list(prompt)
    own.add(text)
    found = []
    for p in range(len(answer)):
        rest = answer[p:]
        longest = max(own.longest(rest), memory.longest(rest) if memory is not None else 0)
        found.append(min(longest, len(answer) - p - 1))
        text.append(answer[p])
        own.add(text, len(text) - 1)
    return found


def look_up(
    prompt: Sequence[int],
    answer: Sequence[int],
    memory: Grams | None,
    verify_cost: VerifyCost,
    depth: int,
) -> Lookup:
    """The fewest calls (keeping found(p) at every step) and the least cost (the dynamic
    programme above) to generate `answer` by lookups of the text."""
    found = found_along(prompt, answer, memory, depth)
    calls = p = 0
    while p < len(answer):
        calls += 1
        p += found[p] + 1
    if verify_cost is None:
        return Lookup(len(answer), calls, None)
    cheapest = [0.0] * (len(answer) + 1)
    for p in reversed(range(len(answer))):
        cheapest[p] = min(verify_cost(j + 1) + cheapest[p + j + 1] for j in range(found[p] + 1))
    return Lookup(len(answer), calls, cheapest[0])


@dataclass(frozen=True)
class LookupBound:
    """For a group of prompts: the bounding lookups within each request (prompt lookup's
    reach) and with the earlier answers too (suffix decoding's), drafting up to `depth`."""

    suite: str
    depth: int
    tokens: int
    calls_within: int
    calls_with_memory: int
    cost_within: float | None
    cost_with_memory: float | None

    @property
    def tokens_per_call_within(self) -> float:
        return self.tokens / self.calls_within

    @property
    def tokens_per_call_with_memory(self) -> float:
        return self.tokens / self.calls_with_memory

    @property
    def speedup_within(self) -> float | None:
        """Over the target alone, which spends one one-token call per token."""
        return None if self.cost_within is None else self.tokens / self.cost_within

    @property
    def speedup_with_memory(self) -> float | None:
        return None if self.cost_with_memory is None else self.tokens / self.cost_with_memory


def lookup_bound(
    runs: Sequence[tuple[Sequence[int], Sequence[int]]], verify_cost: VerifyCost, depth: int
) -> list[tuple[Lookup, Lookup]]:
    """Per (prompt, answer) in the order they ran: the lookups within its request, and with
    the earlier answers of `runs` remembered."""
    memory = Grams(depth)
    out = []
    for prompt, answer in runs:
        out.append(
            (
                look_up(prompt, answer, None, verify_cost, depth),
                look_up(prompt, answer, memory, verify_cost, depth),
            )
        )
        memory.add([*prompt[-PROMPT_TAIL:], *answer])
    return out


def bound_of(
    suite: str, depth: int, lookups: Sequence[tuple[Lookup, Lookup]]
) -> LookupBound | None:
    """The group's bound over its answers' lookups; None without any token."""
    tokens = sum(within.tokens for within, _ in lookups)
    if not tokens:
        return None

    def total(costs: list[float | None]) -> float | None:
        return None if None in costs else sum(c for c in costs if c is not None)

    return LookupBound(
        suite,
        depth,
        tokens,
        sum(within.calls for within, _ in lookups),
        sum(remembered.calls for _, remembered in lookups),
        total([within.cost for within, _ in lookups]),
        total([remembered.cost for _, remembered in lookups]),
    )
