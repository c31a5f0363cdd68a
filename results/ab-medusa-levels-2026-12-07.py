"""Medusa proposals priced per head (a proposal k deep runs the first k heads: P(k) = P0 +
k·l, timed here) against one figure for all heads (the cost of a proposal of every head,
whatever k the policy asks for, as `--method medusa` prices them), at `-k auto` on
SmolLM2-135M. Not kept: see the txt beside this file.

One process: two loaded copies of the models, one per pricing (each carries its own policy
experience), the target alone on the first; 4 suites × 2 prompts × DRAWS draws (after one
warm-up draw), 64 tokens, T=0, rows interleaved prompt by prompt; every ratio is paired
with the same prompt's and draw's target alone. Also the proposal costs as timed, and per
suite the mean depth the policy asked for. Run from the repository root, OpenBLAS
preloaded (about 10 minutes with 4 draws):

  LD_PRELOAD=... .venv/bin/python results/ab-medusa-levels-2026-12-07.py 4
"""

import statistics as st
import sys
import time

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.methods import MAX_TREE, _proposal_costs
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.drafters.medusa import MedusaDrafter
from specmlx.engine.sampling import SamplingConfig

HEADS = "models/heads/smollm2-135m-medusa"
SUITES = ["code", "extract", "chat", "creative"]
GREEDY = SamplingConfig(temperature=0.0)


def config(**kw):
    return GenerationConfig(max_tokens=64, sampling=GREEDY, **kw)


def main():
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    at_once = load("smollm2-135m", None, heads=[HEADS], default_draft=False)
    per_head = load("smollm2-135m", None, heads=[HEADS], default_draft=False)
    priced_per_head = Session(per_head, config(method="medusa", k=None))
    shipped = priced_per_head.drafter
    heads = per_head.heads["medusa"]
    depth = heads.config.num_heads
    throwaway = MedusaDrafter(heads, MAX_TREE, shipped.width)
    one, full = _proposal_costs(per_head, throwaway, [1, depth])
    level = max(full - one, 0.0) / (depth - 1)
    fixed = max(one - level, 0.0)
    print(f"# proposal: {fixed:.3f} + {level:.4f} a head of a target call ({depth} heads)")
    priced_per_head.drafter = MedusaDrafter(
        heads,
        shipped.tree_size,
        shipped.width,
        verify_cost=shipped.verify_cost,
        step_cost=fixed,
        chains=shipped.chains,
        level_cost=level,
    )
    priced_per_head._policies = {}  # made anew from the drafter's traits
    rows = {
        "none": Session(at_once, config(method="none")),
        "at once": Session(at_once, config(method="medusa", k=None)),
        "per head": priced_per_head,
    }
    prompts = {
        s: [encode_prompt(per_head, p.text, True) for p in load_suite(s).prompts[:2]]
        for s in SUITES
    }
    times, outputs, depths = {}, {}, {}
    for draw in range(draws + 1):  # draw 0 warms up
        for suite in SUITES:
            for i, ids in enumerate(prompts[suite]):
                for row, session in rows.items():
                    start = time.perf_counter()
                    tokens = []
                    for step in session.steps(ids):
                        tokens += step.tokens
                        if draw and not step.plain:
                            depths.setdefault((row, suite), []).append(step.requested)
                    seconds = time.perf_counter() - start
                    outputs.setdefault((suite, i), set()).add(tuple(tokens))
                    if draw:
                        times.setdefault((row, suite), []).append(seconds / len(tokens))
    print(
        f"# SmolLM2-135M, its Medusa heads at -k auto, 4 suites x 2 prompts x {draws} draws,"
        " 64 tokens, T=0; paired ratios to the target alone (tokens per second), and the"
        " mean depth asked of speculative steps"
    )
    for row in ("at once", "per head"):
        parts, every = [], []
        for suite in SUITES:
            ratios = [
                a / b for a, b in zip(times[("none", suite)], times[(row, suite)], strict=True)
            ]
            every += ratios
            asked = depths.get((row, suite), [0])
            parts.append(f"{suite} {st.mean(ratios):.3f} (k {st.mean(asked):.1f})")
        spread = st.stdev(every) / len(every) ** 0.5
        print(f"{row:8s} " + " | ".join(parts) + f" | all {st.mean(every):.3f} ± {spread:.3f}")
    print("identical outputs:", all(len(o) == 1 for o in outputs.values()))


if __name__ == "__main__":
    sys.exit(main())
