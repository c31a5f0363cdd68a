"""The policies as properties: adaptive k speculates where it pays, falls back where it loses,
comes back when drafts are kept again, and is not thrown by noisy costs."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from specmlx.engine.costs import CostProfile
from specmlx.engine.policy import AdaptiveK, FixedK, LearnedCosts
from specmlx.engine.policy.estimators import AcceptanceRates, Decaying, expectations
from specmlx.engine.policy.pricing import Pricing
from specmlx.engine.step import DrafterTraits, Step

UNIT = 0.5  # seconds of a calibrated one-token target call
DRAFT = DrafterTraits("draft", uses_model=True, prior_acceptance=0.7, reports_confidence=True)
NGRAM = DrafterTraits("ngram", prior_acceptance=0.5)
TREE = DrafterTraits("lookahead", tree_size=30, prior_acceptance=0.3)


def memory_bound(c: float = 0.35) -> CostProfile:
    """A k-token call costs little more than a one-token call (Apple GPUs, OpenBLAS)."""
    return CostProfile(UNIT, UNIT * c, {n: 1.0 + 0.03 * (n - 1) for n in range(1, 17)})


def compute_bound(c: float = 0.35) -> CostProfile:
    """A k-token call costs k one-token calls (a reference BLAS on one core)."""
    return CostProfile(UNIT, UNIT * c, {n: float(n) for n in range(1, 17)})


def noisy(profile: CostProfile, rng: random.Random, spread: float = 0.15) -> CostProfile:
    """The same costs as a second calibration might measure them: each point off by ±spread."""
    v = {
        n: (1.0 if n == 1 else r * rng.uniform(1 - spread, 1 + spread))
        for n, r in profile.v.items()
    }
    draft = profile.draft_call_seconds * rng.uniform(1 - spread, 1 + spread)
    return CostProfile(profile.target_call_seconds, draft, v)


def plain_step(seconds: float) -> Step:
    return Step((0,), 0, 0, 0, 0, seconds, None)


def simulate(
    policy,
    traits: DrafterTraits,
    truth: CostProfile,
    kept,
    steps: int,
    rng: random.Random,
    noise: float = 0.0,
    slow=lambda step: 1.0,
):
    """Run the policy against a machine whose real costs are `truth` and whose drafts are
    kept with chance `kept(step)` per token; each step's time is off by up to ±noise.
    Returns the plans' k per step (a run of plain steps counts each)."""
    ks: list[int] = []
    policy.start()
    while len(ks) < steps:
        step = len(ks)
        plan = policy.choose()
        factor = slow(step) * rng.uniform(1 - noise, 1 + noise)
        if plan.k == 0:
            for _ in range(min(plan.run, steps - step)):
                ks.append(0)
                policy.observe(plain_step(truth.target_call_seconds * factor))
            continue
        ks.append(plan.k)
        rate = kept(step)
        confidences: list[float] = []
        drafted = 0
        while drafted < plan.k:
            drafted += 1
            if plan.stop is not None:
                confidences.append(0.99 if rate > 0.5 else 0.2)
                if not plan.stop(tuple(confidences)):
                    break
        accepted = 0
        while accepted < drafted and rng.random() < rate:
            accepted += 1
        c = truth.c if traits.uses_model else 0.0
        verified = traits.tree_size or drafted + 1
        calls = drafted * c + truth.verify_cost(verified)
        draft_seconds = drafted * c * UNIT * factor if traits.uses_model else None
        policy.observe(
            Step(
                tokens=(0,) * (accepted + 1),
                k=plan.k,
                n_drafted=verified - 1,
                draft_depth=drafted,
                n_accepted=accepted,
                seconds=calls * UNIT * factor,
                finish=None,
                draft_seconds=draft_seconds if plan.time_draft else None,
                requested=plan.k,
                confidences=tuple(confidences) or None,
                tree=traits.tree_size is not None,
            )
        )
    return ks


@pytest.mark.parametrize("seed", range(5))
def test_keeps_speculating_while_drafts_are_kept_despite_noisy_calibration(seed):
    rng = random.Random(seed)
    truth = memory_bound()
    policy = AdaptiveK(noisy(truth, rng), DRAFT)
    ks = simulate(policy, DRAFT, truth, lambda s: 1.0, 60, rng, noise=0.15)
    assert all(k > 0 for k in ks), ks


