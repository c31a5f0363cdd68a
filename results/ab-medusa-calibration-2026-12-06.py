"""The harness behind results/ab-medusa-calibration-2026-12-06.txt: the target alone and, for
each method, a session of the heads with the depth correction off ('raw') and on ('cal'), in
one process, order rotated per prompt. Run from the repository root, OpenBLAS preloaded:

  LD_PRELOAD=... .venv/bin/python results/ab-medusa-calibration-2026-12-06.py \
      qwen2.5-coder-1.5b models/heads/qwen2.5-coder-1.5b-medusa medusa 2 \
      code,extract,chat,creative ab-qwen.json

(SmolLM2: smollm2-135m models/heads/smollm2-135m-medusa medusa 3 ...; the first two SmolLM2
blocks' 'eagle' rows ran with the EagleDrafter wired to DepthCalibration, as it was while
measuring, and 'bin'/'calprior' with an experimental variant; neither landed.)
"""

import collections
import json
import math
import sys
import time

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine.sampling import SamplingConfig

target, heads, methods = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
draws, suites, out_path = int(sys.argv[4]), sys.argv[5].split(","), sys.argv[6]
models = load(target, None, heads=heads, default_draft=False)
prompts = [p for s in suites for p in load_suite(s, 2).prompts]
suite_of = {p.id: s for s in suites for p in load_suite(s, 2).prompts}
greedy = SamplingConfig(temperature=0.0)
sessions = {"none": Session(models, GenerationConfig(method="none", max_tokens=64, sampling=greedy))}
for m in methods:
    for variant in ("raw", "cal"):
        s = Session(models, GenerationConfig(method=m, max_tokens=64, sampling=greedy))
        if variant == "raw":
            depth = s.drafter.calibration.max_depth
            s.drafter.calibration.ratios = lambda depth=depth: [1.0] * depth
        models.experience.clear()  # each session keeps its own policy state
        models.learned_costs.clear()
        sessions[f"{m}-{variant}"] = s
names = list(sessions)
out = collections.defaultdict(list)
for d in range(draws):
    for i, p in enumerate(prompts):
        ids = encode_prompt(models, p.text, True)
        r = (d * len(prompts) + i) % len(names)
        for name in names[r:] + names[:r]:
            s = sessions[name]
            s.target = type(s.target)(models.target)  # every row prefills the prompt afresh
            t0 = time.perf_counter()
            steps = list(s.steps(ids))
            total = time.perf_counter() - t0
            out[name].append(
                dict(
                    prompt=p.id,
                    suite=suite_of[p.id],
                    draw=d,
                    total=total,
                    steps=[(st.k, st.n_drafted, st.n_accepted, len(st.tokens), st.seconds) for st in steps],
                )
            )
        print(d, p.id, flush=True)
json.dump(out, open(out_path, "w"))
for suite in suites + ["all"]:
    for name in names[1:]:
        rs = [(a, b) for a, b in zip(out["none"], out[name]) if suite in ("all", a["suite"])]
        logs = [math.log(a["total"] / b["total"]) for a, b in rs]
        mu = sum(logs) / len(logs)
        se = (sum((x - mu) ** 2 for x in logs) / max(len(logs) - 1, 1) / len(logs)) ** 0.5
        calls = sum(len(b["steps"]) for _, b in rs)
        toks = sum(sum(x[3] for x in b["steps"]) for _, b in rs)
        print(f"{suite:8s} {name:12s} tau {toks / calls:.2f}  x {math.exp(mu):.3f} ± {se:.3f}  ({len(rs)} pairs)")
