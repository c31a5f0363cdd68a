"""Adaptive k: the policy on synthetic costs and acceptance streams, and the calibration cache."""

from __future__ import annotations

import random

import mlx_lm
import pytest

from specmlx import calibration
from specmlx.adaptive import AcceptanceTracker, AdaptiveK
from specmlx.costs import CostProfile, expected_tokens, predicted_speedup

MEMORY_BOUND = CostProfile(0.01, 0.002, {k: 1 + 0.02 * (k - 1) for k in range(1, 17)})
COMPUTE_BOUND = CostProfile(0.01, 0.005, {k: float(k) for k in range(1, 17)})
LAPTOP = CostProfile(0.5, 0.2, {1: 1.0, 2: 1.11, 4: 1.33, 8: 1.45, 16: 1.83})


def feed(policy: AdaptiveK, alpha: float, steps: int, rng: random.Random, k: int = 16) -> None:
    """Steps where each drafted position is accepted with probability alpha."""
    for _ in range(steps):
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        policy.observe(k, n, k, is_tree=False)


def test_tracker_learns_a_constant_rate():
    tracker = AcceptanceTracker(decay=0.99)
    rng = random.Random(0)
    for _ in range(3000):
        n = 0
        while n < 8 and rng.random() < 0.7:
            n += 1
        tracker.observe(8, n)
    assert abs(tracker.rate(0) - 0.7) < 0.05 and abs(tracker.rate(3) - 0.7) < 0.08
    assert abs(tracker.expected_tokens(4) - expected_tokens(0.7, 4)) < 0.2


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.85, 0.95])
def test_picks_the_k_the_formula_says_is_best(alpha):
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=True)
    feed(policy, alpha, 4000, random.Random(1))
    chosen = policy.choose()
    formula = max(
        range(1, 17),
        key=lambda g: predicted_speedup(
            alpha,
            g,
            MEMORY_BOUND.c,
            MEMORY_BOUND.v[g + 1] if g < 16 else MEMORY_BOUND.verify_cost(17),
        ),
    )
    # The estimate is noisy; the choice must be as good as the formula's best, within 2%.
    best = predicted_speedup(alpha, formula, MEMORY_BOUND.c, MEMORY_BOUND.verify_cost(formula + 1))
    got = predicted_speedup(alpha, chosen, MEMORY_BOUND.c, MEMORY_BOUND.verify_cost(chosen + 1))
    assert got >= 0.98 * best, (alpha, chosen, formula)


def test_falls_back_when_the_cost_curve_makes_speculation_lose():
    """Compute-bound: a k-token call costs k calls; with c > 0 no k can win."""
    policy = AdaptiveK(COMPUTE_BOUND, uses_draft_model=True, probe_every=10)
    feed(policy, 0.8, 200, random.Random(2))
    choices = [policy.choose() for _ in range(30)]
    # Not even full acceptance could win here, so it does not probe either.
    assert not policy.could_win()
    assert choices == [0] * 30 and policy.plain_steps == 30


def test_probes_while_acceptance_could_still_make_speculation_win():
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=True, probe_every=10)
    feed(policy, 0.02, 200, random.Random(7))  # it can win, just not at this acceptance
    choices = [policy.choose() for _ in range(30)]
    assert policy.could_win()
    assert choices.count(0) >= 27 and any(c > 0 for c in choices)


def test_switches_back_when_acceptance_recovers():
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=True, probe_every=4)
    rng = random.Random(3)
    feed(policy, 0.05, 100, rng)  # a drafter that is almost always wrong
    assert policy.choose() == 0
    # Acceptance recovers: only the probes see it, and they are enough.
    for _ in range(200):
        k = policy.choose()
        if k:
            feed(policy, 0.9, 1, rng, k)
    assert policy.choose() >= 3


def test_a_probe_that_wins_does_not_put_the_next_one_off():
    """Near break-even (a one-token draft kept about half the time, where its step costs 1.5
    plain steps), a streak of misses sends the policy to plain decoding; then the drafts are
    kept again. Probes that find their draft kept come at an even pace until the estimate
    recovers. Doubled on every probe, the third came 64 steps after the second: a response
    stayed plain."""
    unit = LAPTOP.target_call_seconds
    policy = AdaptiveK(LAPTOP, uses_draft_model=True, max_k=1)
    step = unit * policy.modelled_cost(1)
    rng = random.Random(0)
    for _ in range(60):
        policy.observe(1, int(rng.random() < 0.5), 1, False, seconds=step)
    for _ in range(20):
        policy.observe(1, 0, 1, False, seconds=step)
    chosen = []
    for _ in range(64):
        chosen.append(policy.choose())
        if chosen[-1]:
            policy.observe(1, 1, 1, False, seconds=step)  # kept
        else:
            policy.observe(0, 0, 0, False, seconds=unit)
    probes = [i for i, k in enumerate(chosen) if k][:3]
    assert probes[1] - probes[0] == probes[2] - probes[1] == 16
    assert all(chosen[probes[2] :])  # speculating again
    # Probes that lose put the next one off, ever further.
    losing = AdaptiveK(LAPTOP, uses_draft_model=True, max_k=1)
    for _ in range(40):
        losing.observe(1, 0, 1, False, seconds=step)
    probes = []
    for i in range(200):
        if losing.choose():
            probes.append(i)
            losing.observe(1, 0, 1, False, seconds=step)
        else:
            losing.observe(0, 0, 0, False, seconds=unit)
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert len(gaps) >= 2 and gaps == sorted(gaps) and gaps[-1] > gaps[0]


