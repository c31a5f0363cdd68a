"""Why SmolLM2-135M's heads guess its chat answers so seldom: the answers they train on are
not the kind the bench's chat suite asks for.

Medusa head 0's best token against the target's token two ahead (the first token a proposal
drafts), on the target's greedy answers (T=0, 64 tokens) to prompts of six kinds: answers
the heads trained on (free Magpie draws of the recipe's data), held-out answers of the same
kind (every 20th prompt, as training holds out), held-out answers to the shipped training
prompts, held-out question draws (`train-heads --questions`, held out as training holds them
out where they follow the free draws; none trained on by the committed heads), and the
bench's chat and creative writing prompts. Also head 0's mean top-1 probability.
HEADS (default the committed Medusa heads) and DATA (a data folder holding both kinds of
draws) as arguments. Run from the repository root, OpenBLAS preloaded (a few minutes):

  LD_PRELOAD=... .venv/bin/python results/heads-chat-mismatch-2026-12-07.py [HEADS] [DATA]
"""

import sys
from pathlib import Path

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine.features import FeatureSpec
from specmlx.engine.sampling import SamplingConfig
from specmlx.training.data import read_prompts, target_features, train_prompts

HOLDOUT, PER_GROUP = 20, 10
QUESTIONS = "magpie-questions-512-seed0.jsonl"


def groups(data: Path) -> dict[str, list[str]]:
    shipped = train_prompts()
    free = [p for p in read_prompts(data / "magpie-512-seed0.jsonl") if p not in shipped]
    prompts = shipped + free  # the recipe's order: a prompt's group is its index
    held = [(g, p) for g, p in enumerate(prompts) if g % HOLDOUT == HOLDOUT - 1]
    trained = [(g, p) for g, p in enumerate(prompts) if g % HOLDOUT == 3]
    # Question draws follow the free ones: their groups go on from there.
    asked = [(len(prompts) + i, p) for i, p in enumerate(read_prompts(data / QUESTIONS))]
    return {
        "trained free draws": [p for g, p in trained if g >= len(shipped)][:PER_GROUP],
        "held-out free draws": [p for g, p in held if g >= len(shipped)][:PER_GROUP],
        "held-out shipped": [p for g, p in held if g < len(shipped)][:PER_GROUP],
        "held-out questions": [p for g, p in asked if g % HOLDOUT == HOLDOUT - 1][:PER_GROUP],
        "bench chat": [p.text for p in load_suite("chat").prompts[:PER_GROUP]],
        "bench creative": [p.text for p in load_suite("creative").prompts[:PER_GROUP]],
    }


def main():
    heads_dir = sys.argv[1] if len(sys.argv) > 1 else "models/heads/smollm2-135m-medusa"
    data = Path(sys.argv[2] if len(sys.argv) > 2 else "models/cache/heads/smollm2-135m")
    models = load("smollm2-135m", None, heads=[heads_dir], default_draft=False)
    heads = models.heads["medusa"]
    spec = FeatureSpec(heads.config.feature_layers)
    greedy = SamplingConfig(temperature=0.0)
    plain = Session(models, GenerationConfig(method="none", max_tokens=64, sampling=greedy))
    print(f"# {heads_dir}: head 0 on the target's greedy answers (64 tokens)")
    for name, prompts in groups(data).items():
        n = top1 = top5 = 0
        mean_p = 0.0
        for text in prompts:
            ids = encode_prompt(models, text, True)
            tokens = ids + [t for step in plain.steps(ids) for t in step.tokens]
            rows, _, _ = target_features(models.target, tokens[:-1], spec)
            for j in range(len(ids) - 1, len(tokens) - 2):
                best, probs = heads.top_candidates(rows[j], 5, 1)
                best = best.tolist()[0]
                n += 1
                top1 += best[0] == tokens[j + 2]
                top5 += tokens[j + 2] in best
                mean_p += probs[0, 0].item()
        print(
            f"{name:20s} {len(prompts):2d} prompts, {n:4d} positions: top-1 {top1 / n:.3f},"
            f" top-5 {top5 / n:.3f}, mean top-1 probability {mean_p / n:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
