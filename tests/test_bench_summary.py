"""The bench report from synthetic runs (no model): speedups, steady rates, matching, joins."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from specmlx.bench.report import markdown, to_csv
from specmlx.bench.run import MLX_LM_PLAIN, NONE, BenchConfig, Measurement, RowSpec
from specmlx.bench.suites import Prompt, Suite
from specmlx.bench.summary import Report, SummaryRow, build_report
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.stats import Stats
from specmlx.engine.step import Step
from tests.bench_helpers import fake_environment, validate


def _step(drafted: int, emitted: int, seconds: float) -> Step:
    return Step(tuple(range(emitted)), drafted, drafted, drafted, emitted - 1, seconds, None)


def measured(
    row: RowSpec,
    repeat: int,
    steps: list[tuple[int, int, float]],
    prompt_id: str = "p",
    token_ids: tuple[int, ...] | None = None,
) -> Measurement:
    """A synthetic run: a first step of one token, then `steps` (drafted, emitted, seconds)."""
    tokens = 1 + sum(n for _, n, _ in steps)
    drafted = sum(d for d, _, _ in steps)
    stats = Stats(tokens=tokens, target_calls=1 + len(steps), drafted=drafted)
    return Measurement(
        row=row,
        token_ids=tuple(range(tokens)) if token_ids is None else token_ids,
        stats=stats,
        suite="s",
        prompt_id=prompt_id,
        repeat=repeat,
        decode_tokens=tokens - 1,
        decode_seconds=sum(s for _, _, s in steps),
        decode_steps=tuple(_step(*step) for step in steps),
    )


def _synthetic_config(rows: tuple[RowSpec, ...], prompts: int = 1, repeats: int = 1):
    suite = Suite("s", tuple(Prompt(f"p{i}", "x") for i in range(prompts)))
    return BenchConfig(suites=(suite,), rows=rows, repeats=repeats)


def test_steady_speedup_times_each_step_at_its_rows_median() -> None:
    """A slow spell (steps taking three times their usual time) in one run moves the
    measured speedup but not the steady one; the steady one is the ratio of tokens per
    typical step time, which the test works out by hand."""
    draft = RowSpec("draft", 4)
    config = _synthetic_config((NONE, draft), repeats=2)
    plain = [(0, 1, 0.5)] * 12
    # Drafts of 4 (0.9 s, 3 tokens) and of 2 (0.7 s, 2 tokens); the second run slowed down.
    quiet = [(4, 3, 0.9), (2, 2, 0.7), (4, 3, 0.9), (4, 3, 0.9)]
    slow = [(4, 3, 0.9), (2, 2, 0.7), (4, 3, 2.7), (4, 3, 2.7), (2, 2, 2.1), (4, 3, 0.9)]
    runs = [
        measured(NONE, 0, plain),
        measured(draft, 0, quiet),
        measured(NONE, 1, plain),
        measured(draft, 1, slow),
    ]
    report = build_report(config, runs, fake_environment(), None)
    validate(report)
    row = next(line for line in report.summary if line.row == draft)
    # Typical: a draft of 4 takes 0.9 s (median of 0.9 x5, 2.7 x2), of 2 0.7 s.
    tokens = 11 + 16
    steady = tokens / (7 * 0.9 + 3 * 0.7)
    assert row.steady_speedup_vs_none == pytest.approx(steady / 2.0)
    # Measured: the median over repeats of each run's rate, so the slow run pulls it down.
    measured_rate = (11 / 3.4 + 16 / 10.0) / 2
    assert row.speedup_vs_none == pytest.approx(measured_rate / 2.0)
    assert row.speedup_vs_none < row.steady_speedup_vs_none
    assert row.acceptance_by_position == ()  # the synthetic stats count no positions
    header = {"python": "3", "cpu": "x", "cpu_count": 1}
    report = replace(report, environment=report.environment | header)
    assert "| steady × |" in markdown(report)


def test_best_plain_speedup_uses_the_faster_baseline_per_prompt() -> None:
    """On p0 mlx-lm plain is the faster baseline (15 tok/s against 10), on p1 none is (20
    against 10): the draft row's 30 tok/s is 2.0 and 1.5 times the best plain."""
    draft = RowSpec("draft", 2)
    config = _synthetic_config((NONE, MLX_LM_PLAIN, draft), prompts=2)
    rates = {"p0": {NONE: 10, MLX_LM_PLAIN: 15, draft: 30}, "p1": {NONE: 20, MLX_LM_PLAIN: 10}}
    rates["p1"][draft] = 30
    runs = [
        measured(row, 0, [(0, 1, 1.0 / rate)] * 6, prompt_id=prompt)
        for prompt, by_row in rates.items()
        for row, rate in by_row.items()
    ]
    report = build_report(config, runs, fake_environment(), None)
    validate(report)
    best = {s.row: s.speedup_vs_best_plain for s in report.summary}
    vs_none = {s.row: s.speedup_vs_none for s in report.summary}
    assert best[draft] == pytest.approx((2.0 + 1.5) / 2)
    assert vs_none[draft] == pytest.approx((3.0 + 1.5) / 2)
    assert best[NONE] == pytest.approx((10 / 15 + 1.0) / 2)
    assert best[MLX_LM_PLAIN] == pytest.approx((1.0 + 0.5) / 2)
    # Without mlx-lm plain, the best plain is the target alone.
    alone = _synthetic_config((NONE, draft), prompts=2)
    kept = [m for m in runs if m.row != MLX_LM_PLAIN]
    report = build_report(alone, kept, fake_environment(), None)
    line = next(s for s in report.summary if s.row == draft)
    assert line.speedup_vs_best_plain == pytest.approx(line.speedup_vs_none)


