"""What each kind of heads learns: its batches from the feature cache, its loss, its step.

`OBJECTIVES` has one entry per kind that `train-heads` trains (the kinds table,
`specmlx.heads.kinds`, says which): how to cut its batches, its loss, which positions count
in its accuracy, and what it takes from the settings.

The training sequences, cut into pieces of `seq_len` from their starts, are packed several
to a window (`Windows`), and a batch is B windows (`specmlx.training.losses`: labels never
come from the next piece, attention never reaches into another).
Which windows a step takes is a function of (seed, step) alone, so a resumed run reads
exactly the batches an uninterrupted one would.

Medusa (Cai et al. 2024): head i on f_t predicts token t+2+i (head 0: the token after the
next one, which the target itself predicts from f_t), cross-entropy over the draft
vocabulary, head i weighted 0.8**i. Its label is the target's own greedy token there, as
EAGLE's is: what the target predicts after token t+1+i of the text (teacher-forced), the
token a draft must match to be kept once the heads before it were right.
EAGLE (Li et al. 2024): from (f_j, token j+1) the head predicts f_{j+1}, teacher-forced over
the window with a causal mask; SmoothL1 to the true f_{j+1} plus 0.1 x cross-entropy of its
logits against the target's own greedy token after token j+1 (or, with `soft`, against the
target's distribution over the draft vocabulary).
Targets outside the draft vocabulary are left out of the cross-entropy and count as misses
in the top-1 accuracy (the heads can never propose them).

At tree depth 2 and beyond, EAGLE reads its own predicted features, not the target's;
trained only on the target's, its second guesses were kept 16% of the time where its
first were kept 73% (SmolLM2-135M). So with `unroll=2` the loss also runs the head a second
time on its own predictions, as EAGLE-3's training-time test does: position j then takes
(f̂_{j+1}, token j+2) and is scored against f_{j+2} and the target's token after j+2. (Its
context is made of predictions too, where a tree's is the target's features but for its
ancestors: an approximation of the drafting it trains for.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from specmlx.training.eagle3_objective import EAGLE3
from specmlx.training.losses import (
    Batch,
    BatchFn,
    LossFn,
    Objective,
    Span,
    cross_entropy,
    feature_rows,
    host_math,
    masked_mean,
    segment_mask,
    soft_cross_entropy,
)
from specmlx.training.shards import FeatureData


class Windows:
    """The training windows of a feature cache, packed, and the batch of each step."""

    def __init__(
        self,
        data: FeatureData,
        seq_len: int,
        batch_size: int,
        seed: int,
        sequences: Iterable[int] | None = None,
        skip: Sequence[int] | None = None,
    ):
        """`sequences`: the cached sequences to pack (default: all of them).
        `skip[i]`: sequence i's leading positions whose next token is a prompt token (its
        prompt's but the last: `prompt_positions`); heads only ever draft answers. Heads at
        position j draft token j+2 onwards, one further than the target's next token: the
        prompt's last position but one drafts the answer's first token, and is the first
        scored; those before it are read (the context) but never scored.

        Each sequence is cut into pieces of `seq_len` from its start (a piece with nothing
        to score is left out) and the pieces are packed into windows first-fit, longest
        first: a piece always starts at its sequence's start or a multiple of seq_len
        after it, so the head reads it with the context it will have when drafting, and
        only the last windows' tails go unused."""
        pieces = []  # (start, stop, end of its sequence, first scored position)
        for i in range(len(data.starts) - 1) if sequences is None else sequences:
            s, e = int(data.starts[i]), int(data.starts[i + 1])
            first = s + (max(skip[i] - 1, 0) if skip is not None else 0)
            for a in range(s, e, seq_len):
                b = min(a + seq_len, e)
                if max(a, first) < min(b, e - 2):  # scored: at or after first, 2 ahead known
                    pieces.append((a, b, e, first))
        order = sorted(range(len(pieces)), key=lambda p: pieces[p][0] - pieces[p][1])
        room: list[int] = []  # free positions left in each window
        placed: list[list[int]] = []  # the pieces of each window
        for p in order:
            need = pieces[p][1] - pieces[p][0]
            fits = np.flatnonzero(np.array(room) >= need) if room else []
            w = int(fits[0]) if len(fits) else len(room)
            if w == len(room):
                room.append(seq_len)
                placed.append([])
            room[w] -= need
            placed[w].append(p)
        shape = (len(placed), seq_len)
        self.pos, self.ends, self.firsts = (np.zeros(shape, np.int64) for _ in range(3))
        self.segments = np.full(shape, -1, np.int64)  # -1: padding, never scored or seen
        for w, members in enumerate(placed):
            at = 0
            for p in sorted(members):
                a, b, e, first = pieces[p]
                self.pos[w, at : at + b - a] = np.arange(a, b)
                self.ends[w, at : at + b - a] = e
                self.firsts[w, at : at + b - a] = first
                self.segments[w, at : at + b - a] = p
                at += b - a
        self.n_tokens = sum(b - a for a, b, _, _ in pieces)
        self.seq_len = seq_len
        self.batch_size = max(1, min(batch_size, len(placed)))
        self.seed = seed
        self._orders: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.pos)

    def positions(self, step: int) -> Span:
        """Step `step`'s windows: positions in the cache, the end of their sequence, its
        first scored position and the sequence. # (B, L) each

        Epoch after epoch, the windows in an order drawn from (seed, epoch)."""
        n = len(self.pos)
        picks = step * self.batch_size + np.arange(self.batch_size)
        return self._span(np.array([self._order(int(g) // n)[int(g) % n] for g in picks]))

    def in_order(self) -> Iterator[Span]:
        """Every window once, in stream order, `batch_size` at a time (the last batch may be
        smaller), as `positions` gives them."""
        for first in range(0, len(self.pos), self.batch_size):
            yield self._span(np.arange(first, min(first + self.batch_size, len(self.pos))))

    def _span(self, chosen: np.ndarray) -> Span:
        return self.pos[chosen], self.ends[chosen], self.firsts[chosen], self.segments[chosen]

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if len(self._orders) > 1:  # a batch spans at most two epochs
                self._orders.clear()
            self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self))
        return self._orders[epoch]


def t2d_table(d2t: np.ndarray | None, vocab: int) -> np.ndarray:
    """Draft id of each target id, -1 where the draft vocabulary lacks it. # (vocab,)"""
    if d2t is None:
        return np.arange(vocab, dtype=np.int32)
    table = np.full(vocab, -1, np.int32)
    table[d2t] = np.arange(len(d2t), dtype=np.int32)
    return table


def medusa_batch(
    data: FeatureData,
    pos: np.ndarray,
    end: np.ndarray,
    first: np.ndarray,
    segments: np.ndarray,
    t2d: np.ndarray,
    heads: int,
    soft: bool = False,
) -> Batch:
    """features (B, L, F); labels (K, B, L): head i's, the target's greedy token after
    token j+1+i (the token j+2+i it would decode), in draft ids or -1; valid (K, B, L): that
    token is known and the position is scored (at or after `first`). With `soft`, also the
    target's features at j+1+i (K, B, L, F): its distribution there is head i's target.
    Medusa heads read one position each, so `segments` (no attention) are not needed."""
    labels, valid, ahead_rows = [], [], []
    for i in range(heads):
        ahead = pos + 1 + i  # the target's token after this one is head i's label
        ok = (ahead < end) & (pos >= first)
        at = np.minimum(ahead, end - 1)
        labels.append(np.where(ok, t2d[data.nexts[at]], -1))
        valid.append(ok)
        if soft:
            ahead_rows.append(feature_rows(data, at))
    batch = (feature_rows(data, pos), mx.array(np.stack(labels)), mx.array(np.stack(valid)))
    return (*batch, mx.stack(ahead_rows)) if soft else batch


def eagle_batch(
    data: FeatureData,
    pos: np.ndarray,
    end: np.ndarray,
    first: np.ndarray,
    segments: np.ndarray,
    t2d: np.ndarray,
    unroll: int = 1,
) -> Batch:
    """features f_j (B, L, F), the attention mask (B, 1, L, L), then for each unrolled step
    s = 1..unroll: tokens j+s (B, L), true f_{j+s} (B, L, F), labels: the target's greedy
    token after j+s in draft ids or -1 (B, L), valid (B, L): the token exists and j is
    scored (at or after `first`). Positions before `first` are still read: they are the
    context the head attends to."""
    batch: list[mx.array] = [feature_rows(data, pos), segment_mask(segments)]
    for step in range(1, unroll + 1):
        ahead = np.minimum(pos + step, end - 1)
        valid = (pos + step < end) & (pos >= first)
        labels = np.where(valid, t2d[data.nexts[ahead]], -1)
        batch += [
            mx.array(data.tokens[ahead]),
            feature_rows(data, ahead),
            mx.array(labels),
            mx.array(valid),
        ]
    return tuple(batch)


def with_noise(batch: Batch, amplitude: float, seed: int, step: int) -> Batch:
    """The batch with uniform noise in (-amplitude, amplitude) added to its input features
    (batch[0]), as EAGLE trains: the head learns to read features that are a little off,
    as its own predictions are. The noise is a function of (seed, step), so a resumed run
    draws what an uninterrupted one would."""
    if amplitude <= 0:
        return batch
    key = mx.random.key(seed * 1_000_003 + step)
    noise = mx.random.uniform(-amplitude, amplitude, batch[0].shape, key=key)
    return (batch[0] + noise, *batch[1:])


def medusa_loss(
    heads: nn.Module,
    features: mx.array,
    labels: mx.array,
    valid: mx.array,
    ahead_features: mx.array | None = None,
    *,
    decay: float,
) -> tuple[mx.array, mx.array, mx.array]:
    """Weighted sum of the heads' cross-entropies (against the target's greedy tokens, or
    with `ahead_features` against its distributions there); each head's loss and top-1
    accuracy."""
    logits = heads(features)  # (K, B, L, V_d)
    if ahead_features is None:
        per_position = cross_entropy(logits, labels)
    else:
        per_position = soft_cross_entropy(logits, heads.target_logits(ahead_features))
    used = valid & (labels >= 0)
    per_head = masked_mean(per_position, used, (1, 2))  # (K,)
    weights = decay ** mx.arange(per_head.shape[0], dtype=mx.float32)
    hits = mx.argmax(logits, axis=-1) == labels
    accuracy = masked_mean(hits, valid, (1, 2))  # (K,)
    return (weights * per_head).sum(), per_head, accuracy


def medusa_logits(
    heads: nn.Module, features: mx.array, labels: mx.array, valid: mx.array, *soft: mx.array
) -> tuple[mx.array, mx.array, mx.array]:
    """The heads' logits on a `medusa_batch`, its labels, and the positions that count."""
    return heads(features), labels, valid


def eagle_loss(
    head: nn.Module,
    features: mx.array,
    mask: mx.array,
    *steps: mx.array,
    ce_weight: float,
    soft: bool,
) -> tuple[mx.array, mx.array, mx.array]:
    """SmoothL1 + ce_weight x cross-entropy, summed over the unrolled steps (each a group of
    `eagle_batch`'s tokens, true_next, labels, valid); the first step's two terms, and the
    top-1 accuracy of each step."""
    total, terms, accuracy = mx.array(0.0), [], []
    inputs = features
    for i in range(0, len(steps), 4):
        tokens, true_next, labels, valid = steps[i : i + 4]
        predicted = head(inputs, tokens, mask=mask)  # (B, L, d)
        regression = nn.losses.smooth_l1_loss(predicted, true_next, reduction="none").mean(-1)
        logits = head.logits(predicted)  # (B, L, V_d)
        if soft:
            ce = masked_mean(soft_cross_entropy(logits, head.logits(true_next)), valid)
        else:
            ce = masked_mean(cross_entropy(logits, labels), valid & (labels >= 0))
        step_terms = mx.stack([masked_mean(regression, valid), ce])  # (2,)
        total = total + step_terms[0] + ce_weight * step_terms[1]
        terms = terms or [step_terms]
        accuracy.append(masked_mean(mx.argmax(logits, axis=-1) == labels, valid))
        inputs = predicted  # the next step reads the head's own predictions
    return total, terms[0], mx.stack(accuracy)


def eagle_logits(
    head: nn.Module, features: mx.array, mask: mx.array, *steps: mx.array
) -> tuple[mx.array, mx.array, mx.array]:
    """Each unrolled step's logits on an `eagle_batch` (K, B, L, V_d), its labels (K, B, L)
    and the positions that count (K, B, L)."""
    inputs, logits, labels, used = features, [], [], []
    for i in range(0, len(steps), 4):
        tokens, _, step_labels, valid = steps[i : i + 4]
        predicted = head(inputs, tokens, mask=mask)
        logits.append(head.logits(predicted))
        labels.append(step_labels)
        used.append(valid)
        inputs = predicted
    return mx.stack(logits), mx.stack(labels), mx.stack(used)


def schedule(peak: float, warmup: int, total: int, min_lr: float) -> Callable:
    """Linear warm-up to `peak`, then a cosine decay to peak * min_lr at the last step."""
    warmup = min(warmup, total - 1)
    decay = optim.cosine_decay(peak, max(1, total - warmup), peak * min_lr)
    if warmup == 0:
        return decay
    return optim.join_schedules(
        [optim.linear_schedule(peak / warmup, peak, warmup), decay], [warmup]
    )


def step_function(
    heads: nn.Module,
    optimizer: optim.Optimizer,
    loss_fn: Callable[..., tuple[mx.array, mx.array, mx.array]],
    grad_clip: float,
    compile: bool,
) -> Callable[..., tuple[mx.array, mx.array, mx.array]]:
    """One optimizer step on a batch; returns loss_fn's (loss, terms, accuracy), lazily.

    Compiled (where `compile` is asked for and the losses' math stays in MLX: see
    `losses.host_math`), it takes the heads' and the optimizer's state as implicit inputs and
    outputs: the very dicts each step updates in place."""
    loss_and_grad = nn.value_and_grad(heads, loss_fn)

    def step(*batch: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        (loss, terms, accuracy), grads = loss_and_grad(*batch)
        if grad_clip > 0:
            grads, _ = optim.clip_grad_norm(grads, grad_clip)
        optimizer.update(heads, grads)
        return loss, terms, accuracy

    if not compile or host_math():
        return step
    state = [heads.state, optimizer.state]
    return partial(mx.compile, inputs=state, outputs=state)(step)


def heldout_hits(
    loss_fn: LossFn,
    batch_of: BatchFn,
    windows: Windows,
    labelled: Callable[[Batch], mx.array],
) -> tuple[list[float], list[float]]:
    """Per head: how many of the positions of `windows` it got right, and how many it was
    scored on (the objective's `labelled`: each batch's accuracy weighted by them).
    Evaluated batch by batch; no gradients."""
    hits, counts = None, None
    for span in windows.in_order():
        batch = batch_of(*span)
        _, _, accuracy = loss_fn(*batch)
        n = labelled(batch)
        hits = accuracy * n if hits is None else hits + accuracy * n
        counts = n if counts is None else counts + n
        mx.eval(hits, counts)
    if hits is None or counts is None:
        return [], []
    return hits.tolist(), counts.tolist()


def heldout_by_part(
    loss_fn: LossFn,
    batch_of: BatchFn,
    parts: dict[str, Windows],
    labelled: Callable[[Batch], mx.array],
) -> dict[str, list[float]]:
    """Top-1 accuracy of each head (eagle: each unrolled step) on each part of the held-out
    windows, which the heads never trained on, and over all of them together ("all": each
    position counts once, as if they were one part)."""
    scores: dict[str, list[float]] = {}
    every = np.zeros((2, 0))  # hits and counts per head, all parts together
    for part, windows in parts.items():
        hits, counts = heldout_hits(loss_fn, batch_of, windows, labelled)
        if hits:
            scores[part] = _ratios(hits, counts)
            every = np.array([hits, counts]) + (every if every.size else 0)
    if every.size:
        scores["all"] = _ratios(every[0].tolist(), every[1].tolist())
    return scores


def _ratios(hits: list[float], counts: list[float]) -> list[float]:
    return [round(h / max(c, 1), 4) for h, c in zip(hits, counts, strict=True)]


# --- the objective of each kind -----------------------------------------------------------


def _medusa_batches(data: FeatureData, t2d: np.ndarray, settings: Any) -> BatchFn:
    soft = settings.soft_targets
    return partial(medusa_batch, data, t2d=t2d, heads=settings.num_heads, soft=soft)


def _medusa_loss(heads: nn.Module, settings: Any) -> LossFn:
    return partial(medusa_loss, heads, decay=settings.medusa_decay)


def _medusa_labelled(batch: Batch) -> mx.array:
    return batch[2].sum((1, 2))  # each head's valid (B, L)


def _medusa_shape(settings: Any) -> dict[str, int]:
    return {"num_heads": settings.num_heads, "num_layers": settings.num_layers}


def _eagle_batches(data: FeatureData, t2d: np.ndarray, settings: Any) -> BatchFn:
    return partial(eagle_batch, data, t2d=t2d, unroll=settings.unroll)


def _eagle_loss(head: nn.Module, settings: Any) -> LossFn:
    return partial(eagle_loss, head, ce_weight=settings.eagle_ce_weight, soft=settings.soft_targets)


def _eagle_labelled(batch: Batch) -> mx.array:
    return mx.stack([valid.sum() for valid in batch[5::4]])  # each unrolled step's valid


def _eagle_shape(settings: Any) -> dict[str, int]:
    return {"num_heads": 1, "num_layers": 1}


OBJECTIVES: dict[str, Objective] = {
    "medusa": Objective(
        _medusa_batches,
        _medusa_loss,
        _medusa_labelled,
        _medusa_shape,
        logits=lambda heads, settings: partial(medusa_logits, heads),
    ),
    "eagle": Objective(
        _eagle_batches,
        _eagle_loss,
        _eagle_labelled,
        _eagle_shape,
        target_layer=True,
        feature_noise=True,
        logits=lambda head, settings: partial(eagle_logits, head),
    ),
    "eagle3": EAGLE3,
}