def test_draft_free_methods_count_no_draft_cost():
    policy = AdaptiveK(COMPUTE_BOUND, uses_draft_model=False)
    feed(policy, 0.99, 300, random.Random(4))
    # With c = 0 and v(k) = k, drafting k yields at most k + 1 tokens for k + 1 calls: even.
    assert policy.predicted(policy.best_k()) <= 1.0 + 1e-9 or policy.best_k() == 0


def test_tree_drafters_are_costed_by_tree_size():
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=False)
    policy.observe(4, 2, 29, is_tree=True)
    assert policy.tree_size == 30
    assert policy.predicted(4) == pytest.approx(
        policy.tracker.expected_tokens(4) / MEMORY_BOUND.verify_cost(30)
    )


def test_calibration_is_cached_and_remeasured_when_the_key_changes(
    tiny_dirs, tmp_path, monkeypatch
):
    import specmlx

    monkeypatch.setenv("SPECMLX_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_measure(target, draft, ks, reps):
        calls.append(draft is not None)
        return CostProfile(
            0.01, 0.003 if draft is not None else None, {k: 1.0 + 0.1 * k for k in ks}
        )

    monkeypatch.setattr(calibration, "measure_costs", fake_measure)
    models = specmlx.load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)
    first, fresh = calibration.load_or_measure(models, with_draft=True)
    again, fresh_again = calibration.load_or_measure(models, with_draft=True)
    assert fresh and not fresh_again and first == again and calls == [True]
    calibration.load_or_measure(models, with_draft=False)  # another drafter: another key
    assert calls == [True, False]
    models.draft, _ = mlx_lm.load(str(tiny_dirs["qwen2-draft"]))
    models.draft_path = tiny_dirs["qwen2-draft"]
    calibration.load_or_measure(models, with_draft=True)  # another draft model
    assert calls == [True, False, True]


def test_a_tree_drafter_is_costed_by_its_size_from_the_first_step():
    from specmlx.drafters.lookahead import LookaheadDrafter

    size = LookaheadDrafter(window=5, ngram=4, guesses=5).tree_size
    assert size == 1 + 4 + 10 + 15
    # Verification grows with tokens (stock BLAS): a 30-token tree can't pay at the start.
    policy = AdaptiveK(COMPUTE_BOUND, uses_draft_model=False, tree_size=size)
    assert policy.choose() == 0
    # Memory-bound, a tree costs little more than one token: speculate from the start.
    assert AdaptiveK(MEMORY_BOUND, uses_draft_model=False, tree_size=size).choose() > 0


def test_a_drafter_that_starts_worse_starts_plain_where_its_tree_costs_more(
    tiny_dirs, tmp_path, monkeypatch
):
    """Lookahead's pool starts empty: it declares a low first-position prior. On a curve where
    its 30-token tree costs 2.5 calls (this CPU with OpenBLAS), the shared prior would spend
    tree steps learning that; its own prior starts plain (and probes). Where the tree costs
    little more than one token (1.15 calls) it speculates from the start either way."""
    import specmlx
    from specmlx.api import GenerationConfig, make_drafter, make_policy
    from specmlx.drafters.lookahead import LookaheadDrafter

    size = LookaheadDrafter().tree_size
    assert LAPTOP.verify_cost(size) == pytest.approx(2.5, abs=0.01)
    assert AdaptiveK(LAPTOP, False, tree_size=size).choose() > 0  # the shared prior: tree steps
    low = LookaheadDrafter.prior_acceptance
    own = AdaptiveK(LAPTOP, False, tree_size=size, tracker=AcceptanceTracker(prior_rate=low))
    assert own.choose() == 0
    flat = CostProfile(0.01, None, {k: 1 + 0.005 * (k - 1) for k in range(1, 17)})
    gpu = AdaptiveK(flat, False, tree_size=size, tracker=AcceptanceTracker(prior_rate=low))
    assert gpu.choose() > 0
    # make_policy takes the prior from the drafter; a draft model keeps the shared one.
    monkeypatch.setenv("SPECMLX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibration, "measure_costs", lambda target, draft, ks, reps: LAPTOP)
    models = specmlx.load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)
    for method, prior in (("lookahead", low), ("draft", 0.7)):
        config = GenerationConfig(method=method)
        policy = make_policy(models, config, make_drafter(models, config))
        assert policy.tracker.prior_rate == prior
        assert (policy.choose() == 0) == (method == "lookahead")


