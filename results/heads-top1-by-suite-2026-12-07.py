"""How often SmolLM2-135M's Medusa heads guess the target's own tokens, by bench suite.

On the target's greedy answers (T=0, 64 tokens) to each suite's first 4 prompts, with the
target's hidden states from one pass over prompt and answer (the replay's data,
`results/policy-replay-2026-12-06.py`), at every answer position: whether head 0's most
probable token is the target's token two ahead (the first token a proposal drafts), whether
it is among head 0's 5 best, whether head 1's best is the token three ahead, and head 0's
mean top-1 probability (temperatures as the heads ship: none). Run from the repository root,
OpenBLAS preloaded (a minute once the replay's cache exists, a few more to build it):

  LD_PRELOAD=... .venv/bin/python results/heads-top1-by-suite-2026-12-07.py
"""

import importlib.util
import sys
from pathlib import Path

import mlx.core as mx

from specmlx.api.load import load
from specmlx.engine.features import FeatureSpec

_spec = importlib.util.spec_from_file_location(
    "replay", Path(__file__).with_name("policy-replay-2026-12-06.py")
)
replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay)

TARGET, HEADS, PER_SUITE = "smollm2-135m", "models/heads/smollm2-135m-medusa", 4


def main():
    models = load(TARGET, None, heads=[HEADS], default_draft=False)
    heads = models.heads["medusa"]
    data = replay.precompute(models, TARGET, PER_SUITE, FeatureSpec(heads.config.feature_layers))
    counts = {}
    for suite, ids, answer, feats in data:
        tokens, rows = ids + answer, mx.array(feats)
        for j in range(len(ids) - 1, len(tokens) - 2):
            ids_, probs = heads.top_candidates(rows[j], 5, 2)
            best = ids_.tolist()
            c = counts.setdefault(suite, [0, 0, 0, 0, 0, 0.0])
            c[0] += 1
            c[1] += best[0][0] == tokens[j + 2]
            c[2] += tokens[j + 2] in best[0]
            if j + 3 < len(tokens):
                c[3] += 1
                c[4] += best[1][0] == tokens[j + 3]
            c[5] += probs[0, 0].item()
    print(f"# {HEADS}: per suite, {PER_SUITE} prompts, the target's greedy answers (64 tokens)")
    for suite, (n, top1, top5, n1, head1, p) in counts.items():
        print(
            f"{suite:8s} head 0 top-1 {top1 / n:.3f}, top-5 {top5 / n:.3f}, mean top-1"
            f" probability {p / n:.3f}; head 1 top-1 {head1 / n1:.3f} ({n} positions)"
        )


if __name__ == "__main__":
    sys.exit(main())