def test_plain_baselines_are_matched_against_each_other() -> None:
    """At T=0, none is checked against mlx-lm plain and every other row against none."""
    draft = RowSpec("draft", 2)
    config = _synthetic_config((NONE, MLX_LM_PLAIN, draft))
    same, other = (1, 2, 3), (1, 2, 4)
    runs = [
        measured(NONE, 0, [(0, 1, 0.1)] * 2, token_ids=same),
        measured(MLX_LM_PLAIN, 0, [(0, 1, 0.1)] * 2, token_ids=other),
        measured(draft, 0, [(2, 2, 0.1)], token_ids=same),
    ]
    report = build_report(config, runs, fake_environment(), None)
    assert {s.row: s.matched for s in report.summary} == {
        NONE: False,
        MLX_LM_PLAIN: False,
        draft: True,
    }


def test_a_greedy_output_that_parts_says_where_and_by_how_much() -> None:
    """Each prompt whose greedy output is not the target alone's gets the first token that
    differs and how many of them do (the repeat that parted first), in the JSON and in a
    list under the Markdown table; matched outputs get neither."""
    from specmlx.bench.report import as_data
    from specmlx.bench.summary import divergence

    assert divergence([1, 2, 3, 4], [1, 2, 9, 4]) == (2, 1)
    assert divergence([1, 2], [1, 2, 3, 4]) == (2, 2)  # a prefix: the missing ones differ
    draft = RowSpec("draft", 2)
    config = _synthetic_config((NONE, draft), prompts=2, repeats=2)
    plain = (5, 6, 7, 8)
    runs = [measured(NONE, r, [(0, 1, 0.1)] * 3, f"p{i}", plain) for i in (0, 1) for r in (0, 1)]
    runs += [
        measured(draft, 0, [(2, 3, 0.1)], "p0", plain),
        measured(draft, 1, [(2, 3, 0.1)], "p0", (5, 6, 0, 0)),
        measured(draft, 0, [(2, 3, 0.1)], "p1", (5, 0, 7, 8)),
        measured(draft, 1, [(2, 3, 0.1)], "p1", plain),
    ]
    environment = fake_environment() | {"python": "3", "cpu": "x", "cpu_count": 1}
    report = build_report(config, runs, environment, None)
    parted = {(r.row, r.prompt_id): (r.first_difference, r.differing) for r in report.results}
    assert parted == {
        (NONE, "p0"): (None, None),
        (NONE, "p1"): (None, None),
        (draft, "p0"): (2, 2),
        (draft, "p1"): (1, 1),
    }
    text = markdown(report)
    assert "- draft k=2 on s/p0: from token 2, 2 of 4 tokens differ" in text
    assert "- draft k=2 on s/p1: from token 1, 1 of 4 tokens differ" in text
    validate(as_data(report))


def test_rows_join_on_their_key_not_their_name(monkeypatch) -> None:
    """Two rows whose display names collide (and every name changed on the way) still get
    their own runs and the right baseline."""
    wide = RowSpec("draft", 2, sampling=SamplingConfig(temperature=0.0, top_p=0.9))
    narrow = RowSpec("draft", 2, sampling=SamplingConfig(temperature=0.0, top_p=0.5))
    assert wide.name == narrow.name and wide != narrow
    config = _synthetic_config((NONE, wide, narrow))
    runs = [
        measured(NONE, 0, [(0, 1, 0.1)] * 4),  # 10 tok/s
        measured(wide, 0, [(2, 2, 0.1)] * 2),  # 20 tok/s
        measured(narrow, 0, [(2, 4, 0.1)] * 1, token_ids=(9,) * 5),  # 40 tok/s
    ]
    monkeypatch.setattr(RowSpec, "name", property(lambda self: "renamed"))
    report = build_report(config, runs, fake_environment(), None)
    summary = {s.row: s for s in report.summary}
    assert summary[NONE].speedup_vs_none == pytest.approx(1.0)
    assert summary[wide].speedup_vs_none == pytest.approx(2.0)
    assert summary[narrow].speedup_vs_none == pytest.approx(4.0)
    assert (summary[wide].matched, summary[narrow].matched) == (True, False)
    assert [r.row for r in report.results] == [NONE, wide, narrow]


