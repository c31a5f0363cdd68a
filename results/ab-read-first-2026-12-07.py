"""Plain steps on the CPU backend: the next call queued before the host reads a token
(double-buffered, `decode.QUEUE_AHEAD = True`) against queued once it has read it (its graph
still built before: `False`, now the CPU's default).

First, per-step times of one plain run of 24 tokens (SmolLM2-135M, compiled calls), each
way: queued ahead, the first step times two calls and the last next to none, because
`mx.async_eval` does most of a call's work before it returns on this backend; the policy
learns its speed from these times. Then an A/B in one process: two loaded copies of the
models, one per setting (each carries its own policy experience), the target alone and
Medusa heads at `-k auto`, 4 suites × 2 prompts × DRAWS draws (after one warm-up draw),
64 tokens, T=0, rows interleaved prompt by prompt; every ratio is paired with the same
prompt's and draw's `ahead none`. Run from the repository root, OpenBLAS preloaded (about
12 minutes with 4 draws):

  LD_PRELOAD=... .venv/bin/python results/ab-read-first-2026-12-07.py 4
"""

import statistics as st
import sys
import time

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine import decode
from specmlx.engine.sampling import SamplingConfig

HEADS, METHOD = "models/heads/smollm2-135m-medusa", "medusa"
SUITES = ["code", "extract", "chat", "creative"]
GREEDY = SamplingConfig(temperature=0.0)


def sessions(models):
    def make(**kw):
        return Session(models, GenerationConfig(max_tokens=64, sampling=GREEDY, **kw))

    return {"none": make(method="none"), "auto": make(method=METHOD, k=None)}


def step_times(models):
    plain = Session(models, GenerationConfig(method="none", max_tokens=24, sampling=GREEDY))
    ids = encode_prompt(models, load_suite("chat").prompts[0].text, True)
    for ahead in (True, False):
        decode.QUEUE_AHEAD = ahead
        for _ in range(2):
            list(plain.steps(ids))
        times = " ".join(f"{step.seconds * 1e3:.0f}" for step in plain.steps(ids))
        print(f"# {'ahead' if ahead else 'read-first'}, ms a step: {times}")


def main():
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    variants = {}
    for name, ahead in (("ahead", True), ("read-first", False)):
        models = load("smollm2-135m", None, heads=[HEADS], default_draft=False)
        variants[name] = (ahead, sessions(models))
    step_times(models)
    prompts = {
        s: [encode_prompt(models, p.text, True) for p in load_suite(s).prompts[:2]] for s in SUITES
    }
    times, outputs = {}, {}
    for draw in range(draws + 1):  # draw 0 warms up
        for suite in SUITES:
            for i, ids in enumerate(prompts[suite]):
                for name, (ahead, rows) in variants.items():
                    decode.QUEUE_AHEAD = ahead
                    for row, session in rows.items():
                        start = time.perf_counter()
                        tokens = [t for step in session.steps(ids) for t in step.tokens]
                        seconds = time.perf_counter() - start
                        outputs.setdefault((suite, i), set()).add(tuple(tokens))
                        if draw:
                            times.setdefault((name, row, suite), []).append(seconds / len(tokens))
    print(
        f"# {METHOD} heads, SmolLM2-135M, 4 suites x 2 prompts x {draws} draws, 64 tokens, T=0;"
        " paired ratios to 'ahead none' (tokens per second)"
    )
    for name in variants:
        for row in ("none", "auto"):
            parts, every = [], []
            for suite in SUITES:
                base = times[("ahead", "none", suite)]
                ratios = [a / b for a, b in zip(base, times[(name, row, suite)], strict=True)]
                every += ratios
                parts.append(f"{suite} {st.mean(ratios):.3f}")
            spread = st.stdev(every) / len(every) ** 0.5
            print(
                f"{name:10s} {row:5s} "
                + " | ".join(parts)
                + f" | all {st.mean(every):.3f} ± {spread:.3f}"
            )
    print("identical outputs:", all(len(o) == 1 for o in outputs.values()))


if __name__ == "__main__":
    sys.exit(main())
