"""Pure acceptance rules: which drafted tokens the target keeps, and the token it adds.

Each rule takes the k drafted tokens and the target's k+1 rows of logits or probabilities
(row i scores the token after draft position i-1, row 0 the token after the last accepted
one) and returns, lazily, the number accepted and the next token. Nothing here syncs with
the host: the loop evaluates both in its one sync per step.
"""

from __future__ import annotations

import mlx.core as mx


def _prefix_length(matches: mx.array) -> mx.array:
    """Length of the leading run of True values. # ()"""
    return mx.cumprod(matches.astype(mx.int32)).sum()


def greedy_verify(draft_tokens: mx.array, target_logits: mx.array) -> tuple[mx.array, mx.array]:
    """Temperature 0: the longest prefix where the draft equals the target's argmax.

    draft_tokens  # (k,)
    target_logits # (k+1, vocab)
    """
    target_tokens = mx.argmax(target_logits, axis=-1).astype(mx.uint32)  # (k+1,)
    k = draft_tokens.shape[0]
    n_accepted = _prefix_length(draft_tokens == target_tokens[:k])
    return n_accepted, target_tokens[n_accepted]


def rejection_verify(
    draft_tokens: mx.array,
    draft_probs: mx.array | None,
    target_probs: mx.array,
) -> tuple[mx.array, mx.array]:
    """Temperature > 0: exact speculative rejection sampling (Leviathan et al. 2023).

    Accept draft i with probability min(1, target_probs[i, d_i] / draft_probs[i, d_i]); at
    the first rejection draw from normalize(max(0, target_probs - draft_probs)); if all pass
    draw a bonus token from the last target row. `draft_probs=None` is a deterministic
    proposal (n-gram, lookahead): a one-hot draft, so the ratio is target_probs[i, d_i] and
    the residual is the target with d_i removed.

    draft_tokens # (k,)
    draft_probs  # (k, vocab) or None; both prob arrays over the same vocab
    target_probs # (k+1, vocab)
    """
    k = draft_tokens.shape[0]
    rows = mx.arange(k)
    ids = draft_tokens.astype(mx.int32)
    target_at_draft = target_probs[rows, ids]  # (k,)
    if draft_probs is None:
        draft_at_draft = mx.ones_like(target_at_draft)
        draft_mass = mx.zeros_like(target_probs[:k])
        draft_mass = mx.put_along_axis(draft_mass, ids[:, None], mx.ones((k, 1)), axis=-1)
    else:
        draft_at_draft = draft_probs[rows, ids]
        draft_mass = draft_probs
    accept = mx.random.uniform(shape=(k,)) * draft_at_draft < target_at_draft  # (k,)
    n_accepted = _prefix_length(accept)

    residual = mx.maximum(target_probs[:k] - draft_mass, 0.0)  # (k, vocab)
    residual_total = residual.sum(axis=-1, keepdims=True)
    # A rejection implies positive residual mass; guard the float edge where it rounds away.
    residual = mx.where(residual_total > 0, residual / residual_total, target_probs[:k])
    candidates = mx.concatenate([residual, target_probs[k:]], axis=0)  # (k+1, vocab)
    chosen = candidates[n_accepted]
    next_token = mx.random.categorical(mx.log(chosen)).astype(mx.uint32)
    return n_accepted, next_token
