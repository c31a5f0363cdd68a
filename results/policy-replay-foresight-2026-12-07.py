"""`-k auto` with Medusa heads, replayed with and without a foresight correction (the policy's
predicted extra tokens scaled by how far such predictions came true), under two prices of an
empty proposal and three orders of the suites. Not kept: see the txt beside this file.

The replay is `results/policy-replay-2026-12-06.py` (the real policy and drafter on the
target's own greedy answers, 4 prompts a suite, each answered twice, 64 tokens, T=0; steps
priced at measured step costs), the prices and orders as in
`results/policy-replay-variants-2026-12-07.py`. `without` is the policy as shipped; `with`
adds Foresight: decaying sums (0.97 a speculative step, as acceptance) of the tokens beyond
the target's own that each speculative step was predicted to bring (E(k) - 1 as the
estimates stood when it was chosen) and that it brought (0 for an empty proposal); every
prediction's extra tokens are scaled by realized/predicted, with a prior of 2 predicted
tokens that came true, clipped to [0, 2]; a new response carries at most 4 predicted tokens
of it. Then, for each, what the speculative steps were predicted to bring (before the
correction) against what they brought (bench order, e=1.09). Run from the repository root,
OpenBLAS preloaded (about 5 minutes):

  LD_PRELOAD=... .venv/bin/python results/policy-replay-foresight-2026-12-07.py
"""

import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

from specmlx.api.load import load
from specmlx.engine.features import FeatureSpec
from specmlx.engine.policy import adaptive
from specmlx.engine.policy.estimators import ACCEPTANCE_DECAY, Decaying, expectations

PRIOR, RANGE, CARRY = 2.0, (0.0, 2.0), 4.0


def _module(name, file):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


variants = _module("variants", "policy-replay-variants-2026-12-07.py")
replay = variants.replay


class Foresight:
    def __init__(self):
        self.predicted = Decaying(ACCEPTANCE_DECAY, 0.0)
        self.realized = Decaying(ACCEPTANCE_DECAY, 0.0)

    def ratio(self):
        ratio = (self.realized.total + PRIOR) / (self.predicted.total + PRIOR)
        return min(max(ratio, RANGE[0]), RANGE[1])

    def carried(self):
        if self.predicted.total > CARRY:
            scale = CARRY / self.predicted.total
            for estimate in (self.predicted, self.realized):
                estimate.total *= scale
                estimate.weight *= scale


@contextmanager
def foresight():
    policy = adaptive.AdaptiveK
    start, rates, speculate, observe = policy.start, policy.rates, policy._speculate, policy.observe

    def state(self):
        if not hasattr(self.experience, "foresight"):
            self.experience.foresight = Foresight()
        return self.experience.foresight

    def new_start(self):
        start(self)
        state(self).carried()
        self._predicted = None

    def new_rates(self, optimism=0.0):
        curve = self.acceptance.curve(self.max_k, optimism)
        tokens, drafted = expectations(curve)
        offered = self.acceptance.offered.mean(1.0)
        ratio = state(self).ratio()
        return [1.0 / self.pricing.plain()] + [
            (1 + ratio * (tokens[k] - 1)) / self.pricing.step(drafted[k], offered, levels=k)
            for k in range(1, self.max_k + 1)
        ]

    def new_speculate(self, k, rates):
        tokens, _ = expectations(self.acceptance.curve(k))
        self._predicted = tokens[k] - 1
        return speculate(self, k, rates)

    def new_observe(self, step):
        predicted, self._predicted = getattr(self, "_predicted", None), None
        empty = step.plain and step.proposed and self.traits.pays_per_proposal
        if predicted is not None and not (step.plain and not empty):
            state(self).predicted.observe(predicted)
            state(self).realized.observe(step.n_accepted)
        observe(self, step)

    policy.start, policy.rates = new_start, new_rates
    policy._speculate, policy.observe = new_speculate, new_observe
    try:
        yield
    finally:
        policy.start, policy.rates = start, rates
        policy._speculate, policy.observe = speculate, observe


VARIANTS = {"without": variants.nothing, "with": foresight}


def replayed():
    """The models and the replay's data (the target's answers and hidden states)."""
    models = load(variants.TARGET, None, heads=[variants.HEADS], default_draft=False)
    spec = FeatureSpec(models.heads["medusa"].config.feature_layers)
    return models, replay.precompute(models, variants.TARGET, variants.PER_SUITE, spec)


def compare(models, data, named):
    """Each variant (a name and a context manager that patches it in) at both prices of an
    empty proposal and in the three orders of the suites, one line a variant."""
    print("# per suite: tokens per plain step's time (speculative steps/all steps)")
    for price in variants.EMPTY_PRICES:
        costs = dict(replay.STEP_COSTS[variants.TARGET]) | {1: price}
        for order in variants.ORDERS:
            print(f"\n# e={price}, suites in the {order} order")
            for name, patch in named.items():
                models.experience.clear()
                models.learned_costs.clear()
                with patch():
                    results = replay.simulate(models, variants.ordered(data, order), costs, 0.06)
                print(variants.line(name, results), flush=True)


def main():
    models, data = replayed()
    compare(models, data, VARIANTS)
    print("\n# bench order, e=1.09: predicted against got, per speculative step")
    costs = dict(replay.STEP_COSTS[variants.TARGET]) | {1: 1.09}
    for name, patch in VARIANTS.items():
        records = []
        models.experience.clear()
        models.learned_costs.clear()
        with patch(), variants.predictions(records, lambda: variants.Tagged.suite):
            replay.simulate(models, variants.Tagged(data), costs, 0.06)
        for suite in replay.SUITES:
            rows = [r[1:] for r in records if r[0] == suite]
            mean = [sum(column) / len(rows) for column in zip(*rows, strict=True)]
            print(
                f"{name:8s} {suite:8s} {len(rows)} steps: tokens {mean[1]:.2f} got {mean[4]:.2f}"
                f" | tokens per call {mean[1] / mean[2]:.3f} got {mean[4] / mean[5]:.3f}"
            )


if __name__ == "__main__":
    sys.exit(main())
