"""`-k auto` with Medusa heads on SmolLM2's chat: where the loss goes, and five changes to the
policy replayed under two prices of an empty proposal and three orders of the suites.

The replay is `results/policy-replay-2026-12-06.py` (the real policy and drafter on the
target's own greedy answers, 4 prompts a suite, each answered twice, 64 tokens; steps priced
at measured step costs). What it left open is the price of an empty proposal (the heads ran,
no node paid, a one-token call followed): 1.02 of a plain step in its table, where a
one-token call with nothing queued behind it ran about 7% dearer than a step of a plain run
(`results/ab-plain-runs-2026-12-06.txt`), so 1.09 is what it more likely costs. Each variant
runs at both prices (`e=`), with the suites in the bench's order (code, extraction, chat,
creative writing), reversed, and shuffled (seed 0). Variants in one process share one
calibration (Medusa's proposal cost is timed when the heads load, so a figure moves by up
to 0.02 between processes; compare rows of one block).

- current: the policy as shipped.
- offered-ages: the prior of `offered` (how often a proposal offers a tree, 1.0 worth 4
  steps) ages like evidence instead of lasting: after 30 empty proposals it reads about 0.03,
  not 0.11.
- offered-split: `offered` kept apart after an empty proposal and after an offered one (as
  the first position's acceptance is after a miss and on track).
- veto: no speculating while the realized tokens per priced call of the last speculative
  steps (decaying 0.9 a step, at least 3 steps' evidence, 2 carried into a response) are
  below a plain step's.
- shadow: a probe due in a plain stretch runs the heads alone on the plain call's hidden
  state (0.02 of a call, no restart) and teaches the policy what its tree would have kept.
- tree-depth: how often each position is drafted is learned against the depth the policy
  asked for, not the depth the tree came to (a cost-sized tree is often shallower: as
  shipped, positions past it count as drafted, so E(k) assumes trees as deep as asked).

Also, for the shipped policy (bench order, 1.09): per suite, what it predicted for the steps
it chose to speculate (proposals offering a tree, tokens a step, price) against what they got.

Then the loss of each kind of step in chat, cost minus tokens in calls (`e` empty proposals,
`miss` trees with nothing kept, `hit` the others, `restart` plain runs restarting, `shadow`
heads-only probes). Run from the repository root, OpenBLAS preloaded (about 10 minutes):

  LD_PRELOAD=... .venv/bin/python results/policy-replay-variants-2026-12-07.py
"""

import importlib.util
import inspect
import random
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

from specmlx.api.load import load
from specmlx.engine.features import FeatureSpec
from specmlx.engine.policy import adaptive
from specmlx.engine.policy.estimators import AcceptanceRates, Decaying, expectations

_spec = importlib.util.spec_from_file_location(
    "replay", Path(__file__).with_name("policy-replay-2026-12-06.py")
)
replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay)

TARGET, HEADS, PER_SUITE = "smollm2-135m", "models/heads/smollm2-135m-medusa", 4
EMPTY_PRICES = (1.02, 1.09)
HEADS_ONLY = 0.02  # a heads-only probe, in calls (Medusa's measured proposal cost)
VETO = {"decay": 0.9, "carry": 2.0, "least": 3.0}


@contextmanager
def offered_ages():
    init = AcceptanceRates.__post_init__

    def post_init(self):
        init(self)
        self.offered = Decaying.seeded(1.0, 4.0, self.decay)

    AcceptanceRates.__post_init__ = post_init
    try:
        yield
    finally:
        AcceptanceRates.__post_init__ = init


@contextmanager
def offered_split():
    offer, curve, carried = AcceptanceRates.offer, AcceptanceRates.curve, AcceptanceRates.carried

    def states(self):
        if not hasattr(self, "_split"):
            self._split, self._empty = (Decaying(self.decay), Decaying(self.decay)), False
        return self._split

    def new_offer(self, offered):
        offer(self, offered)
        split = states(self)
        for estimate in split:
            estimate.age()
        split[self._empty].add(offered)
        self._empty = not offered

    def new_curve(self, n, optimism=0.0):
        result = curve(self, n, optimism)
        rate = states(self)[self._empty].mean(self.offered.mean(1.0))
        return [(rate, result[0][1]), *result[1:]]

    def new_carried(self, most=4.0):
        carried(self, most)
        for estimate in states(self):
            estimate.lighten(most)
        self._empty = False

    AcceptanceRates.offer, AcceptanceRates.curve = new_offer, new_curve
    AcceptanceRates.carried = new_carried
    try:
        yield
    finally:
        AcceptanceRates.offer, AcceptanceRates.curve = offer, curve
        AcceptanceRates.carried = carried


@contextmanager
def veto():
    policy = adaptive.AdaptiveK
    start, choose, observe = policy.start, policy.choose, policy.observe

    def realized(self):
        if not hasattr(self.experience, "realized"):
            self.experience.realized = Decaying(VETO["decay"], 0.0)
        return self.experience.realized

    def new_start(self):
        start(self)
        realized(self).lighten(VETO["carry"])

    def new_choose(self):
        seen = realized(self)
        if seen.weight < VETO["least"] or seen.mean() >= 1.0:
            return choose(self)
        rates = self.rates
        self.rates = lambda optimism=0.0: [float("inf")] + rates(optimism)[1:]
        try:
            return choose(self)  # plain, or a probe when one is due
        finally:
            del self.rates

    def new_observe(self, step):
        observe(self, step)
        empty = step.plain and step.proposed and self.traits.pays_per_proposal
        if step.plain and not empty:
            return
        verified = 1 if empty else step.n_drafted + 1
        price = self.pricing.modelled(0, verified, step.requested)
        price += self.learned.overhead_at(verified)
        realized(self).observe(((0 if empty else step.n_accepted) + 1) / price)

    policy.start, policy.choose, policy.observe = new_start, new_choose, new_observe
    try:
        yield
    finally:
        policy.start, policy.choose, policy.observe = start, choose, observe


