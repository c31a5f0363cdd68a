"""SmolLM2-135M's heads trained with question draws against the committed ones, in one
process: `-k auto` speed over the target alone and τ per suite.

The committed heads (the recipe's data: the shipped prompts, 512 free Magpie draws, 200k
tokens of the standard library) and heads trained on that data plus the answers to 512
question draws (`train-heads --questions 512`: 453 distinct prompts, 463,466 tokens against
340,721; the same commands and steps otherwise). Five sessions: the target alone, and each
kind (`--method medusa`, `--method eagle`) with each pair of heads, all `-k auto`, T=0, 64
tokens, each suite's first 2 prompts in the bench's order, each prompt once per draw, the
order of the five rotating per prompt; each session keeps what its policy learned across
prompts, as the bench's rows do. Prints per suite each row's speed over the target alone
(the mean of per-answer ratios of wall time, ± its standard error) and τ. Run from the
repository root, OpenBLAS preloaded (about 3 minutes a draw):

  LD_PRELOAD=... .venv/bin/python results/ab-heads-questions-smollm2-2026-12-07.py 3 \
      models/cache/exp/medusa-q512 models/cache/exp/eagle3-q512
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
COMMITTED = ["models/heads/smollm2-135m-medusa", "models/heads/smollm2-135m-eagle3"]
SUITES = ["code", "extract", "chat", "creative"]


def main():
    draws, new_heads = int(sys.argv[1]), sys.argv[2:4]
    committed = load(TARGET, None, heads=COMMITTED, default_draft=False)
    questions = load(TARGET, None, heads=new_heads, default_draft=False)
    greedy = SamplingConfig(temperature=0.0)

    def session(models, method):
        k = None if method != "none" else 1
        config = GenerationConfig(method=method, k=k, max_tokens=64, sampling=greedy)
        return Session(models, config)

    sessions = {
        "none": session(committed, "none"),
        "medusa committed": session(committed, "medusa"),
        "medusa questions": session(questions, "medusa"),
        "eagle3 committed": session(committed, "eagle"),
        "eagle3 questions": session(questions, "eagle"),
    }
    prompts = [
        (suite, encode_prompt(committed, p.text, True))
        for suite in SUITES
        for p in load_suite(suite).prompts[:2]
    ]
    for s in sessions.values():  # warm-up: compile, calibrate, time the proposals
        list(s.steps(prompts[0][1]))
    ratios = collections.defaultdict(list)
    calls = collections.defaultdict(lambda: [0, 0])
    names = list(sessions)
    turn = 0
    for _ in range(draws):
        for suite, ids in prompts:
            order = names[turn % len(names) :] + names[: turn % len(names)]
            turn += 1
            seconds = {}
            for name in order:
                start, tokens, steps = time.perf_counter(), 0, 0
                for step in sessions[name].steps(ids):
                    tokens += len(step.tokens)
                    steps += 1
                seconds[name] = (time.perf_counter() - start) / tokens
                calls[(suite, name)][0] += tokens
                calls[(suite, name)][1] += steps
            for name in names[1:]:
                ratios[(suite, name)].append(seconds["none"] / seconds[name])
                ratios[("all", name)].append(seconds["none"] / seconds[name])
    print(f"# {TARGET}, -k auto, T=0, 64 tokens, 2 prompts a suite x {draws} draws, one process")
    print(f"# questions: {new_heads[0]}, {new_heads[1]}")
    for suite in [*SUITES, "all"]:
        cells = []
        for name in names[1:]:
            r = ratios[(suite, name)]
            se = statistics.stdev(r) / len(r) ** 0.5
            if suite == "all":
                tokens = sum(calls[(s, name)][0] for s in SUITES)
                steps = sum(calls[(s, name)][1] for s in SUITES)
            else:
                tokens, steps = calls[(suite, name)]
            cells.append(f"{name} {statistics.mean(r):.3f} ± {se:.3f}x τ {tokens / steps:.2f}")
        print(f"{suite:8s} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    sys.exit(main())
