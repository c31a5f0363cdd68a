"""`-k auto` with heads against the target alone, per suite, in one process: is it ever below?

SmolLM2-135M with its committed Medusa and EAGLE-3-style heads. Three sessions (the target
alone, `--method medusa`, `--method eagle`, both `-k auto`) answer each suite's first 2
prompts, the suites in the bench's order (code, extraction, chat, creative writing), each
prompt once per draw; the order of the three rotates per prompt, and each session keeps
what its policy learned across prompts, as the bench's rows do. T=0, 64 tokens. Prints per
suite each method's speed over the target alone (the mean of per-answer ratios of wall time,
± its standard error over prompts and draws) and τ (tokens per target call). Run from the
repository root, OpenBLAS preloaded (about 8 minutes for 4 draws of all suites; a second
argument names the suites, in order, e.g. `chat` alone), each prompt's mean ratio under its
suite's line:

  LD_PRELOAD=... .venv/bin/python results/ab-heads-auto-by-suite-2026-12-07.py 4
  LD_PRELOAD=... .venv/bin/python results/ab-heads-auto-by-suite-2026-12-07.py 4 chat
"""

import collections
import statistics
import sys
import time

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine.sampling import SamplingConfig

TARGET = "smollm2-135m"
HEADS = ["models/heads/smollm2-135m-medusa", "models/heads/smollm2-135m-eagle3"]
SUITES = ["code", "extract", "chat", "creative"]


def main():
    draws = int(sys.argv[1])
    suites = sys.argv[2].split(",") if len(sys.argv) > 2 else SUITES
    models = load(TARGET, None, heads=HEADS, default_draft=False)
    greedy = SamplingConfig(temperature=0.0)
    sessions = {
        method: Session(models, GenerationConfig(method=method, max_tokens=64, sampling=greedy))
        for method in ("none", "medusa", "eagle")
    }
    names = list(sessions)
    prompts = [(suite, p) for suite in suites for p in load_suite(suite, 2).prompts]
    out = collections.defaultdict(list)  # (method, suite) -> [(key, seconds, tokens, calls)]
    for draw in range(draws):
        for i, (suite, prompt) in enumerate(prompts):
            ids = encode_prompt(models, prompt.text, True)
            turn = (draw * len(prompts) + i) % len(names)
            for name in names[turn:] + names[:turn]:
                session = sessions[name]
                session.target = type(session.target)(models.target)  # a fresh cache: a prefill
                start = time.perf_counter()
                steps = list(session.steps(ids))
                seconds = time.perf_counter() - start
                tokens = sum(len(step.tokens) for step in steps)
                out[(name, suite)].append(((prompt.id, draw), seconds, tokens, len(steps)))
    print(
        f"# {TARGET}, -k auto, T=0, 64 tokens, 2 prompts a suite x {draws} draws, one process,"
        f" suites in this order: {', '.join(suites)}"
    )
    for suite in suites:
        base = {key: seconds for key, seconds, _, _ in out[("none", suite)]}
        parts = [f"{suite:8s}"]
        for name in names[1:]:
            rows = out[(name, suite)]
            ratios = [base[key] / seconds for key, seconds, _, _ in rows]
            error = statistics.stdev(ratios) / len(ratios) ** 0.5
            tau = sum(r[2] for r in rows) / sum(r[3] for r in rows)
            parts.append(f"{name} {statistics.mean(ratios):.3f} ± {error:.3f}x (τ {tau:.2f})")
        print(" | ".join(parts), flush=True)
        for prompt_id in dict.fromkeys(key[0] for key in base):
            parts = [f"  {prompt_id:24s}"]
            for name in names[1:]:
                ratios = [
                    base[key] / seconds
                    for key, seconds, _, _ in out[(name, suite)]
                    if key[0] == prompt_id
                ]
                parts.append(f"{name} {statistics.mean(ratios):.3f}x")
            print(" | ".join(parts), flush=True)


if __name__ == "__main__":
    sys.exit(main())
