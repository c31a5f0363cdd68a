"""Render a benchmark report: the Rich header and table, JSON, CSV, Markdown and a plot.

Nothing here measures anything. `as_data` is the report as plain data, the JSON output
(data/bench.schema.json): a row appears as its display name with its method and k. The
CLI writes them with `specmlx.io.files.write_atomic`, so an interrupted run never leaves
half a file behind.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from specmlx.bench.bound import LookupBound
from specmlx.bench.run import NONE, RowSpec
from specmlx.bench.summary import Report
from specmlx.errors import UsageError

SCHEMA_VERSION = 2

CSV_FIELDS = (
    "temperature",
    "suite",
    "row",
    "method",
    "k",
    "prompts",
    "runs",
    "tokens",
    "tokens_per_sec",
    "tokens_per_sec_aggregate",
    "speedup_vs_none",
    "speedup_spread",
    "speedup_vs_best_plain",
    "steady_speedup_vs_none",
    "speedup_vs_mlx_lm",
    "predicted_speedup",
    "alpha",
    "acceptance_rate",
    "tokens_per_call",
    "verified_per_call",
    "proposal_cost",
    "time_to_first_token",
    "peak_memory_gb",
    "matched",
)
COLUMNS = (
    ("T", "temperature", "{:g}"),
    ("suite", "suite", "{}"),
    ("row", "row", "{}"),
    ("tok/s", "tokens_per_sec", "{:.2f}"),
    ("agg tok/s", "tokens_per_sec_aggregate", "{:.2f}"),
    ("× none", "speedup_vs_none", "{:.2f}"),
    ("±", "speedup_spread", "{:.2f}"),
    ("× best plain", "speedup_vs_best_plain", "{:.2f}"),
    ("steady ×", "steady_speedup_vs_none", "{:.2f}"),
    ("× mlx-lm", "speedup_vs_mlx_lm", "{:.2f}"),
    ("predicted", "predicted_speedup", "{:.2f}"),
    ("α", "alpha", "{:.2f}"),
    ("accept", "acceptance_rate", "{:.0%}"),
    ("tok/call", "tokens_per_call", "{:.2f}"),
    ("verified", "verified_per_call", "{:.1f}"),
    ("draft c", "proposal_cost", "{:.2f}"),
    ("ttft s", "time_to_first_token", "{:.2f}"),
    ("peak GB", "peak_memory_gb", "{:.2f}"),
    ("matched", "matched", "{}"),
)


def record_data(record: Any) -> dict[str, Any]:
    """A result or summary row as plain data: its row as name, method and k; lists for
    tuples."""
    data: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, RowSpec):
            data.update(row=value.name, method=value.method, k=value.k)
        elif isinstance(value, tuple):
            data[f.name] = [list(v) if isinstance(v, tuple) else v for v in value]
        else:
            data[f.name] = value
    return data


def as_data(report: Report) -> dict[str, Any]:
    """The whole report as the JSON output holds it."""
    config = report.config
    return {
        "schema_version": SCHEMA_VERSION,
        "environment": report.environment,
        "config": {
            "suites": {s.name: [p.id for p in s.prompts] for s in config.suites},
            "rows": [
                {"name": r.name, "method": r.method, "k": r.k}
                | {"sampling_override": r.sampling is not None}
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
            # Methods run with other than their defaults: their options.
            "options": {type(o).__name__: asdict(o) for o in config.options},
        },
        "costs": report.costs.as_dict() if report.costs is not None else None,
        "results": [record_data(r) for r in report.results],
        "summary": [record_data(s) for s in report.summary],
        "lookup_bounds": [bound_data(b) for b in report.bounds],
        "resumed_groups": report.resumed,
    }


def bound_data(bound: LookupBound) -> dict[str, Any]:
    return asdict(bound) | {
        "tokens_per_call_within": bound.tokens_per_call_within,
        "tokens_per_call_with_memory": bound.tokens_per_call_with_memory,
        "speedup_within": bound.speedup_within,
        "speedup_with_memory": bound.speedup_with_memory,
    }


def bound_title(depth: int) -> str:
    return (
        "Lookup bound (T=0, from the target alone's answers): what a drafter of text found "
        f"verbatim (up to {depth} tokens a step) in the request (prompt lookup's reach) or "
        "also in the suite's earlier answers (suffix decoding's) could reach at best: the "
        "most tokens per call, and the most × target alone at the calibrated v(n)."
    )


BOUND_COLUMNS = (
    ("suite", "suite", "{}"),
    ("tok/call: request", "tokens_per_call_within", "{:.2f}"),
    ("tok/call: + earlier answers", "tokens_per_call_with_memory", "{:.2f}"),
    ("× request", "speedup_within", "{:.2f}"),
    ("× + earlier answers", "speedup_with_memory", "{:.2f}"),
)


def header_lines(report: Report) -> list[str]:
    """The environment, one fact per line."""
    env = report.environment
    costs = report.costs.as_dict() if report.costs is not None else None
    lines = [
        f"specmlx {env['specmlx']} · mlx {env['mlx']} · mlx-lm {env['mlx_lm']} · "
        f"python {env['python']}",
        f"device {env['device']} ({env['backend']}) · {env['cpu']} × {env['cpu_count']} · "
        f"BLAS {env['blas']}",
    ]
    if "compiled_calls" in env:  # files written before it was recorded lack it
        calls = "compiled" if env["compiled_calls"] else "op by op (mlx-lm's)"
        lines[-1] += f" · target calls {calls}"
    for role in ("target", "draft"):
        info = env.get(role)
        if info:
            quant = info["quantization"] or "not quantized"
            lines.append(
                f"{role} {info['path']}: {info['parameters'] / 1e9:.2f}B params, "
                f"{info['dtype']}, {quant}, {info['bytes'] / 1e9:.2f} GB"
            )
    lines.append(
        f"bandwidth {env['bandwidth_gb_s']:.1f} GB/s · {env['bytes_per_target_call'] / 1e9:.2f} "
        f"GB per target call · roofline {env['roofline_tokens_per_sec']:.2f} tok/s"
    )
    if report.resumed:
        lines.append(
            f"resumed: {report.resumed} of {report.config.groups} groups (a prompt's rows) "
            "measured by an earlier run of this bench; adaptive k started afresh after them"
        )
    if costs:
        v = ", ".join(f"v({k})={r:.2f}" for k, r in costs["v"].items())
        lines.append(
            f"costs: target call {costs['target_call_seconds'] * 1000:.0f} ms, c={costs['c']:.3f}, {v}"
        )
    return lines


def render(report: Report) -> Group:
    """The header and the table as one Rich renderable."""
    table = Table(
        title="specmlx bench: decode tok/s; speedups are medians of per-prompt ratios",
        caption="× none: over our target alone; × best plain: over the faster of none and "
        "mlx-lm plain on each prompt. accept: ours, accepted / drafted; mlx-lm, share of its tokens from the draft. "
        "α: Leviathan's per-token acceptance fitted to tok/call; predicted: his speedup at "
        "that α with the measured c and v. matched: T=0 output equals the target alone's "
        "(none's: mlx-lm plain's), token for token, on every prompt.",
    )
    for title, _, _ in COLUMNS:
        table.add_column(title, justify="left" if title in ("suite", "row") else "right")
    previous = None
    for line in map(record_data, report.summary):
        group = (line["temperature"], line["suite"])
        if previous is not None and group != previous:
            table.add_section()
        previous = group
        table.add_row(*(_cell(line[key], fmt) for _, key, fmt in COLUMNS))
    parts = [Text("\n".join(header_lines(report)), style="dim"), table]
    if report.bounds:
        bounds = Table(caption=bound_title(report.bounds[0].depth))
        for title, _, _ in BOUND_COLUMNS:
            bounds.add_column(title, justify="left" if title == "suite" else "right")
        for line in map(bound_data, report.bounds):
            bounds.add_row(*(_cell(line[key], fmt) for _, key, fmt in BOUND_COLUMNS))
        parts.append(bounds)
    return Group(*parts)


def markdown(report: Report) -> str:
    """The header and the table as Markdown, for results/ and the README."""
    lines = [f"- {line}" for line in header_lines(report)] + [""]
    lines.append("| " + " | ".join(title for title, _, _ in COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for line in map(record_data, report.summary):
        lines.append("| " + " | ".join(_cell(line[key], fmt) for _, key, fmt in COLUMNS) + " |")
    return "\n".join(lines + bound_lines(report) + identity_lines(report)) + "\n"


def bound_lines(report: Report) -> list[str]:
    """Under the table, the lookup bound of each suite, where it was found."""
    if not report.bounds:
        return []
    lines = ["", bound_title(report.bounds[0].depth), ""]
    lines.append("| " + " | ".join(title for title, _, _ in BOUND_COLUMNS) + " |")
    lines.append("|" + "---|" * len(BOUND_COLUMNS))
    for line in map(bound_data, report.bounds):
        lines.append("| " + " | ".join(_cell(line[k], f) for _, k, f in BOUND_COLUMNS) + " |")
    return lines


def identity_lines(report: Report) -> list[str]:
    """Under the table, each greedy output that is not the target alone's: where it parts."""
    parted = [r for r in report.results if r.first_difference is not None]
    if not parted:
        return []
    lines = ["", "Greedy outputs that differ from the target alone's (none's: mlx-lm plain's):", ""]
    for r in parted:
        length = max(map(len, r.token_ids))
        lines.append(
            f"- {r.row.name} on {r.suite}/{r.prompt_id}: from token {r.first_difference}, "
            f"{r.differing} of {length} tokens differ"
        )
    return lines


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return fmt.format(value)


