"""Turn a benchmark's measurements into its report: per-prompt results and summary rows.

Rows are joined on their `RowSpec` (method, k, sampler), never on their display names.
Definitions, each over the runs of one (temperature, suite, row):

- tokens/s: decode rate of a run (see `specmlx.bench.run`); per prompt, the median over repeats;
  the summary is the median over prompts. `tokens_per_sec_aggregate` is all decode tokens
  over all decode seconds.
- speedup vs none (`× none`): per prompt, the row's tokens/s over the target alone's through
  our loop (`none`), then the median over prompts.
- spread of × none (`±`): per draw (one repeat of one prompt, all rows drawing with the same
  seed one after the other), the row's tokens/s over the target alone's; the standard error
  of their mean (their standard deviation over √draws). A difference between two rows
  smaller than about twice this is noise of the machine (None with fewer than 2 draws).
- speedup vs best plain (`× best plain`): the same, against the faster of the two plain
  baselines on that prompt, `none` and `mlx-lm plain` (mlx-lm's generation on the target
  alone); `none` alone when mlx-lm is not benched. Above 1, a row beats plain decoding
  however it is done.
- speedup vs mlx-lm: the same against mlx-lm's speculative row with the same k.
- steady tokens/s: the same runs, each step timed at the median time of the row's steps
  that drafted as many tokens (over the whole bench, at that temperature), so a spell of a
  shared machine running slow (a step taking twice its usual time) moves no row: per
  prompt, the decode tokens of all repeats over their steady time. Steady speedup vs none:
  per prompt, over the target alone's, then the median over prompts. Not for mlx-lm's rows
  (they report no steps).
- acceptance: ours, accepted drafts over drafted tokens; mlx-lm's, the fraction of its
  tokens that came from the draft (it reports nothing else). By position: from the runs'
  pooled `Stats` counts.
- tokens per call: tokens over target calls.
- matched (T = 0 only): every prompt's tokens equal the target alone's (`none`), token for
  token; for `none` itself, equal mlx-lm plain's (None without that row). Per prompt, where
  they do not: the first token that differs and how many differ (the worst repeat).
- alpha: Leviathan's per-token acceptance α fitted to this run, the α whose expected
  tokens per step E(α, γ) equal the measured tokens per call.
- predicted speedup: E / (γ·c + v(γ+1)) at that α, with c and v measured on this device.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from specmlx.api.config import GenerationConfig
from specmlx.api.methods import METHODS
from specmlx.bench.bound import LookupBound, bound_of, lookup_bound
from specmlx.bench.run import MLX_LM, MLX_LM_PLAIN, NONE, BenchConfig, Measurement, RowSpec
from specmlx.engine.costs import CostProfile, acceptance_from_tokens
from specmlx.engine.stats import Stats

PLAIN_BASELINES = (NONE, MLX_LM_PLAIN)

# Where a row ran: (temperature, suite, prompt id, row).
PromptKey = tuple[float, str, str, RowSpec]


@dataclass(frozen=True)
class PromptResult:
    """One row on one prompt at one temperature: medians over repeats, per-repeat counts."""

    temperature: float
    suite: str
    prompt_id: str
    row: RowSpec
    tokens_per_sec: float
    steady_tokens_per_sec: float | None
    time_to_first_token: float
    rates: tuple[float, ...]  # tokens/s per repeat, in repeat order, as the rest
    tokens: tuple[int, ...]
    target_calls: tuple[int, ...]
    seconds: tuple[float, ...]
    accepted: tuple[int, ...]
    drafted: tuple[int, ...]
    matched: bool | None
    token_ids: tuple[tuple[int, ...], ...]
    # Where not matched: the first differing token (0-based) and the tokens that differ, of
    # the repeat that differed first; None where matched or not compared.
    first_difference: int | None = None
    differing: int | None = None


@dataclass(frozen=True)
class SummaryRow:
    """One line of the table: a row's numbers over the prompts of one suite (or all)."""

    temperature: float
    suite: str
    row: RowSpec
    prompts: int
    runs: int
    tokens: int
    tokens_per_sec: float | None
    tokens_per_sec_aggregate: float | None
    speedup_vs_none: float | None
    speedup_spread: float | None  # the standard error of × none over draws
    speedup_vs_best_plain: float | None
    steady_speedup_vs_none: float | None
    speedup_vs_mlx_lm: float | None
    acceptance_rate: float | None
    tokens_per_call: float | None
    verified_per_call: float | None  # tokens a speculative call scored: k + 1, or a tree's nodes
    # A proposal's median time over a plain step's (the target alone, same run), where the
    # proposals were timed: every tree; chains when adaptive k timed them.
    proposal_cost: float | None
    alpha: float | None
    acceptance_by_position: tuple[float, ...]
    time_to_first_token: float | None
    peak_memory_gb: float | None
    matched: bool | None
    predicted_speedup: float | None


