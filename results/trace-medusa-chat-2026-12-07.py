"""Where SmolLM2-135M's Medusa heads lose time in chat at `-k auto`: its steps by kind.

The target alone and the heads at `-k auto` answer the chat suite's first 2 prompts (64
tokens, T=0), interleaved prompt by prompt, 3 draws after a warm-up of each. Per row: speed
over the target alone's, and each kind of step after a response's first (plain steps;
empty proposals: the heads ran, no node paid, a one-token call followed; speculative steps
with their tokens a step and nodes verified), mean wall time. Each step times its own call
(`decode.QUEUE_AHEAD`, the CPU's default). Run from the repository root, OpenBLAS preloaded
(about 3 minutes):

  LD_PRELOAD=... .venv/bin/python results/trace-medusa-chat-2026-12-07.py
"""

import statistics as st
import sys
import time

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine.sampling import SamplingConfig

HEADS = "models/heads/smollm2-135m-medusa"


def main():
    models = load("smollm2-135m", None, heads=[HEADS], default_draft=False)
    greedy = SamplingConfig(temperature=0.0)
    rows = {
        name: Session(models, GenerationConfig(max_tokens=64, sampling=greedy, **kw))
        for name, kw in (("none", {"method": "none"}), ("auto", {"method": "medusa", "k": None}))
    }
    prompts = [encode_prompt(models, p.text, True) for p in load_suite("chat").prompts[:2]]
    for session in rows.values():
        for ids in prompts:
            list(session.steps(ids))
    seen = {
        name: {"seconds": 0.0, "tokens": 0, "plain": [], "empty": [], "spec": []} for name in rows
    }
    for _ in range(3):
        for ids in prompts:
            for name, session in rows.items():
                start = time.perf_counter()
                for i, step in enumerate(session.steps(ids)):
                    seen[name]["tokens"] += len(step.tokens)
                    if i == 0:
                        continue  # a response's first step also sets up
                    if step.plain and not step.proposed:
                        seen[name]["plain"].append(step.seconds)
                    elif step.plain:
                        seen[name]["empty"].append(step.seconds)
                    else:
                        seen[name]["spec"].append((step.seconds, len(step.tokens), step.n_drafted))
                seen[name]["seconds"] += time.perf_counter() - start
    base = seen["none"]["seconds"] / seen["none"]["tokens"]
    print("# SmolLM2-135M, chat, 2 prompts x 3 draws, 64 tokens, T=0; ms a step")
    for name, s in seen.items():
        line = f"{name}: {base / (s['seconds'] / s['tokens']):.3f}x the target alone"
        line += f" | plain {len(s['plain'])}, {st.mean(s['plain']) * 1e3:.1f} ms"
        if s["empty"]:
            line += f" | empty proposals {len(s['empty'])}, {st.mean(s['empty']) * 1e3:.1f} ms"
        if s["spec"]:
            spec = s["spec"]
            line += (
                f" | speculative {len(spec)}, {st.mean(x[0] for x in spec) * 1e3:.1f} ms,"
                f" {st.mean(x[1] for x in spec):.2f} tokens, {st.mean(x[2] for x in spec):.1f}"
                f" nodes, {sum(x[1] == 1 for x in spec)} kept nothing"
            )
        print(line)


if __name__ == "__main__":
    sys.exit(main())
