"""THE loop: propose -> verify once -> accept -> rewind -> yield.

Every drafting strategy goes through `decode`. One step: the drafter proposes up to k
tokens; the target scores [last, d1..dk] in one call; an acceptance rule from
`specmlx.verify` keeps a prefix of the drafts and adds one token of the target's own; both
sides drop what was not kept. Without a drafter the same loop is plain decoding (k = 0),
the baseline every method is measured against. One host sync per step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import mlx.core as mx

from specmlx.cache import Sequence
from specmlx.drafters.base import Drafter
from specmlx.sampling import SamplingConfig, draw, warp
from specmlx.verify import greedy_verify, rejection_verify


@dataclass(frozen=True)
class Step:
    """What one target call produced."""

    tokens: tuple[int, ...]  # accepted drafts, then the target's own token (stop-truncated)
    n_drafted: int
    n_accepted: int
    seconds: float  # wall time of the step, measured after its sync
    finish: str | None  # "stop" (a stop token), "length" (max_tokens), or None


def _verify(
    last: int,
    draft_tokens: mx.array | None,
    draft_probs: mx.array | None,
    target: Sequence,
    sampling: SamplingConfig,
) -> tuple[mx.array, mx.array]:
    """Run the target once over [last, drafts] and apply the acceptance rule (lazily)."""
    inputs = mx.array([last], mx.uint32)
    if draft_tokens is not None:
        inputs = mx.concatenate([inputs, draft_tokens])
    logits = target.forward(inputs)  # (k+1, vocab)
    if draft_tokens is None:
        token = mx.argmax(logits[0]) if sampling.greedy else draw(warp(logits[0], sampling))
        return mx.array(0), token.astype(mx.uint32)
    if sampling.greedy:
        return greedy_verify(draft_tokens, logits)
    return rejection_verify(draft_tokens, draft_probs, warp(logits, sampling))


def decode(
    target: Sequence,
    context: list[int],
    drafter: Drafter | None,
    *,
    k: int,
    max_tokens: int,
    sampling: SamplingConfig,
    stop_tokens: frozenset[int] = frozenset(),
) -> Iterator[Step]:
    """Generate up to `max_tokens` tokens after `context`, one `Step` per target call.

    The target's cache is brought to hold context[:-1] (reusing what it already holds), and
    after every step it holds everything generated except the newest token.
    """
    context = list(context)
    target.sync(context)
    if drafter is not None:
        drafter.prefill(context)
    produced = 0
    while produced < max_tokens:
        start = time.perf_counter()
        # Never draft past max_tokens: a step emits at most k_step + 1 tokens.
        k_step = min(k, max_tokens - produced - 1) if drafter is not None else 0
        draft = drafter.propose(context, k_step) if k_step > 0 else None
        draft_tokens = draft.tokens if draft is not None else None
        n_accepted, next_token = _verify(
            context[-1], draft_tokens, draft.probs if draft else None, target, sampling
        )
        verdict = mx.stack([n_accepted.astype(mx.uint32), next_token])
        if draft_tokens is not None:
            verdict = mx.concatenate([draft_tokens, verdict])
        host = verdict.tolist()  # the step's one sync
        n, token = host[-2], host[-1]
        accepted = host[:n]
        target.settle([context[-1], *accepted])
        if draft is not None:
            drafter.commit(n, accepted)

        emitted = [*accepted, token]
        finish = None
        for i, t in enumerate(emitted):
            if t in stop_tokens:
                emitted, finish = emitted[: i + 1], "stop"
                break
        produced += len(emitted)
        if finish is None and produced >= max_tokens:
            finish = "length"
        context.extend(emitted)
        yield Step(
            tokens=tuple(emitted),
            n_drafted=k_step,
            n_accepted=n,
            seconds=time.perf_counter() - start,
            finish=finish,
        )
        if finish is not None:
            return