@dataclass(frozen=True)
class Report:
    """The whole report; `specmlx.bench.report.as_data` turns it into what the JSON output
    holds (data/bench.schema.json)."""

    config: BenchConfig
    environment: dict[str, Any]
    costs: CostProfile | None
    results: tuple[PromptResult, ...]
    summary: tuple[SummaryRow, ...]
    # At T = 0, per suite (and half): how far any lookup of the run's own text could go.
    bounds: tuple[LookupBound, ...] = ()
    resumed: int = 0  # groups measured by an earlier run of the same bench (its journal)


def build_report(
    config: BenchConfig,
    measurements: Iterable[Measurement],
    environment: dict[str, Any],
    costs: CostProfile | None,
    resumed: int = 0,
) -> Report:
    """Every prompt's results and every (temperature, suite or all, row)'s summary;
    `resumed`: how many groups an earlier run of the same bench measured."""
    kept = [m for m in measurements if m.repeat >= 0]
    typical = typical_steps(kept)
    results = per_prompt(kept, typical)
    groups = suite_groups(config)
    summary = []
    for temperature in config.temperatures:
        plain_step = typical.get((temperature, NONE, 0))  # what proposal costs are priced in
        for suite, holds in groups.items():
            prompts = {
                (r.suite, r.prompt_id, r.row): r
                for r in results
                if r.temperature == temperature and holds(r.suite, r.prompt_id)
            }
            for row in config.rows:
                runs = [
                    m
                    for m in kept
                    if m.temperature == temperature and m.row == row and holds(m.suite, m.prompt_id)
                ]
                summary.append(
                    summarize_row(row, runs, prompts, costs, temperature, suite, plain_step)
                )
    bounds = lookup_bounds(config, kept, costs)
    return Report(config, environment, costs, tuple(results), tuple(summary), bounds, resumed)


def lookup_bounds(
    config: BenchConfig, kept: list[Measurement], costs: CostProfile | None
) -> tuple[LookupBound, ...]:
    """`specmlx.bench.bound` over the target alone's greedy answers (its first repeat), per
    suite in the order its prompts ran, and per group of `suite_groups`."""
    answers = {
        (m.suite, m.prompt_id): (m.prompt_ids, m.token_ids)
        for m in kept
        if m.temperature == 0 and m.row == NONE and m.repeat == 0 and m.prompt_ids
    }
    verify_cost = costs.verify_cost if costs is not None else None
    # The longest draft any row makes: its k, or adaptive k's longest.
    depth = max(GenerationConfig.max_k if row.k is None else row.k for row in config.rows)
    lookups = {}
    for suite in config.suites:
        ran = [(suite.name, p.id) for p in suite.prompts if (suite.name, p.id) in answers]
        found = lookup_bound([answers[key] for key in ran], verify_cost, depth)
        lookups.update(zip(ran, found, strict=True))
    bounds = []
    for name, holds in suite_groups(config).items():
        bound = bound_of(name, depth, [pair for key, pair in lookups.items() if holds(*key)])
        if bound is not None:
            bounds.append(bound)
    return tuple(bounds)


def suite_groups(config: BenchConfig) -> dict[str, Callable[[str, str], bool]]:
    """The groups a summary line is over, by name: each suite; an ordered suite's first and
    second half too (`Suite.halves`: what history bought); all suites, when several ran.
    Each says whether a (suite, prompt id) belongs to it."""
    groups: dict[str, Callable[[str, str], bool]] = {}
    for one in config.suites:
        groups[one.name] = lambda suite, _, name=one.name: suite == name
        halves = one.halves()
        for label, ids in zip(("1st half", "2nd half"), halves or (), strict=False):
            groups[f"{one.name} {label}"] = lambda suite, prompt, name=one.name, ids=ids: (
                suite == name and prompt in ids
            )
    if len(config.suites) > 1:
        groups["all"] = lambda suite, prompt: True
    return groups


