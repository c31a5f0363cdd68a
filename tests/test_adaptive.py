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


def test_unseen_deep_positions_lean_on_the_rate_before_them():
    """Half the drafts miss at once, the rest match to the end: deep positions keep matching."""
    tracker = AcceptanceTracker(decay=0.99)
    for i in range(400):
        tracker.observe(3, 0 if i % 2 else 3)
    rates = tracker.rates(8)
    assert abs(rates[0] - 0.5) < 0.05
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
    for _ in range(30):
        n = 0
        while n < k and rng.random() < 0.6:
            n += 1
        policy.observe(k, n, k, False, seconds=unit * (policy.modelled_cost(k) + 5.0))
        policy.observe(0, 0, 0, False, seconds=unit)
    assert policy.spec_overhead.value > 1.0  # clipped per step, so a hiccup can't dominate
    assert policy.choose() == 0
    # If instead plain steps are the slow ones, speculating is the better deal again.
    slow_plain = AdaptiveK(MEMORY_BOUND, uses_draft_model=True)
    feed(slow_plain, 0.05, 200, rng)
    assert slow_plain.choose() == 0
    for _ in range(30):
        slow_plain.observe(0, 0, 0, False, seconds=unit * 5.0)
    assert slow_plain.choose() > 0


def test_one_slow_step_does_not_switch_speculation_off():
    policy = AdaptiveK(MEMORY_BOUND, uses_draft_model=True)
    rng = random.Random(6)
    feed(policy, 0.8, 200, rng)
    k = policy.choose()
    unit = MEMORY_BOUND.target_call_seconds
    policy.observe(k, k // 2, k, False, seconds=unit * 50.0)  # the machine stalled once
    assert policy.choose() > 0