@pytest.mark.parametrize("traits", [DRAFT, NGRAM])
def test_a_slow_spell_does_not_send_it_plain_while_drafts_are_kept(traits):
    rng = random.Random(1)
    truth = memory_bound()
    policy = AdaptiveK(truth, traits)
    # Everything runs twice as slow for 20 steps, as when another process takes the cores.
    ks = simulate(
        policy, traits, truth, lambda s: 0.95, 80, rng, slow=lambda s: 2.0 if 20 <= s < 40 else 1.0
    )
    assert sum(k == 0 for k in ks) <= 2, ks


@pytest.mark.parametrize("traits", [DRAFT, NGRAM])
def test_falls_back_where_every_step_is_predicted_to_lose(traits):
    """A k-token call costing k calls: speculation loses whatever is kept, so it never
    speculates, not even to probe."""
    rng = random.Random(2)
    truth = compute_bound()
    policy = AdaptiveK(truth, traits)
    assert not policy.could_win()
    ks = simulate(policy, traits, truth, lambda s: 0.9, 100, rng, noise=0.1)
    assert ks == [0] * 100


def test_falls_back_when_drafts_are_rejected_and_probes_ever_less_often():
    rng = random.Random(3)
    truth = memory_bound()
    policy = AdaptiveK(truth, DRAFT)
    ks = simulate(policy, DRAFT, truth, lambda s: 0.0, 300, rng)
    assert sum(k > 0 for k in ks[:10]) <= 6  # a few tries while evidence is thin
    assert ks[10:20].count(0) >= 5
    assert ks[-50:].count(0) >= 48
    probes = [i for i, k in enumerate(ks) if k > 0 and i > 20]
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]


@pytest.mark.parametrize("traits", [DRAFT, NGRAM])
def test_comes_back_after_a_fall_back_once_drafts_are_kept_again(traits):
    rng = random.Random(4)
    # Verifying costs enough that a draft nobody keeps loses (for a free drafter, a missed
    # one-token draft costs only what one more verified token does).
    truth = CostProfile(UNIT, UNIT * 0.35, {n: 1.0 + 0.1 * (n - 1) for n in range(1, 17)})
    policy = AdaptiveK(truth, traits)
    ks = simulate(policy, traits, truth, lambda s: 0.0 if s < 40 else 1.0, 160, rng)
    assert ks[30:40].count(0) >= 8  # fell back
    assert all(k > 0 for k in ks[-40:])  # and came back for good


def test_a_response_tries_its_own_drafts_before_the_last_responses_verdict():
    """What earlier responses saw weighs as a few steps in a new one (`carried`), however
    many steps they took: where they found drafts losing (35% kept, 300 steps), a new
    response still tries its own first (the bound is that of a few steps' evidence), and
    falls back once its own steps say the same."""
    from specmlx.engine.policy import Experience

    rng = random.Random(11)
    # Dear enough verification that 35% kept loses: (1 + 0.35) / (1 + c + 0.1) < 1.
    truth = CostProfile(UNIT, UNIT * 0.35, {n: 1.0 + 0.1 * (n - 1) for n in range(1, 17)})
    seen = AcceptanceRates(DRAFT.prior_acceptance)
    for _ in range(300):
        seen.observe(1, 1, int(rng.random() < 0.35))
    policy = AdaptiveK(truth, DRAFT, experience=Experience(seen))
    ks = simulate(policy, DRAFT, truth, lambda s: 0.35, 80, rng)
    assert ks[0] > 0
    assert ks[-30:].count(0) >= 25


def test_a_tree_dearer_than_a_plain_call_starts_plain_and_probes():
    rng = random.Random(5)
    truth = CostProfile(UNIT, None, {n: 1.0 + 0.05 * (n - 1) for n in range(1, 17)})
    policy = AdaptiveK(truth, TREE)
    ks = simulate(policy, TREE, truth, lambda s: 0.9, 100, rng)
    assert ks[0] == 0
    assert any(k > 0 for k in ks)  # a probe found the drafts kept
    assert all(k > 0 for k in ks[-20:])


def test_measured_costs_carry_to_the_next_response():
    rng = random.Random(6)
    truth = memory_bound()
    learned = LearnedCosts()
    first = AdaptiveK(truth, DRAFT, learned=learned)
    simulate(first, DRAFT, truth, lambda s: 0.8, 30, rng, slow=lambda s: 1.5)
    second = AdaptiveK(truth, DRAFT, learned=learned)
    assert second.pricing.speed == pytest.approx(first.pricing.speed)
    assert 1.3 < second.pricing.speed < 1.6