def test_csv_and_markdown_render_missing_values() -> None:
    empty = {f.name: None for f in fields(SummaryRow)}
    empty.update(temperature=0.0, suite="code", row=NONE, acceptance_by_position=())
    line = SummaryRow(**empty | {"prompts": 0, "runs": 0, "tokens": 0})
    environment = fake_environment() | {"python": "3", "cpu": "x", "cpu_count": 1}
    config = BenchConfig(suites=(Suite("code", (Prompt("p", "x"),)),), rows=(NONE,))
    report = Report(config, environment, None, (), (line,))
    text = to_csv(report)
    assert text.splitlines()[1].startswith("0.0,code,none,none,0")
    assert "| 0 | code | none |" in markdown(report)


def test_tree_rows_report_their_verified_tokens_and_no_chain_model_fit() -> None:
    """A tree row verifies 1 + 15 nodes a call: no α or prediction from the chain model,
    which prices k + 1 tokens; a chain row at k = 3 gets both."""
    from specmlx.engine.costs import CostProfile

    tree, chain = RowSpec("medusa", 4), RowSpec("draft", 3)
    config = _synthetic_config((NONE, tree, chain))
    runs = [
        measured(NONE, 0, [(0, 1, 0.1)] * 6),
        measured(tree, 0, [(15, 3, 0.12)] * 6),
        measured(chain, 0, [(3, 2, 0.12)] * 6),
    ]
    costs = CostProfile(0.1, 0.03, {n: 1.0 + 0.02 * n for n in range(1, 17)})
    report = build_report(config, runs, fake_environment(), costs)
    validate(report)
    lines = {s.row: s for s in report.summary}
    assert lines[tree].verified_per_call == pytest.approx(1 + 15 * 6 / 7)
    assert lines[tree].alpha is None and lines[tree].predicted_speedup is None
    assert lines[chain].alpha is not None and lines[chain].predicted_speedup is not None


def test_proposal_cost_is_the_median_timed_proposal_over_the_target_alones_step() -> None:
    """Heads' c: the proposals timed in the run (draft_seconds) over the median step of the
    target alone in the same run; rows that timed none have none."""
    tree, chain = RowSpec("eagle", 4), RowSpec("draft", 4)
    config = _synthetic_config((NONE, tree, chain))
    timed = [replace(_step(15, 3, 0.2), draft_seconds=s) for s in (0.02, 0.03, 0.09)]
    runs = [
        measured(NONE, 0, [(0, 1, 0.1), (0, 1, 0.1), (0, 1, 0.4)]),
        replace(measured(tree, 0, []), decode_steps=tuple(timed)),
        measured(chain, 0, [(4, 3, 0.2)] * 3),
    ]
    environment = fake_environment() | {"python": "3", "cpu": "x", "cpu_count": 1}
    report = build_report(config, runs, environment, None)
    validate(report)
    lines = {s.row: s for s in report.summary}
    assert lines[tree].proposal_cost == pytest.approx(0.03 / 0.1)
    assert lines[chain].proposal_cost is None and lines[NONE].proposal_cost is None
    assert "| draft c |" in markdown(report) and "| 0.30 |" in markdown(report)


def test_the_spread_of_x_none_is_the_standard_error_of_the_paired_draws() -> None:
    """Each draw (a repeat of a prompt) pairs the row with the target alone of the same
    repeat: the spread is the standard error of those ratios, not of the rates (a slow spell
    that slows both rows of a draw moves no ratio); one draw gives none."""
    import statistics

    draft = RowSpec("draft", 4)
    config = _synthetic_config((NONE, draft), prompts=2, repeats=2)
    # The second repeat of p0 ran on a machine twice as slow: both rows alike.
    none_seconds = {("p0", 0): 1.0, ("p0", 1): 2.0, ("p1", 0): 1.0, ("p1", 1): 1.0}
    draft_seconds = {("p0", 0): 0.8, ("p0", 1): 1.5, ("p1", 0): 0.9, ("p1", 1): 0.7}
    environment = fake_environment() | {"python": "3", "cpu": "x", "cpu_count": 1}
    runs = []
    for (prompt, repeat), seconds in none_seconds.items():
        runs.append(measured(NONE, repeat, [(0, 1, seconds / 10)] * 10, prompt_id=prompt))
        drafted = draft_seconds[(prompt, repeat)]
        runs.append(measured(draft, repeat, [(4, 5, drafted / 2)] * 2, prompt_id=prompt))
    report = build_report(config, runs, environment, None)
    validate(report)
    row = next(line for line in report.summary if line.row == draft)
    ratios = [none_seconds[key] / draft_seconds[key] for key in none_seconds]
    assert row.speedup_spread == pytest.approx(statistics.stdev(ratios) / 2)
    assert "| ± |" in markdown(report)
    one = build_report(_synthetic_config((NONE, draft)), runs[:2], environment, None)
    assert next(line for line in one.summary if line.row == draft).speedup_spread is None
