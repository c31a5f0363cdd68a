"""Turn a benchmark's measurements into its report: per-prompt results and summaries.

Definitions, each over the runs of one (temperature, suite, row):

- tokens/s: decode rate of a run (see `specmlx.bench`); per prompt, the median over repeats;
  the summary is the median over prompts. `tokens_per_sec_aggregate` is all decode tokens
  over all decode seconds.
- speedup vs none: per prompt, the row's tokens/s over the target alone's, then the median
  over prompts. Speedup vs mlx-lm: the same against the mlx-lm row with the same k.
- steady tokens/s: the same runs, each step timed at the median time of the row's steps
  that drafted as many tokens (over the whole bench, at that temperature), so a spell of a
  shared machine running slow (a step taking twice its usual time) moves no row: per
  prompt, the decode tokens of all repeats over their steady time. Steady speedup vs none:
  per prompt, over the target alone's, then the median over prompts. Not for mlx-lm's rows
  (they report no steps).
- acceptance: ours, accepted drafts over drafted tokens; mlx-lm's, the fraction of its
  tokens that came from the draft (it reports nothing else).
- tokens per call: tokens over target calls.
- matched (T = 0 only): every prompt's tokens equal the target alone's, token for token.
- alpha: Leviathan's per-token acceptance α fitted to this run, the α whose expected
  tokens per step E(α, γ) equal the measured tokens per call.
- predicted speedup: E / (γ·c + v(γ+1)) at that α, with c and v measured on this device.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from specmlx.bench import DRAFT_MODEL_METHODS, MLX_LM, BenchConfig, Measurement, RowSpec
from specmlx.costs import CostProfile, acceptance_from_tokens

SCHEMA_VERSION = 1


def build_report(
    config: BenchConfig,
    measurements: Iterable[Measurement],
    environment: dict[str, Any],
    costs: CostProfile | None,
) -> dict[str, Any]:
    """The whole report, as the JSON output holds it (see data/bench.schema.json)."""
    kept = [m for m in measurements if m.repeat >= 0]
    results = per_prompt(kept, typical_steps(kept))
    summary = []
    for temperature in config.temperatures:
        suites = [s.name for s in config.suites] + (["all"] if len(config.suites) > 1 else [])
        for suite in suites:
            for row in config.rows:
                runs = [
                    m
                    for m in kept
                    if m.temperature == temperature
                    and m.row == row.name
                    and suite in ("all", m.suite)
                ]
                prompts = [
                    r
                    for r in results
                    if r["temperature"] == temperature and suite in ("all", r["suite"])
                ]
                summary.append(summarize_row(row, runs, prompts, costs, temperature, suite))
    return {
        "schema_version": SCHEMA_VERSION,
        "environment": environment,
        "config": {
            "suites": {s.name: [p.id for p in s.prompts] for s in config.suites},
            "rows": [
                {
                    "name": r.name,
                    "method": r.method,
                    "k": r.k,
                    "sampling_override": r.sampling is not None,
                }
                for r in config.rows
            ],
            "temperatures": list(config.temperatures),
            "top_p": config.top_p,
            "top_k": config.top_k,
            "max_tokens": config.max_tokens,
            "repeats": config.repeats,
            "warmup": config.warmup,
            "seed": config.seed,
            "chat_template": config.chat_template,
        },
        "costs": costs.as_dict() if costs is not None else None,
        "results": results,
        "summary": summary,
    }


def typical_steps(kept: list[Measurement]) -> dict[tuple[float, str, int], float]:
    """The median seconds of a step, by (temperature, row, tokens drafted)."""
    times: dict[tuple[float, str, int], list[float]] = {}
    for m in kept:
        for drafted, _, seconds in m.decode_steps:
            times.setdefault((m.temperature, m.row, drafted), []).append(seconds)
    return {key: statistics.median(values) for key, values in times.items()}


def steady_rate(
    runs: list[Measurement], typical: dict[tuple[float, str, int], float]
) -> float | None:
    """Decode tokens over the runs' steps timed at their typical seconds (see the module)."""
    tokens = sum(emitted for m in runs for _, emitted, _ in m.decode_steps)
    seconds = sum(
        typical[(m.temperature, m.row, drafted)] for m in runs for drafted, _, _ in m.decode_steps
    )
    return _ratio(tokens, seconds)


