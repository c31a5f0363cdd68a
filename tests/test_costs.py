"""The cost model: Leviathan's formulas against hand-computed values, and the measurement."""

from __future__ import annotations

import itertools
import json

import pytest

from specmlx.engine.costs import (
    CostProfile,
    acceptance_from_tokens,
    expected_tokens,
    measure_costs,
    predicted_speedup,
    step_cost,
)


@pytest.mark.parametrize(
    ("alpha", "gamma", "expected"),
    [
        (0.5, 2, 1.75),  # (1 - 0.5^3) / 0.5
        (0.8, 4, 3.3616),  # (1 - 0.8^5) / 0.2 = 0.67232 / 0.2
        (0.6, 1, 1.6),  # (1 - 0.36) / 0.4
        (0.0, 5, 1.0),  # nothing accepted: the target's own token only
        (1.0, 4, 5.0),  # everything accepted: γ + 1
    ],
)
def test_expected_tokens(alpha: float, gamma: int, expected: float) -> None:
    assert expected_tokens(alpha, gamma) == pytest.approx(expected)


def test_expected_tokens_is_continuous_at_one() -> None:
    assert expected_tokens(1 - 1e-9, 3) == pytest.approx(4.0, rel=1e-6)


def test_expected_tokens_rejects_a_probability_out_of_range() -> None:
    with pytest.raises(ValueError):
        expected_tokens(1.5, 2)


def test_step_cost_and_speedup() -> None:
    assert step_cost(4, 0.1, 1.2) == pytest.approx(1.6)  # 4 · 0.1 + 1.2
    # 3.3616 / 1.6
    assert predicted_speedup(0.8, 4, 0.1, 1.2) == pytest.approx(2.101)
    # Leviathan's memory-bound ideal (c = 0, v = 1): the speedup is E itself.
    assert predicted_speedup(0.8, 4, 0.0, 1.0) == pytest.approx(3.3616)
    # A draft as slow as the target, accepting nothing: 1 / (2·1 + 1).
    assert predicted_speedup(0.0, 2, 1.0, 1.0) == pytest.approx(1 / 3)


def test_profile_ratios_and_interpolation() -> None:
    profile = CostProfile(
        target_call_seconds=0.5, draft_call_seconds=0.05, v={1: 1.0, 3: 1.2, 5: 1.6}
    )
    assert profile.c == pytest.approx(0.1)
    assert profile.verify_cost(3) == pytest.approx(1.2)
    assert profile.verify_cost(4) == pytest.approx(1.4)  # halfway between v(3) and v(5)
    assert profile.verify_cost(7) == pytest.approx(2.0)  # the last slope, 0.2 per token
    # α = 0.8, γ = 4: 3.3616 / (4 · 0.1 + v(5) = 1.6) = 3.3616 / 2.0
    assert profile.speedup(0.8, 4) == pytest.approx(1.6808)
    # A draft-free method pays no c: 3.3616 / 1.6
    assert profile.speedup(0.8, 4, uses_draft_model=False) == pytest.approx(2.101)
    assert profile.as_dict()["v"] == {"1": 1.0, "3": 1.2, "5": 1.6}


def test_past_the_measured_range_a_call_never_gets_cheaper() -> None:
    """This CPU's calibration: v(12) = 1.69, v(16) = 1.54 (noise). Extending that last slope
    would price a 30-token tree at ~1.0, a plain call's cost; the upper half's slope (from
    v(8)) goes on upward."""
    v = {1: 1.0, 2: 1.08, 4: 1.26, 8: 1.31, 12: 1.69, 16: 1.54}
    profile = CostProfile(0.06, None, v)
    assert profile.verify_cost(30) == pytest.approx(1.54 + 14 * (1.54 - 1.31) / 8)
    flat = CostProfile(0.06, None, {1: 1.0, 8: 1.4, 16: 1.3})
    assert flat.verify_cost(30) == pytest.approx(1.3)  # a downward half: held level


def test_profile_without_draft_has_no_draft_cost() -> None:
    profile = CostProfile(target_call_seconds=0.5, draft_call_seconds=None, v={1: 1.0})
    assert profile.c == 0.0
    assert profile.verify_cost(8) == 1.0


def test_measure_costs_on_a_tiny_pair(tiny_dirs) -> None:
    from mlx_lm import load

    target, _ = load(str(tiny_dirs["llama"]))
    draft, _ = load(str(tiny_dirs["llama-draft"]))
    profile = measure_costs(target, draft, ks=[2, 5], reps=2, context=8)
    assert sorted(profile.v) == [1, 2, 5]
    assert profile.v[1] == 1.0
    assert profile.target_call_seconds > 0 and profile.draft_call_seconds > 0
    assert profile.c > 0