def typical_steps(kept: list[Measurement]) -> dict[tuple[float, RowSpec, int], float]:
    """The median seconds of a step, by (temperature, row, tokens drafted)."""
    times: dict[tuple[float, RowSpec, int], list[float]] = {}
    for m in kept:
        for step in m.decode_steps:
            times.setdefault((m.temperature, m.row, step.n_drafted), []).append(step.seconds)
    return {key: statistics.median(values) for key, values in times.items()}


def steady_rate(
    runs: list[Measurement], typical: dict[tuple[float, RowSpec, int], float]
) -> float | None:
    """Decode tokens over the runs' steps timed at their typical seconds (see the module)."""
    steps = [(m.temperature, m.row, step) for m in runs for step in m.decode_steps]
    tokens = sum(len(step.tokens) for _, _, step in steps)
    seconds = sum(typical[(t, row, step.n_drafted)] for t, row, step in steps)
    return _ratio(tokens, seconds)


def per_prompt(
    kept: list[Measurement], typical: dict[tuple[float, RowSpec, int], float]
) -> list[PromptResult]:
    """One result per (temperature, suite, prompt, row): medians over repeats, the steady
    rate (given the `typical` step times) and `matched`."""
    groups: dict[PromptKey, list[Measurement]] = {}
    for m in kept:
        groups.setdefault((m.temperature, m.suite, m.prompt_id, m.row), []).append(m)
    results = []
    for (temperature, suite, prompt_id, row), runs in groups.items():
        runs = sorted(runs, key=lambda m: m.repeat)
        # Every row is checked against the target alone; the target alone against mlx-lm's.
        reference_row = MLX_LM_PLAIN if row == NONE else NONE
        reference = groups.get((temperature, suite, prompt_id, reference_row))
        matched = worst = None
        if temperature == 0 and reference is not None:
            by_repeat = {m.repeat: m.token_ids for m in reference}
            matched = all(m.token_ids == by_repeat.get(m.repeat) for m in runs)
            found = [
                divergence(m.token_ids, by_repeat[m.repeat])
                for m in runs
                if m.repeat in by_repeat and m.token_ids != by_repeat[m.repeat]
            ]
            worst = min(found) if found else None
        results.append(
            PromptResult(
                temperature=temperature,
                suite=suite,
                prompt_id=prompt_id,
                row=row,
                tokens_per_sec=statistics.median(m.tokens_per_sec for m in runs),
                steady_tokens_per_sec=steady_rate(runs, typical),
                time_to_first_token=statistics.median(m.time_to_first_token for m in runs),
                rates=tuple(m.tokens_per_sec for m in runs),
                tokens=tuple(len(m.token_ids) for m in runs),
                target_calls=tuple(m.stats.target_calls for m in runs),
                seconds=tuple(m.seconds for m in runs),
                accepted=tuple(m.stats.accepted for m in runs),
                drafted=tuple(m.stats.drafted for m in runs),
                matched=matched,
                token_ids=tuple(m.token_ids for m in runs),
                first_difference=worst[0] if worst else None,
                differing=worst[1] if worst else None,
            )
        )
    return results


def divergence(tokens: list[int], reference: list[int]) -> tuple[int, int]:
    """Where two different outputs part: the first position that differs (the shorter's
    length where one is a prefix of the other), and how many positions differ (those only
    one output has count)."""
    pairs = list(zip(tokens, reference, strict=False))
    first = next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))
    unequal = sum(a != b for a, b in pairs) + abs(len(tokens) - len(reference))
    return first, unequal