def test_the_costs_one_response_measured_carry_to_the_next(tiny_dirs, tmp_path, monkeypatch):
    """Costs are the machine's: a new response's policy (from make_policy, on the same loaded
    models) starts from what earlier ones measured, with a fresh acceptance estimate. Another
    drafter, or sampling instead of greedy decoding, learns its own."""
    import specmlx
    from specmlx.api import GenerationConfig, make_drafter, make_policy
    from specmlx.sampling import SamplingConfig

    monkeypatch.setenv("SPECMLX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibration, "measure_costs", lambda target, draft, ks, reps: LAPTOP)
    models = specmlx.load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)

    def policy_for(config: GenerationConfig) -> AdaptiveK:
        return make_policy(models, config, make_drafter(models, config))

    greedy = GenerationConfig(method="draft")
    first = policy_for(greedy)
    for _ in range(30):
        seconds = LAPTOP.target_call_seconds * (first.modelled_cost(2) + 0.5)
        first.observe(2, 1, 2, False, seconds=seconds)
    assert first.scaled_cost(2) == pytest.approx(first.modelled_cost(2) + 0.5, abs=0.05)
    second = policy_for(greedy)
    assert second.tracker.steps == 0
    assert second.scaled_cost(2) == first.scaled_cost(2)
    sampled = GenerationConfig(method="draft", sampling=SamplingConfig(temperature=1.0))
    for other in (policy_for(sampled), policy_for(GenerationConfig(method="ngram"))):
        assert other.scaled_cost(2) == other.modelled_cost(2)


def test_a_response_decoded_plainly_never_runs_the_draft_model(tiny_dirs, tmp_path, monkeypatch):
    """Where a k-token call costs k calls no draft can win: `-k auto` decodes plainly from
    the first step, and the draft model does not even take in the prompt (its prefill
    cost time to the first token for nothing). The output is the target's own."""
    import specmlx
    from specmlx.api import GenerationConfig

    monkeypatch.setenv("SPECMLX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibration, "measure_costs", lambda target, draft, ks, reps: COMPUTE_BOUND)
    from specmlx.drafters.draft_model import DraftModelDrafter

    calls = []
    for name in ("prefill", "propose"):
        original = getattr(DraftModelDrafter, name)

        def recording(self, *args, _name=name, _original=original):
            calls.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(DraftModelDrafter, name, recording)
    models = specmlx.load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)
    auto = specmlx.generate(models, "hello", GenerationConfig(method="draft", max_tokens=12))
    assert calls == [] and auto.stats.plain_steps == auto.stats.target_calls
    plain = specmlx.generate(models, "hello", GenerationConfig(method="none", max_tokens=12))
    assert auto.token_ids == plain.token_ids


def test_unseen_deep_positions_lean_on_the_rate_before_them():
    """Half the drafts miss at once, the rest match to the end: deep positions keep matching."""
    tracker = AcceptanceTracker(decay=0.99)
    rng = random.Random(3)
    for _ in range(400):
        tracker.observe(3, 0 if rng.random() < 0.5 else 3)
    rates = tracker.rates(8)
    assert abs(rates[0] - 0.5) < 0.1
    assert rates[2] > 0.95
    assert rates[7] > 0.95  # never reached: the rate before it, not the pooled ~0.75


def test_measured_step_overheads_switch_speculation_off_and_on():
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=True)
    rng = random.Random(5)
    feed(policy, 0.6, 200, rng)
    k = policy.choose()
    assert k > 0
    unit = MEMORY_BOUND.target_call_seconds
    # Each speculative step turns out to cost 5 target calls more than calibrated (a GPU
    # building kernels for every new shape, say); plain steps cost what calibration says.
    # (Stretches of three: the first after a plain step teaches no costs.)
    for _ in range(30):
        for _ in range(3):
            n = 0
            while n < k and rng.random() < 0.6:
                n += 1
            policy.observe(k, n, k, False, seconds=unit * (policy.modelled_cost(k) + 5.0))
        policy.observe(0, 0, 0, False, seconds=unit)
    assert policy.costs.spec_overhead.value > 1.0  # clipped per step, so a hiccup can't dominate
    assert policy.choose() == 0
    # Plain steps that are all slow say the target runs slow: its verify calls are priced
    # at the same scale, so a drafter that loses keeps losing.
    slow = AdaptiveK(MEMORY_BOUND, uses_draft_model=True)
    feed(slow, 0.05, 200, rng)
    assert slow.choose() == 0
    for _ in range(30):
        slow.observe(0, 0, 0, False, seconds=unit * 5.0)
    assert slow.costs.target_scale.value > 4.5
    verify = slow.costs.target_scale.value * MEMORY_BOUND.verify_cost(5)
    assert slow.step_cost(4) == pytest.approx(4 * MEMORY_BOUND.c + verify, rel=0.02)


