"""Which signal tells, before a proposal, whether SmolLM2-135M's Medusa head 0 will guess the
token it drafts: the target's own confidence in the token it just produced, or head 0's
confidence in its guess?

On the target's greedy answers to each suite's first 4 prompts (64 tokens, T=0; the replay's
data, `results/policy-replay-2026-12-06.py`: hidden states from one pass), at each answer
position: the target's top probability there (its logits from the final hidden state; its
argmax is the answer's token everywhere) and head 0's top-1 probability, each bucketed, with
how often head 0's best token was the target's token two ahead. Run from the repository
root, OpenBLAS preloaded (about a minute once the replay's cache exists):

  LD_PRELOAD=... .venv/bin/python results/gate-signals-2026-12-07.py
"""

import importlib.util
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

from specmlx.api.load import load
from specmlx.engine.features import FeatureSpec

_spec = importlib.util.spec_from_file_location(
    "replay", Path(__file__).with_name("policy-replay-2026-12-06.py")
)
replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay)

TARGET, HEADS, PER_SUITE = "smollm2-135m", "models/heads/smollm2-135m-medusa", 4
TARGET_BUCKETS = ((0.0, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.01))
HEAD_BUCKETS = ((0.0, 0.3), (0.3, 0.6), (0.6, 0.9), (0.9, 1.01))


def buckets(values, hits, edges):
    parts = []
    for lo, hi in edges:
        inside = (values >= lo) & (values < hi)
        rate = f"{hits[inside].mean():.2f}" if inside.any() else "-"
        parts.append(f"[{lo:.2f}, {min(hi, 1.0):.2f}) {inside.mean():.2f} of positions, hit {rate}")
    return " ; ".join(parts)


def main():
    models = load(TARGET, None, heads=[HEADS], default_draft=False)
    heads = models.heads["medusa"]
    data = replay.precompute(models, TARGET, PER_SUITE, FeatureSpec(heads.config.feature_layers))
    rows = []
    for suite, ids, answer, feats in data:
        tokens, states = ids + answer, mx.array(feats)
        logits = (
            models.target.lm_head(states)
            if hasattr(models.target, "lm_head")
            else (models.target.model.embed_tokens.as_linear(states))
        )
        logits = logits.astype(mx.float32)
        top = np.array(mx.max(mx.softmax(logits, axis=-1), axis=-1))
        best = np.array(mx.argmax(logits, axis=-1))
        for j in range(len(ids) - 1, len(tokens) - 2):
            assert best[j] == tokens[j + 1], "the features are not the answer's"
            guess, confidence = heads.top_candidates(states[j], 1, 1)
            hit = guess.tolist()[0][0] == tokens[j + 2]
            rows.append((suite, float(top[j]), float(confidence[0, 0].item()), hit))
    print(f"# {HEADS}: head 0's top-1 guess of the token two ahead, by signal")
    for suite in (*replay.SUITES, "all"):
        chosen = [r for r in rows if suite in ("all", r[0])]
        target = np.array([r[1] for r in chosen])
        head = np.array([r[2] for r in chosen])
        hits = np.array([r[3] for r in chosen])
        print(f"{suite:8s} target's confidence: {buckets(target, hits, TARGET_BUCKETS)}")
        print(f"{'':8s} head 0's confidence: {buckets(head, hits, HEAD_BUCKETS)}")


if __name__ == "__main__":
    sys.exit(main())