def test_a_responses_first_step_teaches_no_costs():
    truth = memory_bound()
    policy = AdaptiveK(truth, NGRAM)
    policy.start()
    policy.choose()
    policy.observe(plain_step(100 * UNIT))  # setting up: a hundred calls' time
    assert policy.pricing.speed == 1.0


def test_the_stop_rule_stops_sooner_on_doubt():
    rng = random.Random(7)
    truth = memory_bound()
    policy = AdaptiveK(truth, DRAFT)
    simulate(policy, DRAFT, truth, lambda s: 0.9, 20, rng)
    plan = policy.choose()
    assert plan.k == policy.max_k and plan.stop is not None and plan.time_draft

    def length(confidence: float) -> int:
        n = 1
        while n < plan.k and plan.stop((confidence,) * n):
            n += 1
        return n

    lengths = [length(q) for q in (0.05, 0.3, 0.6, 0.9, 0.999)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]


def test_fixed_k_plans_k_and_cuts_on_p_min():
    assert FixedK(4).choose().k == 4 and FixedK(4).choose().stop is None
    plan = FixedK(4, p_min=0.5).choose()
    assert plan.stop((0.9, 0.6)) and not plan.stop((0.9, 0.4))


def test_expectations_match_leviathans_closed_form():
    alpha = 0.7
    tokens, drafted = expectations([(1.0, alpha)] * 8)
    for k in range(9):
        assert tokens[k] == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))
        assert drafted[k] == pytest.approx(k)


def test_expectations_count_only_what_is_drafted():
    tokens, drafted = expectations([(1.0, 1.0), (0.5, 1.0), (0.5, 1.0)])
    assert drafted == pytest.approx([0, 1, 1.5, 1.75])
    assert tokens == pytest.approx([1, 2, 2.5, 2.75])


def test_acceptance_is_split_after_a_miss():
    rates = AcceptanceRates(prior=0.5)
    for _ in range(30):
        rates.observe(requested=4, depth=4, accepted=4)  # on track: all kept
        rates.observe(requested=4, depth=4, accepted=0)  # after it... none
        rates.observe(requested=4, depth=4, accepted=1)  # after a miss: one kept, then miss
    after_miss = rates.curve(1)[0][1]
    rates.plain_step()  # a plain step puts the context back on track
    on_track = rates.curve(1)[0][1]
    # On track the first draft was missed every time but once; after a miss it was kept.
    assert on_track < 0.5 < after_miss
    assert 0 < on_track and after_miss < 1


def test_decaying_leans_on_its_prior_then_on_evidence():
    estimate = Decaying(decay=0.97, prior_weight=4)
    assert estimate.mean(prior=0.3) == pytest.approx(0.3)
    for _ in range(100):
        estimate.observe(1.0)
    assert estimate.mean(prior=0.3) > 0.85
    seeded = Decaying.seeded(0.0, weight=4, decay=0.9)
    for _ in range(100):
        seeded.observe(2.0)
    assert seeded.mean() == pytest.approx(2.0, rel=1e-3)  # a seed ages away entirely
    seeded.fade(0.5, toward=0.0)
    assert seeded.mean() == pytest.approx(1.0, rel=1e-3)


def test_a_draft_model_calibrated_twice_too_dear_is_corrected_by_its_timed_calls():
    """A calibration taken while something else ran on the machine priced the draft model at
    c = 0.77 where it costs 0.35: the timed draft calls correct it, so drafts that are kept
    grow long and plain steps stay out."""
    rng = random.Random(4)
    truth = memory_bound(0.35)
    busy = CostProfile(UNIT, UNIT * 0.77, dict(truth.v))
    policy = AdaptiveK(busy, DRAFT)
    ks = simulate(policy, DRAFT, truth, lambda s: 0.98, 60, rng, noise=0.1)
    assert sum(k == 0 for k in ks) <= 2, ks
    assert policy.pricing.c == pytest.approx(0.35, rel=0.2)


HEADS = DrafterTraits("eagle", tree_size=32, prior_acceptance=0.7, proposal_cost=0.4)


