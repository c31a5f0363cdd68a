"""Replays Medusa's cost-sized trees under other sizing rules, from one run's proposals.

The target answers each suite's prompts with the Medusa heads at k=4 (every step proposes);
every proposal's candidates (raw scores, tree) and which of them the target's tokens then
went through are recorded. The replay feeds them, in order, to a fresh `DepthCalibration`
and sizes each tree by a rule; a tree of n nodes yields 1 + the nodes on the target's path
among them, and costs what a step of its size cost in the same-day A/Bs (the medians of
their step logs, which the A/B harness writes to its JSON output and which are not kept
here: SmolLM2 from the third run of results/ab-medusa-calibration-2026-12-06.txt, Qwen from
its Qwen run; in plain steps, the target alone's median step). Prints tokens per unit of
time (1.0: plain decoding) and τ per suite, per rule.

Caveats: the replay learns from each proposal as soon as it is made, where the drafter
learns once the context has gone past it (a step or two later); proposals still open when an
answer ends are not recorded; and every rule sees the proposals at the positions of the run
that made them, so a rule that keeps more never moves the later ones. Rules:

- current: the depth correction, `best_tree_size` on the calibrated v(n) (what ships);
- margin05 / margin10: a tree must promise 5% / 10% more tokens per time than the plain call;
- offered: a second factor, reached over predicted on the nodes offered (the best node when
  none was), fading 0.95 a proposal;
- oracle-cost: sized with the measured step costs instead of the calibrated v(n).

Run from the repository root, OpenBLAS preloaded:

  LD_PRELOAD=... .venv/bin/python results/medusa-sizing-replay-2026-12-06.py \
      smollm2-135m models/heads/smollm2-135m-medusa 6
  (qwen2.5-coder-1.5b models/heads/qwen2.5-coder-1.5b-medusa 3)
"""

import collections
import sys

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.drafters import calibration as C
from specmlx.drafters.eagle import best_tree_size
from specmlx.engine.sampling import SamplingConfig

SUITES = ["code", "extract", "chat", "creative"]
# Measured step cost by tokens verified (root included), in plain steps: 1 is an empty
# proposal (the heads ran, then a one-token call).
STEP_COSTS = {
    "smollm2-135m": {1: 1.02, 2: 1.146, 3: 1.278, 5: 1.399, 8: 1.515, 16: 1.9},
    "qwen2.5-coder-1.5b": {1: 1.03, 2: 1.20, 3: 1.33, 4: 1.49, 8: 1.58, 16: 1.76},
}


def collect(target: str, heads: str, per_suite: int) -> tuple[list[dict], object]:
    models = load(target, None, heads=[heads], default_draft=False)
    greedy = SamplingConfig(temperature=0.0)
    session = Session(
        models, GenerationConfig(method="medusa", k=4, max_tokens=64, sampling=greedy)
    )
    drafter = session.drafter
    records: list[dict] = []
    suite = [""]
    observe = C.DepthCalibration.observe

    def recording(self, context):
        before = list(self._pending)
        observe(self, context)
        for p in before:
            if (
                p in self._pending
                or tuple(context[max(0, p.position - len(p.tail)) : p.position]) != p.tail
            ):
                continue
            children = {}
            for i, (parent, token) in enumerate(zip(p.parents, p.tokens, strict=True)):
                children.setdefault((parent, token), i + 1)
            on_path, node = set(), 0
            for token in context[p.position : p.position + self.max_depth]:
                node = children.get((node, token))
                if node is None:
                    break
                on_path.add(node)
            reached = [int(i + 1 in on_path) for i in range(len(p.tokens))]
            records.append(
                dict(suite=suite[0], parents=list(p.parents), score=list(p.scores), reached=reached)
            )

    C.DepthCalibration.observe = recording
    for suite[0] in SUITES:
        for prompt in load_suite(suite[0], per_suite).prompts:
            session.target = type(session.target)(models.target)
            list(session.steps(encode_prompt(models, prompt.text, True)))
    C.DepthCalibration.observe = observe
    return records, drafter


def sized(probs, cost, step_cost, min_gain=0.0):
    """`best_tree_size` with a margin over the plain call: the plain call's rate, the one
    every tree must beat, raised by `min_gain` (its cost lowered to match)."""
    plain = (cost(1) + step_cost) / (1.0 + min_gain) - step_cost
    return best_tree_size(probs, lambda m: plain if m == 1 else cost(m), step_cost)


def replay(records, drafter, measured, margin=0.0, offered=False, oracle=False):
    def true_cost(m):
        sizes = sorted(measured)
        m = min(m, sizes[-1])  # trees are capped at the largest calibrated call (16)
        if m in measured:
            return measured[m]
        low = max(k for k in sizes if k < m)
        high = min(k for k in sizes if k > m)
        return measured[low] + (measured[high] - measured[low]) * (m - low) / (high - low)

    calibration = C.DepthCalibration(drafter.calibration.max_depth)
    predicted = reached_sum = 0.0
    totals = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in records:
        values = calibration.scaled(r["parents"], r["score"])
        factor = (reached_sum + 1.0) / (predicted + 1.0) if offered else 1.0
        values = [min(v * factor, 1.0) for v in values]
        order = sorted(range(len(values)), key=lambda i: -values[i])
        if oracle:
            n = sized(
                [values[i] for i in order],
                lambda m: true_cost(m) - drafter.step_cost,
                drafter.step_cost,
                margin,
            )
        else:
            n = sized([values[i] for i in order], drafter.verify_cost, drafter.step_cost, margin)
        kept = sum(r["reached"][i] for i in order[:n])
        t = totals[r["suite"]]
        t[0] += 1 + kept
        t[1] += true_cost(n + 1)
        t[2] += 1
        evidence = order[:n] if n else order[:1]
        predicted = predicted * 0.95 + sum(values[i] / factor for i in evidence)
        reached_sum = reached_sum * 0.95 + sum(r["reached"][i] for i in evidence)
        proposal = C._Proposal(
            0, (), tuple(r["parents"]), tuple(range(len(r["parents"]))), tuple(r["score"])
        )
        calibration._learn(proposal, sum(r["reached"]))
    return totals


target, heads, per_suite = sys.argv[1], sys.argv[2], int(sys.argv[3])
records, drafter = collect(target, heads, per_suite)
rules = {
    "current": {},
    "margin05": dict(margin=0.05),
    "margin10": dict(margin=0.10),
    "offered": dict(offered=True),
    "oracle-cost": dict(oracle=True),
}
print(f"{target}: {len(records)} proposals, {per_suite} prompts a suite, k=4, 64 tokens")
print(f"{'rule':12s}" + "".join(f"{s:>18s}" for s in [*SUITES, "all"]))
for name, options in rules.items():
    totals = replay(records, drafter, STEP_COSTS[target], **options)
    cells = []
    for s in [*SUITES, "all"]:
        rows = list(totals.values()) if s == "all" else [totals[s]]
        tokens, cost, n = (sum(x[i] for x in rows) for i in range(3))
        cells.append(f"{tokens / cost:9.3f} (τ {tokens / n:.2f})")
    print(f"{name:12s}" + "".join(f"{c:>18s}" for c in cells))
