"""THE loop: propose -> verify once -> accept -> rewind -> yield.

Every drafting strategy goes through `decode`. One step: the drafter proposes up to k
tokens, as a chain or a tree; the target scores [last, drafts] in one call; an acceptance
rule from `specmlx.verify` keeps a prefix (a path, for a tree) of the drafts and adds one
token of the target's own; both sides drop what was not kept. Without a drafter the same
loop is plain decoding (k = 0), the baseline every method is measured against. One host
sync per step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import mlx.core as mx

from specmlx.adaptive import AdaptiveK
from specmlx.cache import Sequence
from specmlx.drafters.base import Draft, Drafter, Verdict
from specmlx.sampling import SamplingConfig, draw, warp
from specmlx.verify import greedy_verify, rejection_verify, tree_verify_arrays, walk_tree


@dataclass(frozen=True)
class Step:
    """What one target call produced."""

    tokens: tuple[int, ...]  # accepted drafts, then the target's own token (stop-truncated)
    k: int  # the draft length chosen (before the max_tokens cap); 0: a plain step by choice
    n_drafted: int  # tokens the target verified besides the last one (tree nodes too)
    draft_depth: int  # the longest path the draft offered
    n_accepted: int
    seconds: float  # wall time of the step, measured after its sync
    finish: str | None  # "stop" (a stop token), "length" (max_tokens), or None


def _plain(last: int, target: Sequence, sampling: SamplingConfig) -> tuple[Verdict, int]:
    logits = target.forward(mx.array([last], mx.uint32))[0]
    token = mx.argmax(logits) if sampling.greedy else draw(warp(logits, sampling))
    return Verdict([]), token.item()


def _chain(
    last: int, draft: Draft, target: Sequence, sampling: SamplingConfig
) -> tuple[Verdict, int]:
    """Score [last, d1..dk] in one call; keep the accepted prefix."""
    inputs = mx.concatenate([mx.array([last], mx.uint32), draft.tokens])
    logits = target.forward(inputs)  # (k+1, vocab)
    if sampling.greedy:
        n_accepted, next_token = greedy_verify(draft.tokens, logits)
    else:
        n_accepted, next_token = rejection_verify(draft.tokens, draft.probs, warp(logits, sampling))
    verdict = mx.concatenate([draft.tokens, mx.stack([n_accepted.astype(mx.uint32), next_token])])
    host = verdict.tolist()  # the step's one sync
    n, token = host[-2], host[-1]
    return Verdict(host[:n]), token


def _tree(
    last: int, draft: Draft, target: Sequence, sampling: SamplingConfig, limit: int
) -> tuple[Verdict, int]:
    """Score every node of the tree in one call; keep the accepted path, at most `limit`."""
    inputs = mx.concatenate([mx.array([last], mx.uint32), draft.tokens])
    logits = target.forward(inputs, tree=draft.tree)  # (nodes, vocab)
    arrays = tree_verify_arrays(draft.tree, draft.tokens, logits, sampling)
    arrays["tokens"] = draft.tokens
    mx.eval(*arrays.values())  # the step's one sync
    host = {name: a.tolist() for name, a in arrays.items()}
    path, token = walk_tree(draft.tree, host["tokens"], host, sampling, limit)
    accepted = [host["tokens"][node - 1] for node in path]
    return Verdict(accepted, path, host["target_tokens"]), token


def _depth(draft: Draft | None) -> int:
    if draft is None:
        return 0
    return draft.size if draft.tree is None else max(draft.tree.depths)


def decode(
    target: Sequence,
    context: list[int],
    drafter: Drafter | None,
    *,
    k: int,
    max_tokens: int,
    sampling: SamplingConfig,
    stop_tokens: frozenset[int] = frozenset(),
    policy: AdaptiveK | None = None,
) -> Iterator[Step]:
    """Generate up to `max_tokens` tokens after `context`, one `Step` per target call.

    The draft length is `k`, or, with a `policy`, whatever it chooses before each step (0
    for a plain step). The target's cache is brought to hold context[:-1] (reusing what it
    already holds), and after every step it holds everything generated except the newest
    token.
    """
    context = list(context)
    target.sync(context)
    # The drafter takes in the context when first asked for a draft: a response that the
    # policy decodes plainly (where speculation cannot win) never pays for the draft model's
    # prefill, which on a compute-bound CPU added a sixth to the time to the first token.
    prefilled = drafter is None
    if policy is not None:
        policy.new_response()
        if hasattr(drafter, "goes_on"):
            drafter.goes_on = policy.goes_on  # the policy ends the drafts
    produced = 0
    while produced < max_tokens:
        start = time.perf_counter()
        last = context[-1]
        k_chosen = 0 if drafter is None else policy.choose() if policy else k
        # Never accept past max_tokens: a step emits at most k_step + 1 tokens.
        k_step = min(k_chosen, max_tokens - produced - 1)
        if k_step > 0 and not prefilled:
            drafter.prefill(context)
            prefilled = True
            start = time.perf_counter()  # a prefill, like the target's: not the step's time
        draft = drafter.propose(context, k_step) if k_step > 0 else None
        draft_seconds = None
        if policy is not None and policy.uses_draft_model and draft is not None:
            # The draft calls, timed apart from the verify call: the policy's measure of how
            # fast one-token calls run now.
            mx.eval(draft.tokens)
            draft_seconds = time.perf_counter() - start
        if draft is None or draft.size == 0:
            verdict, token = _plain(last, target, sampling)
            target.settle([last])
        elif draft.tree is None:
            verdict, token = _chain(last, draft, target, sampling)
            target.settle([last, *verdict.accepted])
        else:
            verdict, token = _tree(last, draft, target, sampling, k_step)
            target.settle([last, *verdict.accepted], path=[0, *verdict.path])
        if draft is not None:
            drafter.commit(verdict)
        seconds = time.perf_counter() - start
        if policy is not None:
            if draft is None or draft.size == 0:
                policy.observe(0, 0, 0, False, seconds)
            else:
                policy.observe(
                    _depth(draft),
                    verdict.n_accepted,
                    draft.size,
                    draft.tree is not None,
                    seconds,
                    draft_seconds,
                    requested=k_step,
                    confidences=draft.confidences,
                )

        emitted = [*verdict.accepted, token]
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
            k=k_chosen,
            n_drafted=draft.size if draft is not None else 0,
            draft_depth=_depth(draft),
            n_accepted=verdict.n_accepted,
            seconds=seconds,
            finish=finish,
        )
        if finish is not None:
            return
