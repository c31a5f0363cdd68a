"""Replays `-k auto` with Medusa heads on the target's own greedy answers, steps priced at
measured costs, to see what the policy's decisions cost or gain without timing noise.

For each suite's first PER_SUITE prompts the target answers alone (T=0, 64 tokens) and one
pass over prompt and answer gives its hidden states at every position (what the heads read).
Then a session of the heads runs over the bench's order (suites in turn, each prompt twice,
the policy's experience carried across answers) with the real policy and drafter, the
target replaced by those states: a plain step costs 1, a speculative step what a step of
its size cost in the same-day A/Bs (`STEP_COSTS`, plain steps; 1 node: an empty proposal),
and it yields its accepted nodes along the answer plus one. Prints tokens per unit of time
(1.0: plain decoding), τ, speculative steps of all steps, and trees offered, per suite.

Caveats: the drafter sizes trees by the calibration timed when the target loads (figures
move by up to 0.01 between processes; variants run in one process share it); a plain run
costs 1 a step, where a real run that a speculative step interrupts pays about 0.06 more to
restart (double-buffering), charged per plain run by the variant part `restartR` (R of a call,
e.g. `current+restart0.06`); step costs are medians, the same in every suite.

Variants (comma-separated): current; priorP (Medusa's prior first-position acceptance P in
place of 0.6); fold (a response after the first counts the prior once: folded into what it
carries). A last argument `trace` prints each answer's steps (`.` plain, `e` an empty
proposal, a digit the tokens a tree kept), from which the first chat answer's 47
speculative steps are read. Run from the repository root, OpenBLAS preloaded:

  LD_PRELOAD=... .venv/bin/python results/policy-replay-2026-12-06.py smollm2-135m \
      models/heads/smollm2-135m-medusa 2 current,prior0.3,prior0.2,fold
"""

import pickle
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.load import load
from specmlx.api.session import Session
from specmlx.bench.suites import load_suite
from specmlx.engine.features import FeatureSpec
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.step import Step, draft_length
from specmlx.training.data import target_features

SUITES = ["code", "extract", "chat", "creative"]
STEP_COSTS = {
    "smollm2-135m": {1: 1.02, 2: 1.146, 3: 1.278, 5: 1.399, 8: 1.515, 16: 1.9},
    "qwen2.5-coder-1.5b": {1: 1.03, 2: 1.20, 3: 1.33, 4: 1.49, 8: 1.58, 16: 1.76},
}
MAX_TOKENS = 64
TRACE = False


def cost_of(table, n):
    keys = sorted(table)
    if n in table:
        return table[n]
    lo = max(k for k in keys if k < n)
    hi = min((k for k in keys if k > n), default=None)
    if hi is None:
        return table[lo]
    return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)


def precompute(models, target, per_suite, spec):
    path = Path(f"models/cache/policy-replay-{target}-{per_suite}.pkl")
    if path.exists():
        return pickle.loads(path.read_bytes())
    greedy = SamplingConfig(temperature=0.0)
    plain = Session(models, GenerationConfig(method="none", max_tokens=MAX_TOKENS, sampling=greedy))
    out = []
    for name in SUITES:
        for prompt in load_suite(name).prompts[:per_suite]:
            ids = encode_prompt(models, prompt.text, True)
            answer = []
            for step in plain.steps(ids):
                answer.extend(step.tokens)
            tokens = ids + answer
            feats, _, _ = target_features(models.target, tokens[:-1], spec)
            feats = np.array(feats.astype(mx.float32))
            out.append((name, ids, answer, feats))
            print(name, len(ids), len(answer), file=sys.stderr)
    path.write_bytes(pickle.dumps(out))
    return out


class FakeTarget:
    def __init__(self, feats):
        self.feats = feats
        self.tokens = []

    def feature_rows(self, start=0):
        return mx.array(self.feats[start : len(self.tokens)])


def walk(draft, answer):
    """Accepted draft tokens along the answer."""
    tokens = draft.tokens.tolist()
    if draft.tree is None:
        n = 0
        while n < len(tokens) and n < len(answer) and tokens[n] == answer[n]:
            n += 1
        return n
    children = {}
    for i, parent in enumerate(draft.tree.parents):
        children.setdefault((parent, tokens[i]), i + 1)
    node, n = 0, 0
    while n < len(answer):
        node = children.get((node, answer[n]))
        if node is None:
            break
        n += 1
    return n