def test_a_steady_overhead_is_learned_in_full():
    """Every speculative step costs 0.3 target calls more than the calibrated curve says (a
    calibration ~10% off at the sizes drafted): after a few dozen steps the policy prices
    them at what they cost, not at a share of it held back by the calibration forever. And
    a plain stretch fades it back toward the calibration, the calibration's weight with it."""
    policy = AdaptiveK(LAPTOP, uses_draft_model=True)
    unit = LAPTOP.target_call_seconds
    assert policy.overhead(2) == 0.0
    policy.observe(1, 1, 1, False, seconds=unit * policy.modelled_cost(1))  # the first: no costs
    policy.observe(1, 1, 1, False, seconds=unit * (policy.modelled_cost(1) + 0.3))
    early = policy.overhead(2)
    assert 0.0 < early < 0.15  # one step does not overrule the calibration
    for _ in range(60):
        policy.observe(1, 1, 1, False, seconds=unit * (policy.modelled_cost(1) + 0.3))
    assert policy.overhead(2) == pytest.approx(0.3, abs=0.01)
    assert policy.scaled_cost(1) == pytest.approx(policy.modelled_cost(1) + 0.3, abs=0.01)
    for _ in range(40):  # the draft turns bad: speculation loses
        policy.observe(1, 0, 1, False, seconds=unit * (policy.modelled_cost(1) + 0.3))
    weight, value = policy.costs.spec_overhead.weight, policy.costs.spec_overhead.value
    # A plain step or two between drafts fades nothing; a stretch does.
    assert [policy.choose() for _ in range(policy.fade_after)] == [0] * policy.fade_after
    assert policy.costs.spec_overhead.value == value
    for _ in range(12):
        assert policy.choose() == 0
    assert policy.costs.spec_overhead.value == pytest.approx(value * policy.cost_fade**12, rel=1e-6)
    assert policy.costs.spec_overhead.weight > policy.costs.spec_overhead.prior_weight
    assert policy.costs.spec_overhead.weight < weight


def test_steps_measured_cheaper_than_calibrated_stay_so_through_a_plain_stretch():
    """Speculative steps run 0.2 target calls cheaper than calibrated (a point of the curve
    measured too dear), then the draft misses for a while and the policy decodes plainly.
    The plain stretch fades what made speculating dearer than calibrated (a slow spell may
    have passed), not this: faded, the calibration's error came back, and a draft kept half
    the time (a loss as calibrated, a win as measured) stayed plain."""
    unit = LAPTOP.target_call_seconds
    policy = AdaptiveK(LAPTOP, uses_draft_model=True, max_k=1, probe_every=64)
    rng = random.Random(4)
    for _ in range(60):
        seconds = unit * (policy.modelled_cost(1) - 0.2)
        policy.observe(1, int(rng.random() < 0.5), 1, False, seconds=seconds)
    measured = policy.scaled_cost(1)
    assert measured == pytest.approx(policy.modelled_cost(1) - 0.2, abs=0.02)
    for _ in range(30):
        policy.observe(1, 0, 1, False, seconds=unit * measured)
    assert [policy.choose() for _ in range(20)] == [0] * 20
    assert policy.scaled_cost(1) == pytest.approx(measured, abs=1e-3)
    # Kept half the time, as before: a win at what the steps measured, not as calibrated.
    calibrated = AdaptiveK(LAPTOP, uses_draft_model=True, max_k=1)
    assert 1.5 / policy.scaled_cost(1) > 1.0 > 1.5 / calibrated.scaled_cost(1)


def test_one_slow_step_does_not_switch_speculation_off():
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=True)
    rng = random.Random(6)
    feed(policy, 0.8, 200, rng)
    k = policy.choose()
    unit = MEMORY_BOUND.target_call_seconds
    policy.observe(k, k // 2, k, False, seconds=unit * 50.0)  # the machine stalled once
    assert policy.choose() > 0


def test_a_uniformly_faster_machine_is_a_scale_not_an_overhead():
    """Every call runs at 0.7x its calibrated time (a calibration from a slower day): the
    policy learns the scale of each model from draft calls and plain steps, so long drafts
    are not penalized against short ones, nor speculation against plain decoding."""
    rng = random.Random(8)
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=True)
    unit, draft_call = MEMORY_BOUND.target_call_seconds, MEMORY_BOUND.draft_call_seconds
    for step in range(100):
        k = policy.choose() if step % 5 else 0
        if k == 0:
            policy.observe(0, 0, 0, False, seconds=0.7 * unit)
            continue
        n = 0
        while n < k and rng.random() < 0.85:
            n += 1
        seconds = 0.7 * unit * policy.modelled_cost(k)
        policy.observe(k, n, k, False, seconds=seconds, draft_seconds=0.7 * k * draft_call)
    assert policy.costs.draft_scale.value == pytest.approx(0.7, abs=0.02)
    assert policy.costs.target_scale.value == pytest.approx(0.7, abs=0.025)
    assert abs(policy.costs.spec_overhead.value) < 0.03
    for k in (0, 1, 4, 12):
        assert policy.scaled_cost(k) == pytest.approx(0.7 * policy.modelled_cost(k), rel=0.04)
    # The same acceptance, calibrated costs: the same choice.
    calibrated = AdaptiveK(MEMORY_BOUND, uses_draft_model=True, tracker=policy.tracker)
    assert policy.best_k() == calibrated.best_k()


