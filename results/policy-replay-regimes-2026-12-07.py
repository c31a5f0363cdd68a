"""Medusa's score correction kept apart by the regime of the text, against one correction
(`DepthCalibration`, as shipped), replayed: `-k auto` on SmolLM2-135M's own greedy answers
under two prices of an empty proposal and three orders of the suites.

The replay is `results/policy-replay-2026-12-06.py` (the real policy and drafter, 4 prompts
a suite, each answered twice, 64 tokens, T=0; steps priced at measured step costs), the
prices and orders as in `results/policy-replay-variants-2026-12-07.py`. The regime is the
mean of the target's own top probability over the last W tokens it produced (carried from
the last answer at the start of the next). Printed first (W = 8): how much of each suite's
answers lies in each bin of it, and how often head 0's best guess is the target's token two
ahead there. `regimes-W-E`: one `DepthCalibration` per bin of the regime (bin edges E), each
settling the proposals it sized; a proposal is sized by its regime's. `policy+regimes-W-E`:
the policy's experience (acceptance, probing) kept apart per bin too. Why: a single
correction and a single experience carry extraction's rates into the next chat answer, which
speculates on them for dozens of steps (`results/policy-replay-2026-12-06.py`). As its
siblings do, the replay charges 0.06 of a call for each plain run restarting. Run from the
repository root, OpenBLAS preloaded (about 2 minutes):

  LD_PRELOAD=... .venv/bin/python results/policy-replay-regimes-2026-12-07.py
"""

import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import numpy as np

from specmlx.drafters.calibration import DepthCalibration
from specmlx.drafters.medusa import MedusaDrafter
from specmlx.engine.policy import adaptive
from specmlx.engine.policy.adaptive import Experience
from specmlx.engine.policy.estimators import AcceptanceRates


def _module(name, file):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


variants = _module("variants", "policy-replay-variants-2026-12-07.py")
foresight = _module("foresight", "policy-replay-foresight-2026-12-07.py")
replay = variants.replay


class Confident(list):
    """The replay's data; while an answer is replayed, `top` holds the target's top
    probability at each of its positions and `previous` those the last prompt's answer was
    produced with (the replay answers each prompt twice: the second answer's first tokens
    read the prompt before's)."""

    top, start, previous = None, 0, []

    def __iter__(self):
        for item in super().__iter__():
            _, ids, answer, _ = item
            Confident.top, Confident.start = self.tops[id(item)], len(ids)
            yield item
            Confident.previous = list(Confident.top[len(ids) - 1 : len(ids) + len(answer) - 1])


def regime(context, window):
    """Mean top probability of the last `window` tokens the target produced."""
    return regime_after(len(context) - Confident.start, window)


def regime_after(produced, window):
    """`regime` once the answer has `produced` tokens."""
    values = (Confident.previous + list(Confident.top[Confident.start - 1 :][:produced]))[-window:]
    return float(np.mean(values)) if values else 1.0


def regimes(window, edges):
    @contextmanager
    def patch():
        propose, prefill = MedusaDrafter.propose, MedusaDrafter.prefill

        def slots(self):
            if not hasattr(self, "_slots"):
                self._slots = [
                    DepthCalibration(self.heads.config.num_heads) for _ in range(len(edges) + 1)
                ]
            return self._slots

        def new_propose(self, context, k, sampling, stop=None):
            for slot in slots(self):
                slot.observe(context)
            value = regime(context, window)
            self.calibration = slots(self)[sum(value >= edge for edge in edges)]
            return propose(self, context, k, sampling, stop)

        def new_prefill(self, context, target):
            prefill(self, context, target)
            for slot in slots(self):
                slot.forget()

        MedusaDrafter.propose, MedusaDrafter.prefill = new_propose, new_prefill
        try:
            yield
        finally:
            MedusaDrafter.propose, MedusaDrafter.prefill = propose, prefill

    return patch


