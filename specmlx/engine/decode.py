"""THE loop: propose -> verify once -> accept -> rewind -> yield.

Every drafting strategy goes through `decode`. One step: the policy plans the draft length,
the loop caps it (`draft_length`, the one place), the drafter proposes up to that many tokens
as a chain or a tree, drawn as the step's sampling says; the target scores [last, drafts] in
one call; the loop warps the target's logits (here, for chains and trees alike) and an
acceptance rule from `specmlx.engine.verify` keeps a prefix (a path, for a tree) of the drafts
and adds one token of the target's own; both sides drop what was not kept; the loop yields the
step's one record, `Step`, which the policy observes. One host sync per step, plus one where
a tree is read back to be built, and one per drafted token where a stop rule reads the draft
model's confidences (docs/how-it-works.md says why that pays).
Without a drafter the loop is plain decoding, the baseline, double-buffered as mlx-lm's: the
next token's call is queued before the host reads the current one (on the CPU backend it is
built then and queued once the token is read: `QUEUE_AHEAD`). A policy that falls back to
plain steps commits to a run of them (`Plan.run`), decoded the same way, so a fall-back costs
what the target alone does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import mlx.core as mx

from specmlx.engine import device
from specmlx.engine.cache import Sequence
from specmlx.engine.policy.base import Policy
from specmlx.engine.sampling import SamplingConfig, draw, warp
from specmlx.engine.step import Draft, Drafter, Step, Verdict, draft_length
from specmlx.engine.verify import greedy_verify, rejection_verify, tree_sampling_arrays, walk_tree

# Lookups in a row that found nothing before the loop decodes a watched plain stretch: the
# lookup is asked after every token, and once it finds a match the stretch goes on one token,
# the one whose call is under way. A match then reaches verification only if its first token
# was that token, so matches wrong from their first token (most of them in chat) cost
# nothing: on SmolLM2-135M's chat prompts prompt lookup verified 19 drafts where it had
# verified 31, 15 of them kept nothing where 24 had, 0.99x -> 1.04x the target alone. After
# one empty lookup only: code, whose short matches come often, lost a share of its drafts'
# first tokens (results/ab-watched-lookups-2026-12-07.txt).
WATCH_AFTER = 2
# The longest plain stretch a lookup that found nothing starts (it ends sooner where the
# lookup finds something): then the policy chooses again, as after a plain run of its own.
MAX_WATCHED_RUN = 16
# Whether a plain step's next call is queued before the host reads its token (double-
# buffered, as mlx-lm's), or once it has: its graph is still built before the read, but it
# runs after. None: queued ahead except on the CPU backend, where `mx.async_eval` did most of
# a call's work before it returned: queued ahead, the next call ran before the read, so a
# run's first step timed two calls and its last next to none (what the policy learns its
# speed from; results/ab-read-first-2026-12-07.txt), and it overlapped nothing.
QUEUE_AHEAD: bool | None = None


def queues_ahead() -> bool:
    """Whether plain steps queue the next call before reading their token (`QUEUE_AHEAD`)."""
    return QUEUE_AHEAD if QUEUE_AHEAD is not None else device.backend() != "cpu"


def _next_token(logits: mx.array, sampling: SamplingConfig) -> mx.array:
    return mx.argmax(logits) if sampling.greedy else draw(warp(logits, sampling))


def _chain(
    last: int, draft: Draft, target: Sequence, sampling: SamplingConfig
) -> tuple[Verdict, int]:
    """Score [last, d1..dk] in one call; keep the accepted prefix."""
    inputs = mx.concatenate([mx.array([last], mx.uint32), draft.tokens])
    logits = target.forward(inputs)  # (k+1, vocab)
    if sampling.greedy:
        n_accepted, next_token = greedy_verify(draft.tokens, logits)
    else:
        target_probs = warp(logits, sampling)  # (k+1, vocab)
        n_accepted, next_token = rejection_verify(draft.tokens, draft.probs, target_probs)
    verdict = mx.concatenate([draft.tokens, mx.stack([n_accepted.astype(mx.uint32), next_token])])
    host = verdict.tolist()  # the step's one sync
    n, token = host[-2], host[-1]
    return Verdict(host[:n]), token


def _tree(
    last: int,
    draft: Draft,
    target: Sequence,
    sampling: SamplingConfig,
    limit: int,
    with_target_tokens: bool,
) -> tuple[Verdict, int]:
    """Score every node of the tree in one call; keep the accepted path, at most `limit`."""
    inputs = mx.concatenate([mx.array([last], mx.uint32), draft.tokens])
    logits = target.forward(inputs, tree=draft.tree)  # (nodes, vocab)
    arrays = {"tokens": draft.tokens}
    if sampling.greedy or with_target_tokens:
        arrays["target_tokens"] = mx.argmax(logits, axis=-1).astype(mx.uint32)  # (nodes,)
    if not sampling.greedy:
        arrays.update(tree_sampling_arrays(draft.tree, draft.tokens, warp(logits, sampling)))
    host = _to_host(arrays)  # the step's one sync
    path, token = walk_tree(draft.tree, host["tokens"], host, sampling.greedy, limit)
    accepted = [host["tokens"][node - 1] for node in path]
    return Verdict(accepted, path, host.get("target_tokens") if with_target_tokens else None), token


def _to_host(arrays: dict[str, mx.array]) -> dict[str, list]:
    """Every array's values, in one transfer: flattened into one float32 array (token ids
    below 2**24 are exact in it), then split; integer arrays come back as ints."""
    flat = mx.concatenate([a.reshape(-1).astype(mx.float32) for a in arrays.values()]).tolist()
    host, offset = {}, 0
    for name, a in arrays.items():
        values = flat[offset : offset + a.size]
        offset += a.size
        host[name] = values if mx.issubdtype(a.dtype, mx.floating) else [int(v) for v in values]
    return host


def _finish(emitted: list[int], stop_tokens: frozenset[int]) -> tuple[list[int], str | None]:
    for i, token in enumerate(emitted):
        if token in stop_tokens:
            return emitted[: i + 1], "stop"
    return emitted, None


def decode(
    target: Sequence,
    context: list[int],
    drafter: Drafter | None,
    *,
    policy: Policy,
    max_tokens: int,
    sampling: SamplingConfig,
    stop_tokens: frozenset[int] = frozenset(),
) -> Iterator[Step]:
    """Generate up to `max_tokens` tokens after `context`, one `Step` per target call.

    The target's cache is brought to hold context[:-1] (reusing what it already holds), and
    after every step it holds everything generated except the newest token.
    """
    context = list(context)
    if drafter is not None and drafter.traits.features is not None:
        target.capture(drafter.traits.features)  # heads draft from the target's hidden states
    target.sync(context)
    policy.start()
    if drafter is None:
        yield from _plain(target, context, policy, max_tokens, sampling, stop_tokens)
        return
    traits = drafter.traits
    # The drafter takes in the context when first asked for a draft: a response the policy
    # decodes plainly never pays for the draft model's prefill.
    prefilled = False
    produced = 0
    missed = 0  # lookups in a row that found nothing

    def stretch(run: int | None, until: Callable[[list[int]], bool] | None = None):
        """A run of plain steps, as plain decoding's; returns whether the generation ended."""
        nonlocal produced
        rest = max_tokens - produced
        for step in _plain(target, context, policy, rest, sampling, stop_tokens, run, until):
            context.extend(step.tokens)
            produced += len(step.tokens)
            yield step
            if step.finish is not None:
                return True
        return False

    while produced < max_tokens:
        start = time.perf_counter()
        last = context[-1]
        plan = policy.choose()
        k = draft_length(plan.k, max_tokens - produced - 1, traits)
        if plan.k == 0:  # the policy's plain steps
            if (yield from stretch(plan.run)):
                return
            continue
        if k > 0 and not prefilled:
            drafter.prefill(context, target)
            prefilled = True
            start = time.perf_counter()  # a prefill, like the target's: not the step's time
        draft = drafter.propose(context, k, sampling, plan.stop) if k > 0 else None
        draft_seconds = None
        if draft is not None and (draft.tree is not None or draft.size == 0):
            draft_seconds = time.perf_counter() - start  # read back (a tree), or nothing to do
        elif draft is not None and plan.time_draft:
            mx.eval(draft.tokens)  # the draft calls, timed apart from the verify call
            draft_seconds = time.perf_counter() - start
        missed = missed + 1 if draft is not None and draft.size == 0 else 0
        if missed >= WATCH_AFTER and traits.looks_up:
            # Lookups that keep finding nothing: plain steps until one finds something (at
            # most a policy's run of them), asked after every token.
            def found(grown: list[int], k: int = k) -> bool:
                return drafter.propose(grown, k, sampling).size > 0

            if (yield from stretch(MAX_WATCHED_RUN, found)):
                return
            continue
        if draft is not None and draft.size == 0:
            # Nothing worth verifying (a tree whose nodes do not pay): a plain call, in a
            # step that still paid for its proposal (`Step.proposed`).
            draft = None
        if draft is None:
            logits = target.forward(mx.array([last], mx.uint32))[0]
            verdict, token = Verdict([]), _next_token(logits, sampling).item()
            target.settle([last])
        elif draft.tree is None:
            verdict, token = _chain(last, draft, target, sampling)
            target.settle([last, *verdict.accepted])
        else:
            verdict, token = _tree(last, draft, target, sampling, k, traits.reads_target_tokens)
            target.settle([last, *verdict.accepted], path=[0, *verdict.path])
        if draft is not None:
            drafter.commit(verdict)
        seconds = time.perf_counter() - start
        emitted, finish = _finish([*verdict.accepted, token], stop_tokens)
        produced += len(emitted)
        if finish is None and produced >= max_tokens:
            finish = "length"
        context.extend(emitted)
        step = Step(
            tuple(emitted),
            plan.k,
            draft.size if draft is not None else 0,
            draft.depth if draft is not None else 0,
            verdict.n_accepted,
            seconds,
            finish,
            draft_seconds,
            requested=k,
            confidences=draft.confidences if draft is not None else None,
            tree=draft is not None and draft.tree is not None,
            free=draft is not None and draft.free,
        )
        policy.observe(step)
        yield step
        if finish is not None:
            return