def test_draft_calls_slower_than_calibrated_make_drafting_dearer_not_plain_steps():
    """Draft calls that cost more in the loop than in calibration (host overhead that
    dominates a tiny model's call): the draft's scale rises, the target's does not."""
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=True)
    unit, draft_call = MEMORY_BOUND.target_call_seconds, MEMORY_BOUND.draft_call_seconds
    for _ in range(40):
        draft = 3.0 * 2 * draft_call
        verify = unit * MEMORY_BOUND.verify_cost(3)
        policy.observe(2, 1, 2, False, seconds=draft + verify, draft_seconds=draft)
    assert policy.costs.draft_scale.value == pytest.approx(3.0, rel=0.1)
    assert policy.costs.target_scale.value == 1.0 and abs(policy.costs.spec_overhead.value) < 0.05
    assert policy.step_cost(0) == 1.0


def test_a_step_size_that_runs_cheaper_than_calibrated_is_learned_apart():
    """The calibration rated a 2-token verify call at 1.3 one-token calls; in the loop it
    costs 1.0 (a calibration of a few calls on a shared machine moves by ~15%). Steps of
    each size (the confidence cut makes drafts of many lengths) measure their own excess,
    so 2-token steps are priced at what they cost, the others at what calibration says,
    and the policy picks the k the true costs make best, where the calibrated curve alone
    picks another."""
    calibrated = CostProfile(0.01, 0.003, {1: 1.0, 2: 1.3, 3: 1.35, 4: 1.4, 8: 1.6, 16: 2.0})
    truth = CostProfile(0.01, 0.003, {**calibrated.v, 2: 1.0})
    policy = AdaptiveK(calibrated, uses_draft_model=True)
    rng = random.Random(12)
    unit, draft_call = calibrated.target_call_seconds, calibrated.draft_call_seconds
    for step in range(120):
        k = 1 + step % 4
        n = 0
        while n < k and rng.random() < 0.6:
            n += 1
        seconds = unit * (k * truth.c + truth.verify_cost(k + 1))
        policy.observe(k, n, k, False, seconds=seconds, draft_seconds=k * draft_call)
    # Most of the 0.3 the calibration was off by is learned (the rest leans on the
    # overhead over all sizes, which is near 0).
    assert abs(policy.scaled_cost(1) - (truth.c + 1.0)) < 0.3 * 0.3
    for k in (2, 3):
        assert policy.scaled_cost(k) == pytest.approx(k * truth.c + truth.v[k + 1], rel=0.05)

    def best(profile: CostProfile) -> int:
        def rate(k: int) -> float:
            return policy.tracker.expected_tokens(k) / (k * profile.c + profile.verify_cost(k + 1))

        return max(range(1, 17), key=rate)

    assert best(truth) != best(calibrated)
    assert policy.best_k() == best(truth)


def test_the_confidence_threshold_weighs_a_draft_token_against_the_best_rate():
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=True)
    feed(policy, 0.9, 300, random.Random(9))
    policy.choose()
    rate = max(policy.predicted(k) for k in range(17))
    marginal = MEMORY_BOUND.c + (MEMORY_BOUND.verify_cost(9) - 1) / 8
    assert rate > 1.5
    # A token must be kept often enough to pay at the rate speculation already runs at,
    # not merely at plain decoding's one token per call.
    assert policy.threshold == pytest.approx(min(0.95, policy.p_min()))
    assert policy.p_min() == pytest.approx(rate * marginal, rel=1e-6)
    assert policy.threshold > marginal
    # The user's own threshold wins; draft-free methods have none.
    fixed = AdaptiveK(MEMORY_BOUND, uses_draft_model=True, fixed_p_min=0.3)
    fixed.choose()
    assert fixed.threshold == 0.3
    assert AdaptiveK(MEMORY_BOUND, uses_draft_model=False).p_min() == 0.0


def test_a_draft_goes_on_while_all_it_holds_and_one_more_token_pay_for_that_token():
    """One more draft token brings a token only if every token drafted so far is kept and
    it is too: the draft goes on while that chance covers the token's cost. Sure tokens go
    on for a while; doubt adds up, so a few fair tokens end a draft one alone would not."""
    from specmlx.adaptive import ConfidenceCalibration

    policy = AdaptiveK(LAPTOP, uses_draft_model=True, calibration=ConfidenceCalibration(decay=1))
    table = policy.calibration
    for b in range(table.bins):  # as greedy drafts are: kept about as often as they say
        table.seen[b], table.kept[b] = 1000.0, 1000.0 * (b + 0.5) / table.bins
    feed(policy, 0.9, 300, random.Random(12))
    policy.choose()
    following = policy.tracker.rates(17)
    assert 0.5 < policy.threshold < 0.8

    def worth(confidences: tuple[float, ...]) -> float:
        kept = 1.0
        for q in confidences:
            kept *= table.chance_of(q)
        return kept * following[len(confidences)]

    cases = [(0.99,) * n for n in range(1, 16)] + [(0.85,), (0.85,) * 3, (0.99, 0.55), (0.55,)]
    for confidences in cases:
        assert policy.goes_on(confidences) == (worth(confidences) >= policy.threshold)
    assert policy.goes_on((0.99,) * 3) and not policy.goes_on((0.99,) * 15)
    assert policy.goes_on((0.85,)) and not policy.goes_on((0.85,) * 3)
    # The user's own p_min is llama.cpp's: the last token's confidence alone.
    fixed = AdaptiveK(LAPTOP, uses_draft_model=True, fixed_p_min=0.8)
    fixed.choose()
    assert fixed.goes_on((0.85,) * 3) and not fixed.goes_on((0.99, 0.7))


