"""Rich rendering: pure functions from stats, text and data to renderables, and the live view.

Nothing here computes anything or reads a file: it formats what the API measured and what
the commands looked up (the registry's models, a device's call costs).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.filesize import decimal
from rich.highlighter import ReprHighlighter
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from pathlib import Path

    from specmlx.engine.costs import CostProfile
    from specmlx.engine.stats import Stats
    from specmlx.io.registry import Registry


# What `Console.print` highlights a string with, by default.
_HIGHLIGHT = ReprHighlighter()

# Acceptance by draft position: the first few say how far drafts get; more would wrap the line.
POSITIONS_SHOWN = 6


def stats_line(stats: Stats, method: str) -> str:
    """The one-line summary printed after a generation (or over a chat session's turns).
    Time to first token and acceptance by position appear when the stats carry them."""
    parts = [
        f"{stats.tokens} tokens",
        f"{stats.tokens_per_sec:.1f} tok/s",
        f"{stats.target_calls} target calls",
        f"{stats.tokens_per_call:.2f} tok/call",
    ]
    if method != "none":
        parts.append(f"acceptance {stats.acceptance_rate:.0%} ({stats.accepted}/{stats.drafted})")
        by_position = stats.acceptance_by_position
        if by_position:
            shown = " ".join(f"{rate:.0%}" for rate in by_position[:POSITIONS_SHOWN])
            more = " …" if len(by_position) > POSITIONS_SHOWN else ""
            parts.append(f"by position {shown}{more}")
        if stats.plain_steps:
            parts.append(f"{stats.plain_steps} plain steps (speculation predicted to lose)")
    if stats.time_to_first_token:
        parts.append(f"ttft {stats.time_to_first_token * 1000:.0f} ms")
    parts.append(f"peak {stats.peak_memory_gb:.2f} GB")
    return f"[{method}] " + " · ".join(parts)


def render(text: str, stats: Stats | None, method: str, note: str = "") -> Group:
    """The chat reply panel (streaming text), the live rates under it: a line in the
    panel's border would be cut at the terminal's width, this one wraps instead."""
    body: Text | Group = Text(text)
    if note:
        body = Group(Text(text), Text(note, style="dim italic"))
    line = stats_line(stats, method) if stats is not None else "…"
    rates = Text(line, style="dim", justify="right")
    return Group(Panel(body, title="assistant", title_align="left"), rates)


@contextmanager
def live(console: Console) -> Iterator[Live]:
    """A Live region that refreshes a few times a second and stays on screen after."""
    with Live(console=console, refresh_per_second=8, transient=False) as view:
        yield view


def _printed(text: str, *, markup: bool = True, highlight: bool = True) -> Text:
    """`text` as `Console.print(text)` shows it: markup (unless off), emoji, highlighting
    (unless off); so a view made of these prints as the strings printed one by one did."""
    rich_text = Text.from_markup(text if markup else escape(text))
    if not highlight:
        return rich_text
    highlighted = _HIGHLIGHT(rich_text.plain)
    highlighted.copy_styles(rich_text)
    return highlighted


def models_view(registry: Registry, local_root: Path, local_bytes: dict[str, int]) -> Group:
    """`specmlx models`: the registry's models, then its pairs and their notes.
    `local_bytes` holds the size of each model fetched into `local_root`, by alias."""
    table = Table(title=f"Models (local copies in {local_root})", title_justify="left")
    table.add_column("alias", no_wrap=True)
    for column in ("arch", "params", "Hugging Face repo", "local", "GGUF source"):
        table.add_column(column, overflow="fold")
    for entry in registry.models.values():
        size = local_bytes.get(entry.alias)
        table.add_row(
            entry.alias,
            entry.architecture,
            entry.params,
            entry.hf_repo,
            "no" if size is None else f"yes, {decimal(size)}",
            f"{entry.gguf.quant}, {decimal(entry.gguf.size)}",
        )
    pairs = Table(title="Known pairs (draft speeds up target)", title_justify="left")
    for column in ("target", "draft", ""):
        pairs.add_column(column, overflow="fold")
    for pair in registry.pairs:
        pairs.add_row(pair.target, pair.draft, "default" if pair.default else "")
    notes = [f"{p.target} + {p.draft}: {p.note}" for p in registry.pairs if p.note]
    return Group(table, pairs, *(_printed(note, highlight=False) for note in notes))


def calibration_view(profile: CostProfile, fresh: bool, where: Path) -> Group:
    """`specmlx calibrate`: where the costs are kept, the one-token calls, and v(k)."""
    lines = [
        _printed(f"{'measured now' if fresh else 'cached'}: {where}", markup=False),
        _printed(f"one-token target call: {profile.target_call_seconds * 1000:.1f} ms"),
    ]
    if profile.draft_call_seconds is not None:
        draft_ms = profile.draft_call_seconds * 1000
        lines.append(_printed(f"one-token draft call: {draft_ms:.1f} ms (c = {profile.c:.3f})"))
    table = Table("k", "k-token target call / one-token call")
    for k_tokens, ratio in sorted(profile.v.items()):
        mark = " (interpolated)" if k_tokens in profile.interpolated else ""
        table.add_row(str(k_tokens), f"{ratio:.2f}{mark}")
    if profile.interpolated:
        table.caption = "interpolated: not timed, to keep within the time budget (--budget)"
    return Group(*lines, table)