def test_each_measured_call_keeps_one_token_as_a_rejected_step_does(tiny_dirs) -> None:
    from mlx_lm import load

    from specmlx.engine.costs import _prefilled, _time_call

    model, _ = load(str(tiny_dirs["llama"]))
    sequence = _prefilled(model, 8)
    offsets = [c.offset for c in sequence.cache]
    _time_call(sequence, 5)
    _time_call(sequence, 1)
    # Every call sees a context one token longer than the last: no shape repeats.
    assert [c.offset for c in sequence.cache] == [o + 2 for o in offsets]
    assert len(sequence.tokens) == 10 and sequence.n_unconfirmed == 0


@pytest.mark.parametrize(("alpha", "gamma"), [(0.5, 2), (0.8, 4), (0.6, 1), (0.95, 8)])
def test_acceptance_from_tokens_inverts_expected_tokens(alpha: float, gamma: int) -> None:
    assert acceptance_from_tokens(expected_tokens(alpha, gamma), gamma) == pytest.approx(alpha)


def test_acceptance_from_tokens_by_hand() -> None:
    assert acceptance_from_tokens(1.75, 2) == pytest.approx(0.5)  # (1 - 0.5^3) / 0.5 = 1.75
    assert acceptance_from_tokens(1.0, 4) == 0.0  # never accepted
    assert acceptance_from_tokens(5.0, 4) == 1.0  # always all γ + 1
    # accepted/drafted is not α: at α = 0.8, γ = 4 a step accepts E - 1 = 2.3616 of 4 drafts.
    assert (expected_tokens(0.8, 4) - 1) / 4 == pytest.approx(0.5904)


def test_monotone_pools_sizes_that_break_the_order() -> None:
    from specmlx.engine.costs import monotone

    v = monotone({1: 1.0, 2: 1.3, 4: 1.9, 8: 2.0, 12: 3.2, 16: 1.8})
    values = [v[k] for k in sorted(v)]
    assert values == sorted(values)
    assert v[12] == v[16] == pytest.approx(2.5)
    assert v[2] == 1.3  # sizes in order keep their own figures


def test_monotone_keeps_a_one_token_call_at_one() -> None:
    from specmlx.engine.costs import monotone

    v = monotone({1: 1.0, 2: 0.92, 3: 1.2})
    assert v == {1: 1.0, 2: 1.0, 3: 1.2}


def test_out_of_time_a_calibration_times_fewer_sizes_and_interpolates_the_rest(tiny_dirs):
    from mlx_lm import load

    target, _ = load(str(tiny_dirs["llama"]))
    draft, _ = load(str(tiny_dirs["llama-draft"]))
    seen = []
    ks = [1, 2, 3, 4, 6, 8, 12, 16]
    profile = measure_costs(
        target, draft, ks, reps=3, context=8, budget=1e-6, on_call=lambda *a: seen.append(a)
    )
    # No time at all: the smallest and largest sizes once each, the others interpolated.
    assert profile.interpolated == (2, 3, 4, 6, 8, 12) and sorted(profile.v) == ks
    assert all(profile.v[a] <= profile.v[b] for a, b in itertools.pairwise(ks))
    assert profile.v[4] == pytest.approx(1 + (profile.v[16] - 1) * 3 / 15)
    # Progress: the warm-ups (1, 16, the draft), then one round of 1, 16 and the draft.
    assert seen[0] == (3, 6) and seen[-1] == (6, 6) and len(seen) == 4
    assert measure_costs(target, None, ks, reps=1, context=8, budget=600).interpolated == ()


def test_the_plan_drops_repetitions_before_sizes():
    from specmlx.engine.costs import _plan

    ks = [1, 2, 3, 4, 6, 8, 12, 16]
    first = {1: 1.0, 16: 1.0}  # a second a call
    assert _plan(ks, 3, first, 0.0, None) == (ks, 3)
    assert _plan(ks, 3, first, 0.0, 30.0) == (ks, 3)  # 6 warm-ups + 24 calls
    assert _plan(ks, 3, first, 0.0, 22.0) == (ks, 2)
    assert _plan(ks, 3, first, 0.0, 10.0) == ([1, 3, 6, 12, 16], 1)  # 3 warm-ups + 5 calls
    assert _plan(ks, 3, first, 0.0, 4.0) == ([1, 6, 16], 1)
    assert _plan(ks, 3, first, 0.0, 0.5) == ([1, 16], 1)


def test_the_calibration_table_marks_interpolated_sizes(tmp_path):
    from rich.console import Console

    from specmlx.cli.display import calibration_view

    profile = CostProfile(0.1, None, {1: 1.0, 2: 1.1, 4: 1.3}, interpolated=(2,))
    console = Console(record=True, width=100)
    console.print(calibration_view(profile, True, tmp_path / "c.json"))
    text = console.export_text()
    assert "1.10 (interpolated)" in text and "1.30 (interpolated)" not in text
    assert CostProfile(0.1, None, {1: 1.0}).as_dict()["interpolated"] == []


