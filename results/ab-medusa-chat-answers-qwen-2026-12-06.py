"""The harness behind results/ab-medusa-chat-answers-qwen-2026-12-06.txt: two sets of Medusa heads
for one target in one process, the target alone beside them, order rotated per prompt, `-k
auto`, T=0, 64 tokens, 2 prompts a suite. Run from the repository root, OpenBLAS preloaded:

  LD_PRELOAD=... .venv/bin/python results/ab-medusa-chat-answers-qwen-2026-12-06.py \
      qwen2.5-coder-1.5b models/heads/qwen2.5-coder-1.5b-medusa \
      models/heads/qwen2.5-coder-1.5b-medusa-chat 2 ab.json
"""

import collections
import json
import statistics
import sys
import time

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine.sampling import SamplingConfig
from specmlx.heads import load_heads

target, old, new, draws, out_path = (
    sys.argv[1],
    sys.argv[2],
    sys.argv[3],
    int(sys.argv[4]),
    sys.argv[5],
)
suites = ["code", "extract", "chat", "creative"]
models = load(target, None, heads=[old], default_draft=False)
greedy = SamplingConfig(temperature=0.0)


def mk(method):
    return Session(models, GenerationConfig(method=method, max_tokens=64, sampling=greedy))


sessions = {"none": mk("none"), "old": mk("medusa")}
old_heads = models.heads["medusa"]
models.heads["medusa"] = load_heads(new, models.target, models.tokenizer)
models.experience.clear()
models.learned_costs.clear()
sessions["new"] = mk("medusa")
prompts = [(s, p) for s in suites for p in load_suite(s, 2).prompts]
names = list(sessions)
out = collections.defaultdict(list)
for d in range(draws):
    for i, (suite, p) in enumerate(prompts):
        ids = encode_prompt(models, p.text, True)
        r = (d * len(prompts) + i) % len(names)
        for name in names[r:] + names[:r]:
            s = sessions[name]
            s.target = type(s.target)(models.target)
            t0 = time.perf_counter()
            steps = list(s.steps(ids))
            total = time.perf_counter() - t0
            out[name].append(
                dict(
                    suite=suite,
                    prompt=p.id,
                    draw=d,
                    total=total,
                    tokens=sum(len(x.tokens) for x in steps),
                    calls=len(steps),
                )
            )
        print(d, suite, p.id, {n: round(out[n][-1]["total"], 2) for n in names}, flush=True)
json.dump(out, open(out_path, "w"), indent=1)
base = {(r["prompt"], r["draw"]): r for r in out["none"]}
for name in names[1:]:
    for suite in suites + ["all"]:
        rows = [r for r in out[name] if suite in ("all", r["suite"])]
        ratios = [base[(r["prompt"], r["draw"])]["total"] / r["total"] for r in rows]
        tau = sum(r["tokens"] for r in rows) / sum(r["calls"] for r in rows)
        se = statistics.stdev(ratios) / len(ratios) ** 0.5
        print(
            f"{name:4s} {suite:9s} x none {statistics.mean(ratios):.3f} ± {se:.3f}  tau {tau:.2f}"
        )