def shadowed(self, draft, requested, accepted):
    """What a heads-only probe teaches: as a verified probe would, minus its costs."""
    if self.traits.pays_per_proposal:
        self.acceptance.offer(draft is not None)
    if draft is not None:
        self.acceptance.observe(draft.depth, draft.depth, accepted)
        if (accepted + 1) * self.pricing.plain() > self.pricing.step(draft.size, levels=requested):
            self.probing.interval = self.probing.min_every
    self.acceptance.plain_step()


adaptive.AdaptiveK.shadowed = shadowed


@contextmanager
def tree_depth():
    policy = adaptive.AdaptiveK
    source = textwrap.dedent(inspect.getsource(policy.observe))
    shipped = "requested = step.draft_depth if step.tree else step.requested"
    assert shipped in source, "the policy changed: update this variant"
    namespace = dict(vars(adaptive))
    exec(source.replace(shipped, "requested = step.requested"), namespace)
    observe, policy.observe = policy.observe, namespace["observe"]
    try:
        yield
    finally:
        policy.observe = observe


@contextmanager
def nothing():
    yield


@contextmanager
def predictions(records, suite_of):
    """Records (suite, predicted offered, tokens, price; offered, tokens, price) per
    speculative step the policy chose."""
    policy = adaptive.AdaptiveK
    choose, observe = policy.choose, policy.observe
    pending = {}

    def new_choose(self):
        plan = choose(self)
        pending.pop("step", None)
        if plan.k > 0:
            k = min(plan.k, self.max_k)
            tokens, drafted = expectations(self.acceptance.curve(self.max_k))
            offered = self.acceptance.offered.mean(1.0)
            price = self.pricing.step(drafted[k], offered, levels=plan.k)
            pending["step"] = (offered, tokens[k], price)
        return plan

    def new_observe(self, step):
        observe(self, step)
        predicted = pending.pop("step", None)
        if predicted is not None and not (step.plain and not step.proposed):
            got = (
                step.n_drafted > 0,
                len(step.tokens),
                step.seconds / self.profile.target_call_seconds,
            )
            records.append((suite_of(), *predicted, *got))

    policy.choose, policy.observe = new_choose, new_observe
    try:
        yield
    finally:
        policy.choose, policy.observe = choose, observe


class Tagged(list):
    """The replay's data, telling which suite is being answered."""

    suite = None

    def __iter__(self):
        for item in super().__iter__():
            Tagged.suite = item[0]
            yield item


VARIANTS = {
    "current": (nothing, None),
    "offered-ages": (offered_ages, None),
    "offered-split": (offered_split, None),
    "veto": (veto, None),
    "shadow": (nothing, HEADS_ONLY),
    "tree-depth": (tree_depth, None),
}
ORDERS = ("bench", "reversed", "shuffled")


def ordered(data, order):
    if order == "reversed":
        return data[::-1]
    if order == "shuffled":
        data = list(data)
        random.Random(0).shuffle(data)
    return data


def line(label, results):
    total = [0, 0.0, 0]
    parts = [f"{label:28s}"]
    for suite in replay.SUITES:
        r = results[suite]
        total = [a + b for a, b in zip(total, r[:3], strict=True)]
        parts.append(f"{suite} {r[0] / r[1]:.3f} ({r[3]}/{r[2]})")
    parts.append(f"all {total[0] / total[1]:.3f}")
    return " | ".join(parts)


def main():
    models = load(TARGET, None, heads=[HEADS], default_draft=False)
    spec = FeatureSpec(models.heads["medusa"].config.feature_layers)
    data = replay.precompute(models, TARGET, PER_SUITE, spec)
    print("# per suite: tokens per plain step's time (speculative steps/all steps)")
    losses = {}
    for price in EMPTY_PRICES:
        costs = dict(replay.STEP_COSTS[TARGET]) | {1: price}
        for order in ORDERS:
            print(f"\n# e={price}, suites in the {order} order")
            for name, (patch, shadow) in VARIANTS.items():
                models.experience.clear()
                models.learned_costs.clear()
                loss = {}
                with patch():
                    results = replay.simulate(
                        models, ordered(data, order), costs, 0.06, shadow=shadow, loss=loss
                    )
                print(line(name, results), flush=True)
                if order == "bench":
                    losses[(price, name)] = loss
    print("\n# chat, bench order: cost minus tokens by kind of step, in calls")
    for (price, name), loss in losses.items():
        kinds = {kind: round(v, 1) for (suite, kind), v in sorted(loss.items()) if suite == "chat"}
        print(f"e={price} {name:14s} {kinds}")
    print(
        "\n# the shipped policy, bench order, e=1.09: predicted against got, per speculative step"
    )
    records = []
    models.experience.clear()
    models.learned_costs.clear()
    costs = dict(replay.STEP_COSTS[TARGET]) | {1: 1.09}
    with predictions(records, lambda: Tagged.suite):
        replay.simulate(models, Tagged(data), costs, 0.06)
    for suite in replay.SUITES:
        rows = [r[1:] for r in records if r[0] == suite]
        mean = [sum(column) / len(rows) for column in zip(*rows, strict=True)]
        print(
            f"{suite:8s} {len(rows)} steps: offered {mean[0]:.2f} got {mean[3]:.2f} | tokens"
            f" {mean[1]:.2f} got {mean[4]:.2f} | price {mean[2]:.3f} got {mean[5]:.3f} |"
            f" tokens per call {mean[1] / mean[2]:.3f} got {mean[4] / mean[5]:.3f}"
        )


if __name__ == "__main__":
    sys.exit(main())