def to_json(report: Report) -> str:
    return json.dumps(as_data(report), indent=1) + "\n"


def to_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for line in map(record_data, report.summary):
        writer.writerow({key: "" if line[key] is None else line[key] for key in CSV_FIELDS})
    return out.getvalue()


def require_matplotlib(option: str = "--plot") -> None:
    """Fail before any work when a plot is asked for and matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"{option} needs matplotlib: pip install 'specmlx[plot]'") from None


def check_writable(path: Path) -> None:
    """Fail before any work when an output can't be written."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"cannot write {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or path.is_dir():
        raise UsageError(f"cannot write {path}")


def plot_png(report: Report) -> bytes:
    """Speedup over the target alone and fitted α, per row and suite, a column per T."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temperatures = report.config.temperatures
    fig, axes = plt.subplots(
        2, len(temperatures), figsize=(6 * len(temperatures), 7), squeeze=False
    )
    for col, temperature in enumerate(temperatures):
        lines = [s for s in report.summary if s.temperature == temperature]
        suites = list(dict.fromkeys(s.suite for s in lines))
        rows = [r for r in dict.fromkeys(s.row for s in lines) if r != NONE]
        width = 0.8 / max(len(rows), 1)
        # α, not the acceptance column: it is defined alike for every row, mlx-lm included.
        for metric, ax in zip(("speedup_vs_none", "alpha"), axes[:, col], strict=True):
            for i, row in enumerate(rows):
                values = {s.suite: getattr(s, metric) for s in lines if s.row == row}
                xs = [j + i * width for j in range(len(suites))]
                ax.bar(xs, [values.get(s) or 0 for s in suites], width, label=row.name)
            ax.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(suites))], suites)
            title = "speedup vs none" if metric == "speedup_vs_none" else "α (fitted acceptance)"
            ax.set_title(f"{title}, T={temperature:g}")
            if metric == "speedup_vs_none":
                ax.axhline(1.0, color="gray", linewidth=0.8)
            else:
                ax.set_ylim(0, 1)
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out.getvalue()