def policy_regimes(window, edges):
    """The policy's experience (acceptance by position and by confidence, probing) kept
    apart per bin of the regime too: each step is chosen, and teaches, its regime's."""

    @contextmanager
    def patch():
        policy = adaptive.AdaptiveK
        start, choose, observe = policy.start, policy.choose, policy.observe

        def slots(self):
            if not hasattr(self, "_slots"):
                self._slots = [self.experience] + [
                    Experience(AcceptanceRates(self.traits.prior_acceptance)) for _ in edges
                ]
                self._produced = 0
            return self._slots

        def new_start(self):
            for slot in slots(self)[1:]:
                slot.acceptance.carried()
                slot.probing.interval = min(slot.probing.interval, slot.probing.every)
            start(self)
            self._produced = 0

        def new_choose(self):
            value = regime_after(self._produced, window)
            slot = slots(self)[sum(value >= edge for edge in edges)]
            self.experience, self.acceptance = slot, slot.acceptance
            self.confidence, self.probing = slot.confidence, slot.probing
            return choose(self)

        def new_observe(self, step):
            observe(self, step)
            self._produced += len(step.tokens)

        policy.start, policy.choose, policy.observe = new_start, new_choose, new_observe
        try:
            with regimes(window, edges)():
                yield
        finally:
            policy.start, policy.choose, policy.observe = start, choose, observe

    return patch


VARIANTS = {
    "one correction": variants.nothing,
    "regimes-8-0.7": regimes(8, (0.7,)),
    "regimes-8-0.6,0.8": regimes(8, (0.6, 0.8)),
    "regimes-4-0.7": regimes(4, (0.7,)),
    "policy+regimes-8-0.7": policy_regimes(8, (0.7,)),
    "policy+regimes-8-0.6,0.8": policy_regimes(8, (0.6, 0.8)),
}


def distribution(models, data, tops, window=8, edges=(0.6, 0.8)):
    """Per suite, the share of answer positions in each bin of the regime (the last
    `window` produced tokens, this answer's alone) and head 0's top-1 hit rate there."""
    heads = models.heads["medusa"]
    counts = {}
    for item in data:
        suite, ids, answer, feats = item
        tokens, top, rows = ids + answer, tops[id(item)], mx.array(feats)
        for j in range(len(ids) - 1, len(tokens) - 2):
            value = float(np.mean(top[max(len(ids) - 1, j - window + 1) : j + 1]))
            best = heads.top_candidates(rows[j], 1, 1)[0].tolist()[0][0]
            c = counts.setdefault((suite, sum(value >= e for e in edges)), [0, 0])
            c[0] += 1
            c[1] += best == tokens[j + 2]
    bounds = (0.0, *edges, 1.0)
    print(f"# regime: mean top probability of the last {window} produced tokens; per bin,")
    print("# its share of the suite's answer positions and head 0's top-1 hit rate there")
    for suite in replay.SUITES:
        n = sum(counts.get((suite, b), [0, 0])[0] for b in range(len(bounds) - 1))
        parts = []
        for b in range(len(bounds) - 1):
            total, hits = counts.get((suite, b), [0, 0])
            rate = f"{hits / total:.2f}" if total else "-"
            parts.append(f"[{bounds[b]:.1f}, {bounds[b + 1]:.1f}) {total / n:.2f} hit {rate}")
        print(f"{suite:8s} " + " ; ".join(parts))
    print()


def main():
    models, data = foresight.replayed()
    tagged = Confident(data)
    tagged.tops = {}
    for item in data:
        logits = models.target.model.embed_tokens.as_linear(mx.array(item[3]))
        tagged.tops[id(item)] = np.array(mx.max(mx.softmax(logits.astype(mx.float32), -1), -1))
    distribution(models, data, tagged.tops)
    ordered = variants.ordered

    def keep_tops(data, order):
        result = Confident(ordered(list(data), order))
        result.tops = tagged.tops
        return result

    variants.ordered = keep_tops
    foresight.compare(models, tagged, VARIANTS)


if __name__ == "__main__":
    sys.exit(main())