def simulate_heads(policy, truth: CostProfile, useful, steps: int, rng: random.Random):
    """A heads drafter whose proposal costs 0.4 calls whatever comes of it: a useful one is
    a tree of 6 nodes, 3 deep, with 2 tokens kept; else it comes back empty (a cost-sized
    tree whose nodes do not pay for their verification), a plain call after the proposal.
    Returns (the plans' k, tokens per calibrated call over the run)."""
    ks: list[int] = []
    tokens, calls = 0, 0.0
    policy.start()
    while len(ks) < steps:
        step = len(ks)
        plan = policy.choose()
        if plan.k == 0:
            for _ in range(min(plan.run, steps - step)):
                ks.append(0)
                policy.observe(plain_step(UNIT))
                tokens, calls = tokens + 1, calls + 1.0
            continue
        ks.append(plan.k)
        nodes, depth, kept = (6, 3, 2) if useful(step) else (1, 0, 0)
        cost = 0.4 + truth.verify_cost(nodes)
        tokens, calls = tokens + kept + 1, calls + cost
        policy.observe(
            Step(
                tokens=(0,) * (kept + 1),
                k=plan.k,
                n_drafted=nodes - 1,
                draft_depth=depth,
                n_accepted=kept,
                seconds=cost * UNIT,
                finish=None,
                draft_seconds=0.4 * UNIT,
                requested=plan.k,
                tree=nodes > 1,
            )
        )
    return ks, tokens / calls


def test_heads_whose_proposals_come_back_empty_fall_back_to_plain():
    """Each empty proposal costs 0.4 calls and brings nothing: counted as a missed draft
    (not as a plain step), it sends the policy plain, within a few percent of the target
    alone; proposals that pay keep it speculating."""
    rng = random.Random(8)
    truth = memory_bound()
    policy = AdaptiveK(truth, HEADS)
    ks, rate = simulate_heads(policy, truth, lambda s: rng.random() < 0.05, 300, rng)
    assert sum(k > 0 for k in ks[-200:]) <= 20, ks
    assert rate >= 0.95
    # Counted as plain steps, the same proposals would go on forever at their prior.
    blind = AdaptiveK(truth, DrafterTraits("eagle", tree_size=32, prior_acceptance=0.7))
    ks, blind_rate = simulate_heads(blind, truth, lambda s: rng.random() < 0.05, 300, rng)
    assert sum(k > 0 for k in ks[-200:]) > 100 and blind_rate < 0.9
    # Proposals that are kept: it speculates on every step.
    policy = AdaptiveK(truth, HEADS)
    ks, rate = simulate_heads(policy, truth, lambda s: True, 100, rng)
    assert all(k > 0 for k in ks) and rate > 1.5


def test_the_next_response_starts_from_what_the_last_saw_of_the_drafts():
    """A response after one whose proposals all came back empty expects less of them than
    a fresh policy (the drafter's prior) does, though the carried evidence weighs no more
    than a prior; one after kept drafts speculates at once, at its trees' last size."""
    from specmlx.engine.policy import Experience

    rng = random.Random(9)
    truth = memory_bound()
    rejected = AdaptiveK(truth, HEADS)
    simulate_heads(rejected, truth, lambda s: False, 60, rng)
    assert isinstance(rejected.experience, Experience)
    after = AdaptiveK(truth, HEADS, learned=rejected.learned, experience=rejected.experience)
    after.start()
    fresh = AdaptiveK(truth, HEADS, learned=rejected.learned)
    fresh.start()
    assert max(after.rates()[1:]) < 0.8 * max(fresh.rates()[1:])
    assert after.acceptance.offered.evidence <= 4.0 and after.probing.interval <= 16
    kept = AdaptiveK(truth, HEADS)
    simulate_heads(kept, truth, lambda s: True, 30, rng)
    following = AdaptiveK(truth, HEADS, learned=kept.learned, experience=kept.experience)
    following.start()
    assert following.choose().k > 0 and following.pricing.tree_size == 6


def simulate_levels(policy, truth: CostProfile, level: float, steps: int, rng: random.Random):
    """An EAGLE-like tree drafter 6 levels deep whose head costs `level` calls per level
    grown (0.05 besides): its first level is kept 60% of the time, each deeper one 30% of
    the time once the level above was. Returns (the plans' k, tokens per calibrated call)."""
    ks: list[int] = []
    tokens, calls = 0, 0.0
    policy.start()
    while len(ks) < steps:
        plan = policy.choose()
        if plan.k == 0:
            for _ in range(min(plan.run, steps - len(ks))):
                ks.append(0)
                policy.observe(plain_step(UNIT))
                tokens, calls = tokens + 1, calls + 1.0
            continue
        levels = min(plan.k, 6)
        ks.append(levels)
        kept = 0
        while kept < levels and rng.random() < (0.6 if kept == 0 else 0.3):
            kept += 1
        proposal = 0.05 + level * levels
        cost = proposal + truth.verify_cost(8)
        tokens, calls = tokens + kept + 1, calls + cost
        policy.observe(
            Step(
                tokens=(0,) * (kept + 1),
                k=plan.k,
                n_drafted=7,
                draft_depth=levels,
                n_accepted=kept,
                seconds=cost * UNIT,
                finish=None,
                draft_seconds=proposal * UNIT,
                requested=levels,
                tree=True,
            )
        )
    return ks, tokens / calls