def test_a_drafter_that_ends_its_own_drafts_is_asked_for_up_to_max_k():
    """Where the drafter stops on `goes_on`, every token past the first is expected to pay,
    so the rates by position no longer cap the draft (a sure stretch runs long); the
    choice between speculating and plain decoding is the same."""
    rng = random.Random(13)
    for profile, alpha in ((LAPTOP, 0.8), (COMPUTE_BOUND, 0.5)):
        capped = AdaptiveK(profile, uses_draft_model=True)
        cuts = AdaptiveK(profile, uses_draft_model=True, drafter_cuts=True)
        fixed = AdaptiveK(profile, uses_draft_model=True, drafter_cuts=True, fixed_p_min=0.5)
        for policy in (capped, cuts, fixed):
            feed(policy, alpha, 200, rng, k=4)
        best = capped.choose()
        assert best == capped.best_k()
        assert (0 < best < 16) if profile is LAPTOP else best == 0
        # llama.cpp's p_min weighs no cost: the rates by position still cap the draft.
        assert fixed.choose() == fixed.best_k()
        assert cuts.choose() == (16 if cuts.best_k() > 0 else 0)
        assert (cuts.best_k() > 0) == (profile is LAPTOP)


def test_a_responses_first_step_teaches_no_costs():
    """The first step after a prefill also pays for setting up (buffers allocated anew):
    one slow such step must not make the draft model look dear for the whole response."""
    unit, draft_call = LAPTOP.target_call_seconds, LAPTOP.draft_call_seconds
    policy = AdaptiveK(LAPTOP, uses_draft_model=True)
    policy.new_response()
    k = policy.choose()
    policy.observe(1, 0, 1, False, 10 * unit, 5 * draft_call, requested=k)
    assert policy.costs.draft_scale.value == 1.0 and policy.costs.spec_overhead.value == 0.0
    assert policy.tracker.steps == 1  # what the draft got right or wrong still counts
    k = policy.choose()
    policy.observe(1, 0, 1, False, 10 * unit, 5 * draft_call, requested=k)
    assert policy.costs.draft_scale.value > 2 and policy.costs.spec_overhead.value > 0


def test_a_slow_spell_of_the_draft_model_does_not_rule_speculation_out_for_good():
    """Draft calls timed five times dearer than calibrated make speculation lose whatever
    the acceptance, and plain steps never time the draft model: the measurement fades
    while decoding plainly, so speculation is tried again within a short response (a
    spell on the Qwen pair once left a 64-token response plain from its second step)."""
    policy = AdaptiveK(LAPTOP, uses_draft_model=True)
    for _ in range(3):
        k = policy.choose()
        policy.observe(k, k, k, False, draft_seconds=5 * k * LAPTOP.draft_call_seconds)
    assert policy.choose() == 0 and not policy.could_win()
    chosen = [policy.choose() for _ in range(32)]
    assert chosen[0] == 0 and chosen[-1] > 0


def test_the_step_that_ends_a_plain_stretch_teaches_no_costs():
    """Coming back from plain decoding, the draft model first catches up on the plain
    stretch's tokens: that step's time is a cost of falling back, not the draft model's
    pace. Counted, it timed the draft model slow and sent the policy back to plain decoding,
    whose next return paid it again (creative text at T = 1 on the Qwen pair, where a
    one-token draft barely pays)."""
    policy = AdaptiveK(LAPTOP, uses_draft_model=True)
    unit, draft_call = LAPTOP.target_call_seconds, LAPTOP.draft_call_seconds
    slow = {"seconds": 3 * unit, "draft_seconds": 4 * draft_call}
    policy.observe(0, 0, 0, False, unit)
    policy.observe(1, 1, 1, False, **slow)
    assert policy.costs.draft_scale.value == 1.0 and policy.costs.spec_overhead.value == 0.0
    policy.observe(1, 1, 1, False, **slow)  # the same time, in the middle of speculating
    assert policy.costs.draft_scale.value > 2.0 and policy.costs.spec_overhead.value > 0.0