def simulate(models, data, costs, restart=0.0, shadow=None, loss=None):
    """Per suite [tokens, cost, calls, speculative steps, trees offered, heads-only probes].

    `shadow` (heads, a cost in calls): a probe due in a plain stretch runs the heads alone
    on the plain call's hidden state (no verify call, no restart): it costs 1 + heads, yields
    the plain token, and its tree, walked along the tokens that follow, teaches the policy
    what a verified probe would have (through the policy's `shadowed`, which
    results/policy-replay-variants-2026-12-07.py adds). `loss`: a dict that sums, per (suite, kind of step),
    cost minus tokens (kinds: `e` an empty proposal, `miss` a tree with nothing kept, `hit`,
    `restart`, `shadow`)."""
    greedy = SamplingConfig(temperature=0.0)
    session = Session(
        models, GenerationConfig(method="medusa", k=None, max_tokens=MAX_TOKENS, sampling=greedy)
    )
    drafter = session.drafter
    policy = session.policy(greedy)
    unit = policy.profile.target_call_seconds
    results = {}
    for name, ids, answer, feats in data:
        for _repeat in range(2):
            fake = FakeTarget(feats)
            context = list(ids)
            policy.start()
            prefilled = False
            produced, cost, calls, spec_steps, offered, shadows = 0, 0.0, 0, 0, 0, 0
            trace = []
            in_plain = False  # inside a plain stretch (no restart before the next plain run)

            def charge(kind, amount, _name=name):
                if loss is not None:
                    loss[(_name, kind)] = loss.get((_name, kind), 0.0) + amount

            while produced < len(answer):
                plan = policy.choose()
                room = len(answer) - produced - 1
                if plan.k == 0:
                    if not (shadow and in_plain):
                        cost += restart  # the run's first call, not overlapped with a queued one
                        charge("restart", restart)
                    in_plain = True
                    for _ in range(plan.run):
                        if produced >= len(answer):
                            break
                        tok = answer[produced]
                        context.append(tok)
                        produced += 1
                        cost += 1.0
                        calls += 1
                        policy.observe(Step((tok,), 0, 0, 0, 0, unit, None))
                        trace.append(".")
                    continue
                k = draft_length(plan.k, room, drafter.traits)
                fake.tokens = context[:-1]
                if k > 0 and not prefilled:
                    drafter.prefill(context, fake)
                    prefilled = True
                draft = drafter.propose(context, k, greedy, plan.stop) if k > 0 else None
                if draft is not None and draft.size == 0:
                    draft = None
                n_acc = walk(draft, answer[produced:]) if draft is not None else 0
                n_acc = min(n_acc, k)
                if shadow and policy._probe and in_plain:
                    policy._probe = False
                    shadows += 1
                    tok = answer[produced]
                    context.append(tok)
                    produced += 1
                    cost += 1.0 + shadow
                    calls += 1
                    charge("shadow", shadow)
                    trace.append("s")
                    policy.shadowed(draft, k, n_acc)
                    policy.observe(Step((tok,), 0, 0, 0, 0, unit, None))
                    continue
                in_plain = False
                emitted = answer[produced : produced + n_acc + 1]
                size = 1 + (draft.size if draft is not None else 0)
                c = cost_of(costs, size)
                cost += c
                calls += 1
                spec_steps += 1
                offered += draft is not None
                context.extend(emitted)
                produced += len(emitted)
                trace.append("e" if draft is None else str(n_acc))
                charge("e" if draft is None else "hit" if n_acc else "miss", c - len(emitted))
                policy.observe(
                    Step(
                        tuple(emitted),
                        plan.k,
                        draft.size if draft is not None else 0,
                        draft.depth if draft is not None else 0,
                        n_acc,
                        c * unit,
                        None,
                        0.0,
                        requested=k,
                        tree=draft is not None and draft.tree is not None,
                    )
                )
            if TRACE:
                print(name, "".join(trace), f"{produced / cost:.3f}")
            r = results.setdefault(name, [0, 0.0, 0, 0, 0, 0])
            for i, value in enumerate((produced, cost, calls, spec_steps, offered, shadows)):
                r[i] += value
    return results


def main():
    target, heads, per_suite = sys.argv[1], sys.argv[2], int(sys.argv[3])
    variants = sys.argv[4].split(",")
    global TRACE
    TRACE = "trace" in sys.argv[5:]
    models = load(target, None, heads=[heads], default_draft=False)
    spec = FeatureSpec(models.heads["medusa"].config.feature_layers)
    data = precompute(models, target, per_suite, spec)
    from specmlx.drafters.medusa import MedusaDrafter
    from specmlx.engine.policy.estimators import AcceptanceRates

    carried = AcceptanceRates.carried

    def folded(self, most=4.0):
        """The prior counted once: what the estimates read now becomes their evidence."""
        curve = self.curve(len(self.kept) + 1)
        pooled = self.pooled.mean(self.prior)
        on_track = self.first[1].mean(pooled)
        pairs = [(self.pooled, self.prior), *((s, pooled) for s in self.first), (self.offered, 1.0)]
        for j in range(1, len(self.kept) + 1):
            pairs.append((self.kept[j - 1], max(curve[j - 1][1], on_track)))
            pairs.append((self.drafted[j - 1], curve[j - 1][0]))
        for estimate, prior in pairs:
            estimate.total += prior * estimate.prior_weight
            estimate.weight += estimate.prior_weight
            estimate.prior_weight = 0.0
        carried(self, most)

    for variant in variants:
        models.experience.clear()
        models.learned_costs.clear()
        MedusaDrafter.PRIOR_ACCEPTANCE = 0.6
        AcceptanceRates.carried = carried
        restart = 0.0
        for part in variant.split("+"):
            if part.startswith("restart"):
                restart = float(part[7:])
            if part == "fold":
                AcceptanceRates.carried = folded
            if part.startswith("prior"):
                MedusaDrafter.PRIOR_ACCEPTANCE = float(part[5:])
        res = simulate(models, data, STEP_COSTS[target], restart)
        tot = [0, 0.0, 0, 0, 0, 0]
        line = [f"{variant:12s}"]
        for name in SUITES:
            r = res[name]
            tot = [a + b for a, b in zip(tot, r, strict=True)]
            line.append(f"{name} {r[0] / r[1]:.3f} (τ {r[0] / r[2]:.2f}, {r[3]}/{r[2]}, {r[4]})")
        line.append(f"all {tot[0] / tot[1]:.3f}")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
