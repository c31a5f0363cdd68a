"""Temperatures that make the heads' probabilities honest: fitted on held-out answers.

A head's probabilities size its trees: a node is worth verifying when its path's probability,
read as its chance of being kept, pays for the tokens it adds to the target's call
(`specmlx.drafters.eagle.best_tree_size`). Heads trained on little data learn their training
answers better than the target (Medusa on SmolLM2: training top-1 65% at its first head, 31%
held out) and grow overconfident: their trees grow larger than what they keep pays for, and a
deep guess outranks a second guess one level up.

Temperature scaling (Guo et al. 2017) mends it with one number per Medusa head (per EAGLE
step: the level it drafts, on its own earlier outputs as training tests it): the T for which
softmax(logits / T) gives the target's greedy tokens at held-out positions the least
negative log-likelihood. Dividing the logits by T keeps every head's ranking of its tokens,
so what a head proposes is unchanged; only the probabilities, hence the tree's shape and
size, move. The fit is a scan of a fine grid of T (the likelihood is convex in 1/T).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from specmlx.training.losses import BatchFn, LogitsFn
from specmlx.training.objectives import Windows

# 1/4 to 16 in steps of 2^(1/16) (4.4%): finer than the temperature matters to a tree's size.
GRID = 2.0 ** (np.arange(-32, 65) / 16)


@dataclass(frozen=True)
class Fit:
    """Per head: the fitted temperature, the held-out negative log-likelihood at T = 1 and
    at it, the mean top-1 probability at T = 1 and at it, and the top-1 accuracy (what a
    calibrated head's mean top-1 probability is close to), over `positions` positions."""

    temperatures: list[float]
    nll: list[float]
    nll_fitted: list[float]
    confidence: list[float]
    confidence_fitted: list[float]
    accuracy: list[float]
    positions: int

    def record(self) -> dict:
        """For the heads' training record (config.json)."""
        return {
            "temperatures": self.temperatures,
            "heldout_nll": {"at_1": self.nll, "fitted": self.nll_fitted},
            "heldout_top1_probability": {"at_1": self.confidence, "fitted": self.confidence_fitted},
            "heldout_top1": self.accuracy,
            "positions": self.positions,
        }


def fit_temperatures(logits_of: LogitsFn, batch_of: BatchFn, windows: Windows) -> Fit | None:
    """Each head's temperature fitted on every position of `windows` that counts (None: some
    head has no such position). Evaluated batch by batch, in one pass; no gradients."""
    sums: mx.array | None = None  # (2 T + 2, K): NLL and top-1 probability per T, hits, count
    for span in windows.in_order():
        logits, labels, used = logits_of(*batch_of(*span))
        k, v = logits.shape[0], logits.shape[-1]
        logits = logits.astype(mx.float32).reshape(k, -1, v)
        labels, used = labels.reshape(k, -1), used.reshape(k, -1).astype(mx.float32)
        picked = mx.take_along_axis(logits, mx.maximum(labels, 0)[..., None], axis=-1)[..., 0]
        top = logits.max(axis=-1)  # (K, N)
        nll, confidence = [], []
        for t in GRID.tolist():  # (K, N) at a time: never (T, K, N, V) at once
            norm = mx.logsumexp(logits / t, axis=-1)
            nll.append(((norm - picked / t) * used).sum(-1))
            confidence.append((mx.exp(top / t - norm) * used).sum(-1))
        hits = (mx.argmax(logits, axis=-1) == labels).astype(mx.float32)
        batch_sums = mx.stack([*nll, *confidence, (hits * used).sum(-1), used.sum(-1)])
        sums = batch_sums if sums is None else sums + batch_sums
        mx.eval(sums)
    if sums is None:
        return None
    table = np.array(sums.tolist())
    count = table[-1]
    if not count.min() > 0:
        return None
    nll, confidence = table[: len(GRID)] / count, table[len(GRID) : -2] / count  # (T, K)
    best = nll.argmin(axis=0)
    one = int(np.flatnonzero(GRID == 1.0)[0])
    heads = range(len(count))

    def rounded(values: object) -> list[float]:
        return [round(float(x), 4) for x in values]  # type: ignore[attr-defined]

    return Fit(
        temperatures=rounded(GRID[best]),
        nll=rounded(nll[one]),
        nll_fitted=rounded(nll[best[h], h] for h in heads),
        confidence=rounded(confidence[one]),
        confidence_fitted=rounded(confidence[best[h], h] for h in heads),
        accuracy=rounded(table[-2] / count),
        positions=int(count.max()),
    )