def test_positions_behind_a_confidence_threshold_are_expected_to_pass_it():
    tracker = AcceptanceTracker()
    for _ in range(3):
        tracker.observe(1, 0)  # first tokens missed: a poor start
    assert tracker.rates(4)[1] < 0.6
    # Tokens after the first are drafted only when the draft is this confident.
    assert min(tracker.rates(4, floor=0.8)[1:]) >= 0.8
    assert tracker.rates(4, floor=0.8)[0] == tracker.rates(4)[0]


def test_a_drafter_that_stops_early_is_costed_by_what_it_drafts():
    """A drafter that offers two tokens whatever it is asked for (an n-gram match that ends,
    a draft that loses confidence): asking for more costs only the calls it makes."""
    tracker = AcceptanceTracker(decay=0.99)
    for _ in range(300):
        tracker.observe(2, 2, requested=8)
    tokens, drafted = tracker.expected(8)
    assert drafted == pytest.approx(2.0, abs=0.1)
    assert tokens == pytest.approx(3.0, abs=0.1)
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=True, tracker=tracker)
    assert policy.step_cost(8) == pytest.approx(policy.modelled_cost(2), rel=0.05)
    assert tracker.continuations(4)[:2] == [1.0, pytest.approx(1.0, abs=0.02)]
    assert tracker.continuations(4)[2] < 0.05


def test_confident_first_tokens_set_the_rate_expected_of_later_ones():
    """Later draft positions pass the confidence threshold by construction; first tokens
    that would have passed it show how often such tokens are kept, even at k = 1."""
    tracker = AcceptanceTracker()
    rng = random.Random(10)
    for _ in range(60):
        confident = rng.random() < 0.5
        # Confident first tokens are always kept, the others never.
        tracker.observe(1, int(confident), first_passed=confident, first_chance=0.9)
    rates = tracker.rates(4)
    assert 0.35 < rates[0] < 0.65
    assert min(rates[1:]) > 0.9
    assert tracker.continuations(3)[1] == pytest.approx(0.5, abs=0.15)


def test_one_early_miss_does_not_switch_speculation_off():
    """A response's first draft token is often missed. With so little experience the
    policy keeps speculating while an upper bound of the acceptance could still win, and
    falls back only once misses pile up."""
    costs = CostProfile(0.01, 0.005, {k: 1 + 0.1 * (k - 1) for k in range(1, 17)})
    policy = AdaptiveK(costs, uses_draft_model=True)
    assert policy.choose() > 0
    policy.observe(1, 0, 1, False)
    assert policy.best_k() == 0  # the estimate alone would give up here
    assert policy.choose() > 0
    for _ in range(8):
        policy.observe(1, 0, 1, False)
    assert policy.choose() == 0
    # A tree drafter's every step costs its whole tree: one miss is evidence enough.
    dear_tree = CostProfile(0.01, None, {k: 1 + 0.05 * (k - 1) for k in range(1, 31)})
    tree = AdaptiveK(dear_tree, uses_draft_model=False, tree_size=30)
    assert tree.choose() > 0
    tree.observe(4, 0, 29, True)
    assert tree.predicted(4, 1.0) > tree.predicted(0)  # hope alone would try again
    assert tree.choose() == 0


def test_the_confidence_a_draft_needs_follows_what_its_confidence_has_meant():
    """Greedy drafts are kept about as often as their confidence says; sampled drafts of
    low confidence are still kept most of the time. The same confidence then stands for a
    low chance of being kept in the first case and a high one in the second."""
    from specmlx.adaptive import ConfidenceCalibration

    rng = random.Random(11)
    greedy, sampled = ConfidenceCalibration(), ConfidenceCalibration()
    for _ in range(400):
        confidences = tuple(rng.random() for _ in range(4))
        for table, chance in ((greedy, lambda q: q), (sampled, lambda q: 0.7 + 0.3 * q)):
            n = 0
            while n < 4 and rng.random() < chance(confidences[n]):
                n += 1
            table.observe(confidences, n)
    assert greedy.chance_of(0.25) == pytest.approx(0.25, abs=0.1)
    assert greedy.chance_of(0.65) == pytest.approx(0.65, abs=0.1)
    assert sampled.chance_of(0.05) > 0.6
    assert max(sampled.fitted()) < 0.99  # no bin is that sure


def test_one_unlucky_bin_does_not_block_the_confident_bins_below_it():
    """Tokens of confidence 0.3-0.6 are kept 90% of the time, but the 0.6 bin lost its
    few tokens: read bin by bin, that bin alone would push the needed confidence to 0.7.
    The fit pools it with its neighbours (a surer token is not less likely kept)."""
    from specmlx.adaptive import ConfidenceCalibration

    table = ConfidenceCalibration(decay=1.0)
    for b in (3, 4, 5):
        table.seen[b], table.kept[b] = 40.0, 36.0
    table.seen[6], table.kept[6] = 3.0, 0.0
    for b in (7, 8, 9):
        table.seen[b], table.kept[b] = 40.0, 39.0
    fitted = table.fitted()
    assert all(a <= b for a, b in zip(fitted, fitted[1:], strict=False))
    assert table._raw(6) < 0.5  # bin by bin, 0.6 would fail a 0.8 requirement ...
    assert min(b for b in range(10) if table.chance(b) >= 0.8) == 3  # ... pooled, 0.3 up pass
    assert table.chance(6) > 0.8
    assert max(fitted) < 0.99


