"""The harness behind results/ab-plain-runs-2026-12-06.txt: what plain steps cost inside the
speculative loop. The target alone beside sessions of the Medusa heads whose policy never
speculates (runs of 16 double-buffered plain steps, with and without the target keeping its
hidden states for the heads; runs of one step, as `-k 0` would) and the real `-k auto`, in
one process, order rotated per prompt, T=0, 64 tokens. Prints speed over the target alone
(mean ± standard error over prompts and draws) and the mean step time over the target
alone's. Run from the repository root, OpenBLAS preloaded:

  LD_PRELOAD=... .venv/bin/python results/ab-plain-runs-2026-12-06.py smollm2-135m \
      models/heads/smollm2-135m-medusa 3 chat,creative
"""

import collections
import dataclasses
import statistics
import sys
import time

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine.policy import FixedK
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.step import Plan


class AlwaysPlain:
    def __init__(self, run):
        self.run = run

    def start(self):
        pass

    def choose(self):
        return Plan(0, run=self.run)

    def observe(self, step):
        pass


target, heads, draws, suites = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
models = load(target, None, heads=[heads], default_draft=False)
greedy = SamplingConfig(temperature=0.0)
prompts = [p for s in suites for p in load_suite(s, 2).prompts]


def mk(method):
    return Session(models, GenerationConfig(method=method, max_tokens=64, sampling=greedy))


sessions = {"none": mk("none")}
s = mk("medusa")
s._policies[greedy] = AlwaysPlain(16)
sessions["plain16-cap"] = s
s = mk("medusa")
s._policies[greedy] = AlwaysPlain(16)
s.drafter.traits = dataclasses.replace(s.drafter.traits, features=None)
sessions["plain16-nocap"] = s
s = mk("medusa")
s._policies[greedy] = FixedK(0)
sessions["plain1-cap"] = s
models.experience.clear()
models.learned_costs.clear()
sessions["auto"] = mk("medusa")
names = list(sessions)
out = collections.defaultdict(list)
for d in range(draws):
    for i, p in enumerate(prompts):
        ids = encode_prompt(models, p.text, True)
        r = (d * len(prompts) + i) % len(names)
        for name in names[r:] + names[:r]:
            s = sessions[name]
            s.target = type(s.target)(models.target)
            t0 = time.perf_counter()
            steps = list(s.steps(ids))
            total = time.perf_counter() - t0
            ntok = sum(len(x.tokens) for x in steps)
            dec = sum(x.seconds for x in steps[1:])
            out[name].append((p.id, d, total, ntok, dec / max(ntok - len(steps[0].tokens), 1)))
base = {(a, b): c for a, b, c, _, _ in out["none"]}
basestep = {(a, b): e for a, b, _, _, e in out["none"]}
for name in names:
    rs = [base[(a, b)] / c for a, b, c, _, _ in out[name]]
    ss = [e / basestep[(a, b)] for a, b, _, _, e in out[name]]
    print(
        f"{name:14s} speed x none {statistics.mean(rs):.3f} ± {statistics.stdev(rs) / len(rs) ** 0.5:.3f}  per-step time / none {statistics.mean(ss):.3f}"
    )