def per_prompt(
    kept: list[Measurement], typical: dict[tuple[float, str, int], float]
) -> list[dict[str, Any]]:
    """One entry per (temperature, suite, prompt, row): medians over repeats, the steady rate
    (given the `typical` step times) and `matched`."""
    reference = {
        (m.temperature, m.suite, m.prompt_id, m.repeat): m.token_ids
        for m in kept
        if m.row == "none"
    }
    groups: dict[tuple[float, str, str, str], list[Measurement]] = {}
    for m in kept:
        groups.setdefault((m.temperature, m.suite, m.prompt_id, m.row), []).append(m)
    results = []
    for (temperature, suite, prompt_id, row), runs in groups.items():
        matched = None
        if temperature == 0 and row != "none":
            matched = all(
                m.token_ids == reference.get((temperature, suite, prompt_id, m.repeat))
                for m in runs
            )
        results.append(
            {
                "temperature": temperature,
                "suite": suite,
                "prompt_id": prompt_id,
                "row": row,
                "tokens_per_sec": statistics.median(m.tokens_per_sec for m in runs),
                "steady_tokens_per_sec": steady_rate(runs, typical),
                "time_to_first_token": statistics.median(m.time_to_first_token for m in runs),
                "tokens": [len(m.token_ids) for m in runs],
                "target_calls": [m.target_calls for m in runs],
                "seconds": [m.seconds for m in runs],
                "accepted": [m.accepted for m in runs],
                "drafted": [m.drafted for m in runs],
                "matched": matched,
                "token_ids": [list(m.token_ids) for m in runs],
            }
        )
    return results


def summarize_row(
    row: RowSpec,
    runs: list[Measurement],
    prompts: list[dict[str, Any]],
    costs: CostProfile | None,
    temperature: float,
    suite: str,
) -> dict[str, Any]:
    """One line of the table: a row's numbers over the prompts of one suite (or all)."""
    rate = {(r["suite"], r["prompt_id"], r["row"]): r["tokens_per_sec"] for r in prompts}
    steady = {(r["suite"], r["prompt_id"], r["row"]): r["steady_tokens_per_sec"] for r in prompts}
    mine = [r for r in prompts if r["row"] == row.name]
    tokens = sum(len(m.token_ids) for m in runs)
    if row.method == MLX_LM:
        acceptance = _ratio(sum(m.accepted for m in runs), tokens)
    else:
        acceptance = _ratio(sum(m.accepted for m in runs), sum(m.drafted for m in runs))
    by_position = _by_position(runs)
    tokens_per_call = _ratio(tokens, sum(m.target_calls for m in runs))
    alpha = predicted = None
    # An adaptive row has no single k: no α fit and no prediction.
    if row.method != "none" and row.k is not None and tokens_per_call is not None:
        alpha = acceptance_from_tokens(tokens_per_call, row.k)
        if costs is not None and row.method != MLX_LM:
            uses_model = row.method in DRAFT_MODEL_METHODS
            predicted = costs.speedup(alpha, row.k, uses_draft_model=uses_model)
    matched = [r["matched"] for r in mine if r["matched"] is not None]
    return {
        "temperature": temperature,
        "suite": suite,
        "row": row.name,
        "method": row.method,
        "k": row.k,
        "prompts": len(mine),
        "runs": len(runs),
        "tokens": tokens,
        "tokens_per_sec": _median(r["tokens_per_sec"] for r in mine),
        "tokens_per_sec_aggregate": _ratio(
            sum(m.decode_tokens for m in runs), sum(m.decode_seconds for m in runs)
        ),
        "speedup_vs_none": _speedup(mine, rate, "none"),
        "steady_speedup_vs_none": _speedup(mine, steady, "none", "steady_tokens_per_sec"),
        "speedup_vs_mlx_lm": (
            _speedup(mine, rate, f"{MLX_LM} k={row.k}")
            if row.method not in ("none", MLX_LM) and row.k is not None
            else None
        ),
        "acceptance_rate": acceptance if row.method != "none" else None,
        "tokens_per_call": tokens_per_call,
        "alpha": alpha,
        "acceptance_by_position": by_position,
        "time_to_first_token": _median(m.time_to_first_token for m in runs),
        "peak_memory_gb": max((m.peak_memory_gb for m in runs), default=None),
        "matched": all(matched) if matched else None,
        "predicted_speedup": predicted,
    }


def _speedup(
    mine: list[dict], rate: dict, other: str, field: str = "tokens_per_sec"
) -> float | None:
    ratios = [
        r[field] / rate[(r["suite"], r["prompt_id"], other)]
        for r in mine
        if r.get(field) is not None and rate.get((r["suite"], r["prompt_id"], other))
    ]
    return _median(ratios)


def _by_position(runs: list[Measurement]) -> list[float]:
    width = max((len(m.drafted_by_position) for m in runs), default=0)
    drafted, accepted = [0] * width, [0] * width
    for m in runs:
        for i, (d, a) in enumerate(zip(m.drafted_by_position, m.accepted_by_position, strict=True)):
            drafted[i] += d
            accepted[i] += a
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)]


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None