def test_a_tree_whose_levels_cost_grows_only_as_deep_as_they_pay():
    """An EAGLE proposal runs its head once a level: priced per level, the policy grows the
    levels whose tokens pay for them (a deep level is seldom reached), and brings more
    tokens per call than trees grown to their full depth at the same costs; where levels
    cost nothing it grows every level."""
    truth = memory_bound()
    dear = DrafterTraits(
        "eagle",
        tree_size=8,
        prior_acceptance=0.7,
        proposal_cost=0.05,
        level_cost=0.08,
        max_depth=6,
    )
    ks, priced = simulate_levels(AdaptiveK(truth, dear), truth, 0.08, 300, random.Random(3))
    late = [k for k in ks[-200:] if k > 0]
    assert late and max(late) <= 4 and sorted(late)[len(late) // 2] <= 3, ks[-50:]
    # The same proposals priced as one cost whatever their depth: every step grows 6 levels.
    flat = replace(dear, proposal_cost=0.05 + 6 * 0.08, level_cost=0.0)
    ks, unpriced = simulate_levels(AdaptiveK(truth, flat), truth, 0.08, 300, random.Random(3))
    assert all(k == 6 for k in ks[-200:] if k > 0)
    assert priced > unpriced * 1.1
    free = replace(dear, level_cost=0.0)
    ks, _ = simulate_levels(AdaptiveK(truth, free), truth, 0.0, 100, random.Random(3))
    assert all(k == 6 for k in ks[-50:])


def test_a_proposal_is_priced_at_the_levels_it_grows():
    profile = memory_bound()
    traits = DrafterTraits("eagle", tree_size=8, proposal_cost=0.05, level_cost=0.1, max_depth=6)
    policy = AdaptiveK(profile, traits)
    assert traits.proposal(3) == pytest.approx(0.35)
    assert policy.max_k == 6  # no path is deeper than its levels
    step = policy.pricing.step
    assert step(7, levels=4) - step(7, levels=1) == pytest.approx(0.3)
    # An empty proposal paid for its levels too.
    assert step(7, offered=0.0, levels=2) == pytest.approx(0.25 + profile.verify_cost(1))


def test_an_empty_proposal_is_priced_apart_from_the_drafts():
    """What trees cost beyond their calibration (mostly the calibration's error at their
    size) is no guide to an empty proposal, a one-token call: its estimate leans on the
    calibration until it is measured, and its own measurements do not move the trees'."""
    learned = LearnedCosts()
    for _ in range(30):
        learned.observe_overhead(8, -0.3)  # 8-token calls ran cheaper than calibrated
    assert learned.overhead_at(8) == pytest.approx(-0.3, abs=0.02)
    assert learned.overhead_at(1) == 0.0
    for _ in range(30):
        learned.observe_overhead(1, 0.02)
    assert learned.overhead_at(1) == pytest.approx(0.02, abs=0.005)
    assert learned.overhead_at(8) == pytest.approx(-0.3, abs=0.02)


def test_a_step_mixes_an_offered_draft_and_an_empty_proposal():
    """A proposal offers a draft with chance `offered`, else it is an empty proposal: for a
    chain (heads on a target that verifies no trees) the draft, when offered, is the
    expected length over `offered` long, and each part carries its own overhead."""
    learned = LearnedCosts()
    for _ in range(30):
        learned.observe_overhead(5, -0.3)
        learned.observe_overhead(1, 0.03)
    profile = memory_bound()
    chain = Pricing(profile, learned, False, None, lambda levels: 0.05)
    offered, drafted = 0.6, 0.6 * 4.0  # 4 tokens when offered
    draft = 0.05 + profile.verify_cost(5) + learned.overhead_at(5)
    empty = 0.05 + 1.0 + learned.overhead_at(1)
    expected = offered * draft + (1 - offered) * empty
    assert chain.step(drafted, offered) == pytest.approx(expected)
    assert chain.step(0.0, 0.0) == pytest.approx(empty)
    tree = Pricing(profile, learned, False, 8, lambda levels: 0.05)
    draft = 0.05 + profile.verify_cost(8) + learned.overhead_at(8)
    assert tree.step(3.0, offered) == pytest.approx(offered * draft + (1 - offered) * empty)