def test_a_slow_calibration_shows_a_bar_and_a_fast_one_does_not(monkeypatch):
    from contextlib import contextmanager

    import specmlx.progress
    from specmlx.api import calibration

    opened, clock = [], [0.0]

    @contextmanager
    def bar(enabled, description, total, completed=0):
        opened.append((description, total, completed))
        yield type("Bar", (), {"advance": lambda self, info="": opened.append("+1")})()

    monkeypatch.setattr(specmlx.progress, "progress_bar", bar)
    monkeypatch.setattr(calibration.time, "perf_counter", lambda: clock[0])
    for seconds_a_call, expected in ((0.01, []), (1.0, [("calibrating", 10, 3), "+1", "+1"])):
        opened.clear()
        with calibration._calibration_bar(True) as on_call:
            for done in (3, 4, 5):
                clock[0] += seconds_a_call * (3 if done == 3 else 1)
                on_call(done, 10)
        assert opened == expected


def test_every_size_keeps_the_sizes_and_gives_up_repetitions():
    from specmlx.engine.costs import _plan

    ks = list(range(1, 17))
    first = {1: 1.0, 16: 1.0}
    assert _plan(ks, 3, first, 0.0, 0.5, thin=False) == (ks, 1)
    assert _plan(ks, 3, first, 0.0, 1000.0, thin=False) == (ks, 3)


def test_every_size_measures_again_where_the_cache_interpolated(tiny_dirs, tmp_path, monkeypatch):
    """A cached profile with sizes left out serves adaptive k, not `--every-size`: that one
    is measured again, every size timed, and then served from the cache."""
    import specmlx
    from specmlx.api import calibration

    monkeypatch.setenv("SPECMLX_CACHE_DIR", str(tmp_path))
    calls = []

    def measure(target, draft, ks, reps, **timing):
        calls.append((tuple(ks), not timing["thin"]))
        skipped = () if not timing["thin"] else (2, 3)
        return CostProfile(0.1, None, {k: 1.0 + 0.1 * (k - 1) for k in ks}, skipped)

    monkeypatch.setattr(calibration, "measure_costs", measure)
    models = specmlx.load(str(tiny_dirs["llama"]))
    kw = {"progress": False}
    assert calibration.load_or_measure(models, False, **kw)[1]
    assert not calibration.load_or_measure(models, False, **kw)[1]  # cached
    profile, fresh = calibration.load_or_measure(models, False, every_size=True, **kw)
    assert fresh and sorted(profile.v) == list(range(1, 17)) and profile.interpolated == ()
    assert not calibration.load_or_measure(models, False, every_size=True, **kw)[1]
    assert not calibration.load_or_measure(models, False, **kw)[1]  # the full curve serves
    assert calls == [(calibration.CALIBRATION_KS, False), (calibration.EVERY_SIZE, True)]


def test_cost_curves_compare_calibrations_in_a_table_and_a_plot(tiny_dirs, tmp_path):
    """`calibrate --every-size --json` on a tiny pair writes a record that `cost-curves`
    reads back into a table row (weights, c, v(n)) and a PNG; a file that is not a record,
    or is missing, is one line."""
    from typer.testing import CliRunner

    from specmlx.cli import app

    runner = CliRunner(env={"SPECMLX_CACHE_DIR": str(tmp_path)})
    record = tmp_path / "costs.json"
    args = ["calibrate", "--target", str(tiny_dirs["llama"]), "--draft"]
    args += [str(tiny_dirs["llama-draft"]), "--every-size", "--budget", "5"]
    result = runner.invoke(app, [*args, "--json", str(record)])
    assert result.exit_code == 0, result.output
    data = json.loads(record.read_text())
    assert sorted(map(int, data["profile"]["v"])) == list(range(1, 17))
    assert data["draft"]["bytes"] > 0
    assert data["key"]["backend"] != "cpu" or data["key"]["blas"]
    png, table = tmp_path / "curves.png", tmp_path / "curves.md"
    args = ["cost-curves", str(record), str(record), "--png", str(png)]
    result = runner.invoke(app, [*args, "--markdown", str(table)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes().startswith(b"\x89PNG")
    rows = table.read_text().splitlines()
    assert len(rows) == 4 and rows[2] == rows[3]
    c = data["profile"]["draft_call_seconds"] / data["profile"]["target_call_seconds"]
    assert "float32" in rows[2] and f"| {c:.3f} |" in rows[2]
    # No draft model, a size left out by the budget: no c, the size marked and explained.
    alone = tmp_path / "alone.json"
    data["profile"] |= {"draft_call_seconds": None, "interpolated": [4]}
    alone.write_text(json.dumps(data))
    result = runner.invoke(app, ["cost-curves", str(alone)])
    assert result.exit_code == 0, result.output
    row = result.output.splitlines()[2]
    assert "| — |" in row and "*" in row.split("|")[6] and "interpolated" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"profile": 3}')
    for path, needle in (
        (bad, "not a `specmlx calibrate --json` record"),
        (tmp_path / "no", "cannot read"),
    ):
        result = runner.invoke(app, ["cost-curves", str(path)])
        assert result.exit_code == 2 and needle in result.output.splitlines()[-1]
        assert "Traceback" not in result.output
