"""Pure acceptance rules: which drafted tokens the target keeps, and the token it adds.

Each rule takes the k drafted tokens and the target's k+1 rows of logits or probabilities
(row i scores the token after draft position i-1, row 0 the token after the last accepted
one) and returns, lazily, the number accepted and the next token. Nothing here syncs with
the host: the loop evaluates both in its one sync per step.
"""

from __future__ import annotations

import mlx.core as mx

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


def tree_sampling_arrays(
    tree: Tree, tokens: mx.array, target_probs: mx.array
) -> dict[str, mx.array]:
    """Everything a host-side walk of a deterministic tree needs when sampling, lazily.

    first_try: the target's probability of each node's token under its parent; fallback: a
    token drawn at each node from the target with all that node's children removed (the
    residual after every child was rejected); bonus: a token drawn at each node from the
    target itself (for a walk stopped by its length limit); uniforms: one draw per node.
    (Greedy walks need only the target's argmax at each node.)

    tokens       # (size - 1,) the drafted nodes
    target_probs # (size, vocab) warped
    """
    parents = mx.array(tree.parents)
    ids = tokens.astype(mx.int32)
    residual = target_probs.at[parents, ids].multiply(0.0)
    total = residual.sum(axis=-1, keepdims=True)
    residual = mx.where(total > 0, residual / total, target_probs)
    return {
        "first_try": target_probs[parents, ids],
        "fallback": mx.random.categorical(mx.log(residual), axis=-1).astype(mx.uint32),
        "bonus": mx.random.categorical(mx.log(target_probs), axis=-1).astype(mx.uint32),
        "uniforms": mx.random.uniform(shape=(tree.size - 1,)),
    }


def walk_tree(
    tree: Tree, tokens: list[int], host: dict[str, list], greedy: bool, limit: int
) -> tuple[list[int], int]:
    """The accepted path (node indices, root excluded) and the token the target adds.

    Greedy: follow the child equal to the target's argmax. Sampling: at each node try the
    children in order, each a one-hot proposal: accept child c with probability
    p(c) / (1 - mass of the siblings already rejected), which is the target renormalized
    after removing them; if all fail, draw from the target without any of them. The path
    stops at `limit` tokens (the step's k: a tree may hold deeper nodes for its drafter's own
    use, as Lookahead's columns); the next token is then the target's own at that node.

    host: "target_tokens" (the target's argmax at each node) when greedy, else the arrays of
    `tree_sampling_arrays`.
    """
    path: list[int] = []
    node = 0
    while True:
        if len(path) == limit:
            return path, host["target_tokens" if greedy else "bonus"][node]
        accepted = None
        if greedy:
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
            key = "target_tokens" if greedy else "fallback"
            return path, host[key][node]
        path.append(accepted)
        node = accepted