def test_an_unsure_draft_token_ends_the_draft_and_is_verified(tiny_dirs):
    import mlx_lm

    from specmlx.drafters.draft_model import DraftModelDrafter
    from specmlx.sampling import SamplingConfig

    model, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    context = tokenizer.encode("hello there")
    sure = DraftModelDrafter(model, SamplingConfig(), 320, p_min=1e-9)
    sure.prefill(context)
    draft = sure.propose(context, 5)
    assert draft.size == 5 and len(draft.confidences) == 5
    least = min(draft.confidences)
    unsure = DraftModelDrafter(model, SamplingConfig(), 320, p_min=least + 1e-6)
    unsure.prefill(context)
    cut = unsure.propose(context, 5)
    stop = draft.confidences.index(least)
    # The tokens up to and including the first unsure one, as drafted without a cut.
    assert cut.size == stop + 1
    assert cut.tokens.tolist() == draft.tokens.tolist()[: stop + 1]
    assert cut.confidences == pytest.approx(draft.confidences[: stop + 1])


def test_a_fixed_confidence_threshold_must_be_a_probability():
    from specmlx.api import GenerationConfig
    from specmlx.errors import UsageError

    assert GenerationConfig(p_min=0.4).p_min == 0.4
    with pytest.raises(UsageError, match="p_min must be between 0 and 1"):
        GenerationConfig(p_min=1.5)


def test_a_plain_stretch_does_not_bring_speculation_back_by_itself():
    """Only probes bring speculation back: the acceptance estimate does not drift toward
    the optimistic prior while nothing is drafted."""
    policy = AdaptiveK(
        MEMORY_BOUND,
        uses_draft_model=True,
        probe_every=10_000,
        max_probe_every=10_000,
        min_probe_every=10_000,
    )
    feed(policy, 0.02, 60, random.Random(12))
    assert [policy.choose() for _ in range(300)] == [0] * 300


def run_stream(
    policy: AdaptiveK | None,
    fixed_k: int,
    seed: int,
    after_miss: float,
    on_track: float,
    later: float,
) -> float:
    """Tokens per unit of cost (one-token target calls) over steps 100..399 of a stream
    whose first draft token is kept with chance `after_miss` after a step that ended on a
    rejection, else `on_track`, and every later one with chance `later`; the policy's k,
    or a fixed one."""
    rng = random.Random(seed)
    missed, tokens, cost = False, 0.0, 0.0
    for step in range(400):
        k = policy.choose() if policy else fixed_k
        n = 0
        while n < k and rng.random() < (later if n else after_miss if missed else on_track):
            n += 1
        if policy:
            policy.observe(k, n, k, is_tree=False)
        missed = n < k
        if step >= 100:
            tokens += n + 1
            cost += k * LAPTOP.c + LAPTOP.verify_cost(k + 1) if k else 1.0
    return tokens / cost


def test_a_draft_after_a_rejected_token_is_expected_to_be_kept_less_often():
    """A draft that has to follow a token it did not expect (the target's correction) is
    missed more often than one after a kept draft, as the real pair's drafts are. Pooled,
    the misses after rejections would make every position look bad and keep drafts short;
    kept apart, the policy drafts long when on track and short after a miss, and beats
    every fixed k."""
    stream = (0.4, 0.9, 0.9)
    ratios = []
    for seed in range(4):
        best = max(run_stream(None, k, seed, *stream) for k in range(13))
        policy = AdaptiveK(LAPTOP, uses_draft_model=True)
        auto = run_stream(policy, 0, seed, *stream)
        ratios.append(auto / best)
    assert sum(ratios) / len(ratios) >= 1.0, ratios
    policy.tracker.missed = False
    on_track = policy.best_k()
    policy.tracker.missed = True
    assert policy.best_k() < on_track


def test_a_fall_back_on_few_steps_is_probed_sooner():
    """Two missed drafts at a response's start send it plain (the costs here want ~60% of
    first tokens kept), but they are little evidence: the first probe comes as many steps
    after the fall-back as there were drafts. One on long experience waits `probe_every`."""
    openblas = CostProfile(0.48, 0.167, {1: 1.0, 2: 1.24, 4: 1.30, 8: 1.33, 16: 1.55})

    def plain_before_probe(misses: int) -> int:
        policy = AdaptiveK(openblas, uses_draft_model=True)
        for _ in range(misses):
            policy.observe(4, 0, 4, is_tree=False)
        for plain in range(100):
            if policy.choose():
                return plain
        return 100

    assert plain_before_probe(2) == 1
    assert plain_before_probe(40) == 15
    # Where even the prior says speculation loses, no streak sent it plain: the usual pace.
    dear = AdaptiveK(openblas, uses_draft_model=True, tracker=AcceptanceTracker(prior_rate=0.2))
    assert [dear.choose() for _ in range(16)] == [0] * 15 + [1]
