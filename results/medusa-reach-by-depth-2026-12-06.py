"""How much of the mass Medusa heads put at each depth the target's tokens reached, per suite:
offline, along the target's greedy answers stored in a bench's results file (the 'none' rows,
first draw), each position's candidate tree being the heads' 63 best paths (width 8), as a
cost-sized tree's candidates are (positions with K answer tokens after them). Printed:
reached / predicted at depths 1..K. Run from the repository root, OpenBLAS preloaded:

  LD_PRELOAD=... .venv/bin/python results/medusa-reach-by-depth-2026-12-06.py \
      qwen2.5-coder-1.5b models/heads/qwen2.5-coder-1.5b-medusa \
      results/bench-heads-qwen-recipe-2026-12-06.json
  (SmolLM2: smollm2-135m models/heads/smollm2-135m-medusa results/bench-heads-smollm2-recipe-2026-12-06.json)
"""

import collections
import json
import sys

import mlx.core as mx

from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.bench.suites import SUITES, load_suite
from specmlx.drafters.calibration import DepthCalibration, node_depths
from specmlx.drafters.medusa import MedusaDrafter
from specmlx.engine.features import FeatureSpec
from specmlx.training.data import target_features

target, heads_dir, results = sys.argv[1:4]
models = load(target, heads=[heads_dir], default_draft=False, progress=False)
heads = models.heads["medusa"]
K = heads.config.num_heads
prompts = {p.id: (suite, p.text) for suite in SUITES for p in load_suite(suite).prompts}
rows, seen = [], set()
for row in json.load(open(results))["results"]:
    if row["row"] == "none" and row["prompt_id"] not in seen:
        seen.add(row["prompt_id"])
        rows.append(row)
drafter = MedusaDrafter(heads, tree_size=64, width=8)
sums = collections.defaultdict(lambda: [[0.0] * K, [0.0] * K])  # suite: predicted, reached
for row in rows:
    suite, text = prompts[row["prompt_id"]]
    prompt = encode_prompt(models, text, True)
    seq = prompt + row["token_ids"][0]
    features, _, _ = target_features(models.target, seq, FeatureSpec(heads.config.feature_layers))
    predicted, reached = sums[suite]
    for p in range(len(prompt), len(seq) - K):  # positions with K tokens after them
        # At a step whose context is seq[:p + 1], the heads read the feature of seq[p - 1].
        ids, probs = heads.top_candidates(features[p - 1], 8, K)
        host = mx.concatenate([ids.astype(mx.float32), probs]).tolist()
        builder, scores = drafter._best_paths(host[:K], host[K:])
        one = DepthCalibration(K, fade=1.0, pseudo_mass=0.0)
        one.remember(seq[: p + 1], builder.parents, builder.tokens, scores)
        one.observe(seq[: p + 1 + K])
        for depth, score in zip(node_depths(builder.parents), scores, strict=True):
            predicted[depth - 1] += score
        for j in range(K):
            reached[j] += one.reached[j]
for suite, (predicted, reached) in sums.items():
    ratios = " ".join(f"{r / p:.2f}" if p else "-" for p, r in zip(predicted, reached, strict=True))
    print(f"{suite:9s} reached/predicted by depth: {ratios}")
