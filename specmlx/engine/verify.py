"""Pure acceptance rules: which drafted tokens the target keeps, and the token it adds.

Each rule takes the k drafted tokens and the target's k+1 rows of logits or probabilities
(row i scores the token after draft position i-1, row 0 the token after the last accepted
one) and returns, lazily, the number accepted and the next token. Nothing here syncs with
the host: the loop evaluates both in its one sync per step.
"""

from __future__ import annotations

import mlx.core as mx

from specmlx.engine.sampling import SamplingConfig, warp
from specmlx.engine.tree import Tree


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


def tree_verify_arrays(
    tree: Tree, tokens: mx.array, target_logits: mx.array, sampling: SamplingConfig
) -> dict[str, mx.array]:
    """Everything a host-side walk of a deterministic tree needs, computed lazily.

    target_tokens: the target's greedy token at each node. For sampling also
    first_try: the target's probability of each node's token under its parent; fallback: a
    token drawn at each node from the target with all that node's children removed (the
    residual after every child was rejected); bonus: a token drawn at each node from the
    target itself (for a walk stopped by its length limit); uniforms: one draw per node.

    tokens        # (size - 1,) the drafted nodes
    target_logits # (size, vocab)
    """
    arrays = {"target_tokens": mx.argmax(target_logits, axis=-1).astype(mx.uint32)}
    if sampling.greedy:
        return arrays
    target_probs = warp(target_logits, sampling)  # (size, vocab)
    parents = mx.array(tree.parents)
    arrays["first_try"] = target_probs[parents, tokens.astype(mx.int32)]
    residual = target_probs.at[parents, tokens.astype(mx.int32)].multiply(0.0)
    total = residual.sum(axis=-1, keepdims=True)
    residual = mx.where(total > 0, residual / total, target_probs)
    arrays["fallback"] = mx.random.categorical(mx.log(residual), axis=-1).astype(mx.uint32)
    arrays["bonus"] = mx.random.categorical(mx.log(target_probs), axis=-1).astype(mx.uint32)
    arrays["uniforms"] = mx.random.uniform(shape=(tree.size - 1,))
    return arrays


def walk_tree(
    tree: Tree, tokens: list[int], host: dict[str, list], sampling: SamplingConfig, limit: int
) -> tuple[list[int], int]:
    """The accepted path (node indices, root excluded) and the token the target adds.

    Greedy: follow the child equal to the target's argmax. Sampling: at each node try the
    children in order, each a one-hot proposal: accept child c with probability
    p(c) / (1 - mass of the siblings already rejected), which is the target renormalized
    after removing them; if all fail, draw from the target without any of them. The path
    stops at `limit` tokens; the next token is then the target's own draw at that node.
    """
    path: list[int] = []
    node = 0
    while True:
        if len(path) == limit:
            return path, host["target_tokens" if sampling.greedy else "bonus"][node]
        accepted = None
        if sampling.greedy:
            want = host["target_tokens"][node]
            accepted = next((c for c in tree.children[node] if tokens[c - 1] == want), None)
        else:
            rejected_mass = 0.0
            for child in tree.children[node]:
                p = host["first_try"][child - 1]
                if host["uniforms"][child - 1] * max(1.0 - rejected_mass, 0.0) < p:
                    accepted = child
                    break
                rejected_mass += p
        if accepted is None:
            key = "target_tokens" if sampling.greedy else "fallback"
            return path, host[key][node]
        path.append(accepted)
        node = accepted