def _plain(
    target: Sequence,
    context: list[int],
    policy: Policy,
    max_tokens: int,
    sampling: SamplingConfig,
    stop_tokens: frozenset[int],
    run: int | None = None,
    until: Callable[[list[int]], bool] | None = None,
) -> Iterator[Step]:
    """Plain decoding, double-buffered: the call for token t+1 takes token t as a lazy array
    and is queued before the host reads token t, so the device never waits for the host
    (`queues_ahead`; otherwise its graph is built before the read and it is queued after,
    so each step times its own call).
    `run`: stop after that many steps (a policy's plain stretch), with no call queued past
    it: the cache then holds everything but the newest token, as after any step.
    `until(context)`: asked of the caller's context (which the caller extends with each
    step's tokens) before the next call is queued; once true, the run ends after the token
    whose call is already under way."""
    steps = max_tokens if run is None else min(run, max_tokens)
    ahead = queues_ahead()
    start = time.perf_counter()
    pending = _next_token(target.forward(mx.array([context[-1]], mx.uint32))[0], sampling)
    mx.async_eval(pending)
    target.settle([context[-1]])
    try:
        for produced in range(1, steps + 1):
            queued = None
            if until is not None and produced > 1 and until(context):
                steps = produced  # the call for this token is under way: read it, queue none
            if produced < steps:
                queued = _next_token(target.forward(pending[None])[0], sampling)
                if ahead:
                    mx.async_eval(queued)
            token = pending.item()  # the step's one sync
            seconds = time.perf_counter() - start
            start = time.perf_counter()
            if queued is not None and not ahead:
                mx.async_eval(queued)  # the next step's time
            finish = "stop" if token in stop_tokens else None
            if finish is None and produced == max_tokens:
                finish = "length"
            if finish is None and queued is not None:
                target.settle([token])  # the queued call's input, now known
            step = Step((token,), 0, 0, 0, 0, seconds, finish)
            policy.observe(step)
            yield step
            if finish is not None or queued is None:
                return  # the end, or the run's last step: no call under way
            pending = queued
    finally:
        # A queued call past the end (a stop token, or a consumer that stopped early) is
        # dropped: the cache holds everything generated except the newest token.
        if target.n_unconfirmed:
            target.settle([])