def summarize_row(
    row: RowSpec,
    runs: list[Measurement],
    prompts: dict[tuple[str, str, RowSpec], PromptResult],
    costs: CostProfile | None,
    temperature: float,
    suite: str,
    plain_step: float | None = None,
) -> SummaryRow:
    """A row's numbers over the prompts of one suite (or all); `prompts` holds every row's
    results there, by (suite, prompt id, row). `plain_step`: the median seconds of the target
    alone's steps in this run (what proposal costs are priced in)."""
    mine = [r for r in prompts.values() if r.row == row]
    pooled = pooled_stats(m.stats for m in runs)
    if row.is_plain:
        acceptance = None
    elif row.method == MLX_LM:
        acceptance = _ratio(pooled.accepted, pooled.tokens)
    else:
        acceptance = _ratio(pooled.accepted, pooled.drafted)
    tokens_per_call = _ratio(pooled.tokens, pooled.target_calls)
    speculative_calls = pooled.target_calls - pooled.plain_steps
    verified = None
    if not row.is_plain and row.method != MLX_LM and speculative_calls:
        verified = 1 + pooled.drafted / speculative_calls
    tree = row.method in METHODS and METHODS[row.method].drafts_trees
    alpha = predicted = None
    # An adaptive row has no single k: no α fit and no prediction; Leviathan's chain model
    # does not describe trees.
    if not row.is_plain and not tree and row.k is not None and tokens_per_call is not None:
        alpha = acceptance_from_tokens(tokens_per_call, row.k)
        if costs is not None and row.method != MLX_LM:
            predicted = costs.speedup(alpha, row.k, uses_draft_model=row.needs_draft_model)
    matched = [r.matched for r in mine if r.matched is not None]
    ours_at_fixed_k = not row.is_plain and row.method != MLX_LM and row.k is not None

    def rate(result: PromptResult, other: RowSpec) -> float | None:
        baseline = prompts.get((result.suite, result.prompt_id, other))
        return baseline.tokens_per_sec if baseline is not None else None

    def best_plain(result: PromptResult) -> float | None:
        return max((r for r in (rate(result, b) for b in PLAIN_BASELINES) if r), default=None)

    return SummaryRow(
        temperature=temperature,
        suite=suite,
        row=row,
        prompts=len(mine),
        runs=len(runs),
        tokens=pooled.tokens,
        tokens_per_sec=_median(r.tokens_per_sec for r in mine),
        tokens_per_sec_aggregate=_ratio(
            sum(m.decode_tokens for m in runs), sum(m.decode_seconds for m in runs)
        ),
        speedup_vs_none=_median_ratio((r.tokens_per_sec, rate(r, NONE)) for r in mine),
        speedup_spread=_spread(
            a / b
            for r in mine
            if (baseline := prompts.get((r.suite, r.prompt_id, NONE))) is not None
            and len(baseline.rates) == len(r.rates)
            for a, b in zip(r.rates, baseline.rates, strict=True)
            if b > 0
        ),
        speedup_vs_best_plain=_median_ratio((r.tokens_per_sec, best_plain(r)) for r in mine),
        steady_speedup_vs_none=_median_ratio(
            (r.steady_tokens_per_sec, _steady(prompts, r, NONE)) for r in mine
        ),
        speedup_vs_mlx_lm=(
            _median_ratio((r.tokens_per_sec, rate(r, RowSpec(MLX_LM, row.k))) for r in mine)
            if ours_at_fixed_k
            else None
        ),
        acceptance_rate=acceptance,
        tokens_per_call=tokens_per_call,
        verified_per_call=verified,
        proposal_cost=_proposal_cost(runs, plain_step),
        alpha=alpha,
        acceptance_by_position=pooled.acceptance_by_position,
        time_to_first_token=_median(m.time_to_first_token for m in runs),
        peak_memory_gb=max((m.stats.peak_memory_gb for m in runs), default=None),
        matched=all(matched) if matched else None,
        predicted_speedup=predicted,
    )


def _proposal_cost(runs: list[Measurement], plain_step: float | None) -> float | None:
    timed = [s.draft_seconds for m in runs for s in m.decode_steps if s.draft_seconds is not None]
    if not timed or not plain_step:
        return None
    return statistics.median(timed) / plain_step


def pooled_stats(runs: Iterable[Stats]) -> Stats:
    """The totals of several runs' statistics (by-position counts summed too)."""
    return functools.reduce(Stats.merge, runs, Stats(responses=0))


def _steady(prompts: dict, result: PromptResult, other: RowSpec) -> float | None:
    baseline = prompts.get((result.suite, result.prompt_id, other))
    return baseline.steady_tokens_per_sec if baseline is not None else None


def _spread(ratios: Iterable[float]) -> float | None:
    """The standard error of the mean of paired ratios; None with fewer than 2."""
    values = list(ratios)
    if len(values) < 2:
        return None
    return statistics.stdev(values) / len(values) ** 0.5


def _median_ratio(pairs: Iterable[tuple[float | None, float | None]]) -> float | None:
    return _median(a / b for a, b in pairs if a is not None and b)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None
