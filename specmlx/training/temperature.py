"""Temperatures that make the heads' probabilities honest: fitted on held-out answers.

A head's probabilities size its trees: a node is worth verifying when its path's probability,
read as its chance of being kept, pays for the tokens it adds to the target's call
(`specmlx.drafters.eagle.best_tree_size`). Heads trained on little data learn their training
answers better than the target (Medusa on SmolLM2: training top-1 65% at its first head, 31%
held out) and grow overconfident: their trees grow larger than what they keep pays for, and a
deep guess outranks a second guess one level up.

Temperature scaling (Guo et al. 2017) mends it with one number per Medusa head (per EAGLE
step: the level it drafts, on its own earlier outputs as training tests it). Dividing the
logits by T keeps every head's ranking of its tokens, so what a head proposes is unchanged;
only the probabilities, hence the tree's shape and size, move. The T chosen is the one whose
probabilities of the head's `WIDTH` best tokens best forecast which of them is the target's
token at held-out positions (the Brier score over those candidates, a proper score for each
"this candidate is the token" event): those are the probabilities a tree is built from. The
whole distribution's likelihood, Guo et al.'s criterion, is ruled by the tokens ranked far
down, which no tree drafts: fitted on it, SmolLM2's EAGLE-3 heads, whose top-1 probability
matched their top-1 accuracy (26% and 25%) at T = 1, went to 19%. The fit is a scan of a
fine grid of T. A position whose token is outside the draft vocabulary counts as a miss of
every candidate: no draft can be kept there.

Each Medusa head is fitted over all positions, while a tree scores a path by the product
of its heads' probabilities, as if each were the head's chance given the heads before it
right: honest heads one by one, not paths (a second head's guess, made for the first
head's best token, is rarely right under its second one). EAGLE's steps read the tokens
before them, so their probabilities are already the path's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from specmlx.training.losses import BatchFn, LogitsFn
from specmlx.training.objectives import Windows

# 1/4 to 16 in steps of 2^(1/16) (4.4%): finer than the temperature matters to a tree's size.
GRID = 2.0 ** (np.arange(-32, 65) / 16)
WIDTH = 8  # the candidates scored at each position: the drafters' default tree width


@dataclass(frozen=True)
class Fit:
    """Per head: the fitted temperature, the held-out Brier score of its `WIDTH` best tokens
    at T = 1 and at it, its mean top-1 probability at T = 1 and at it, and its top-1
    accuracy (what a calibrated head's mean top-1 probability is close to), over
    `positions` positions."""

    temperatures: list[float]
    brier: list[float]
    brier_fitted: list[float]
    confidence: list[float]
    confidence_fitted: list[float]
    accuracy: list[float]
    positions: int

    def record(self) -> dict:
        """For the heads' training record (config.json)."""
        return {
            "temperatures": self.temperatures,
            "heldout_brier_top8": {"at_1": self.brier, "fitted": self.brier_fitted},
            "heldout_top1_probability": {"at_1": self.confidence, "fitted": self.confidence_fitted},
            "heldout_top1": self.accuracy,
            "positions": self.positions,
        }


def fit_temperatures(logits_of: LogitsFn, batch_of: BatchFn, windows: Windows) -> Fit | None:
    """Each head's temperature fitted on every position of `windows` that counts (a head
    with none keeps 1; None: no head has any). Evaluated batch by batch, in one pass; no
    gradients. The scan of the grid runs in NumPy, on the positions some head is scored
    at: its exponentials are vectorised there (about ten times MLX's on this CPU)."""
    sums: np.ndarray | None = None  # (2 T + 2, K): Brier and top-1 probability per T, hits, count
    for span in windows.in_order():
        logits, labels, used = logits_of(*batch_of(*span))
        n_heads, vocab = logits.shape[0], logits.shape[-1]
        logits = logits.astype(mx.float32).reshape(n_heads, -1, vocab)
        labels = labels.reshape(n_heads, -1)
        width = min(WIDTH, vocab)
        best = mx.argpartition(-logits, width - 1, axis=-1)[..., :width]  # (K, N, w)
        best_logits = mx.take_along_axis(logits, best, axis=-1)
        # A label outside the draft vocabulary (-1) is none of them: a certain miss.
        is_label = (best == labels[..., None]).astype(mx.float32)
        hits = (mx.argmax(logits, axis=-1) == labels).astype(mx.float32)
        used = used.reshape(n_heads, -1).astype(mx.float32)
        mx.eval(logits, best_logits, is_label, hits, used)
        scored = np.flatnonzero(np.array(used).any(axis=0))
        if not len(scored):
            continue
        batch_sums = _scan(
            *(np.array(a)[:, scored] for a in (logits, best_logits, is_label, hits, used))
        )
        sums = batch_sums if sums is None else sums + batch_sums
    if sums is None:
        return None
    count = sums[-1]
    if not count.max() > 0:
        return None
    per_position = sums / np.maximum(count, 1)
    brier, confidence = per_position[: len(GRID)], per_position[len(GRID) : -2]  # (T, K)
    at_one = int(np.flatnonzero(GRID == 1.0)[0])
    chosen = np.where(count > 0, brier.argmin(axis=0), at_one)  # none scored: as trained
    heads = np.arange(len(count))
    return Fit(
        temperatures=_rounded(GRID[chosen]),
        brier=_rounded(brier[at_one]),
        brier_fitted=_rounded(brier[chosen, heads]),
        confidence=_rounded(confidence[at_one]),
        confidence_fitted=_rounded(confidence[chosen, heads]),
        accuracy=_rounded(per_position[-2]),
        positions=int(count.max()),
    )


def _scan(
    logits: np.ndarray,
    best_logits: np.ndarray,
    is_label: np.ndarray,
    hits: np.ndarray,
    used: np.ndarray,
) -> np.ndarray:
    """One batch's sums over its positions, per head: the Brier score of the `WIDTH` best
    tokens and the top-1 probability at every T of the grid, then hits and count.
    # (K, n, V), (K, n, w), (K, n, w), (K, n), (K, n) -> (2 T + 2, K)"""
    top = best_logits.max(axis=-1, keepdims=True)  # (K, n, 1): the largest logit
    shifted, best_shifted = logits - top, best_logits - top  # <= 0: exp never overflows
    scaled = np.empty_like(shifted)  # (K, n, V): one temperature at a time
    brier, confidence = [], []
    for temperature in GRID.tolist():
        np.multiply(shifted, np.float32(1 / temperature), out=scaled)
        total = np.exp(scaled, out=scaled).sum(axis=-1)  # (K, n): sum over V of e^(l - top)/T
        probs = np.exp(best_shifted / np.float32(temperature)) / total[..., None]
        brier.append((((probs - is_label) ** 2).sum(-1) * used).sum(-1, dtype=np.float64))
        confidence.append((used / total).sum(-1, dtype=np.float64))  # top-1: e^0 / total
    counts = [(hits * used).sum(-1, dtype=np.float64), used.sum(-1, dtype=np.float64)]
    return np.stack([*brier, *confidence, *counts])


def _rounded(values: Iterable[float]) -> list[float]:
    return [round(float(x), 4) for x in values]
