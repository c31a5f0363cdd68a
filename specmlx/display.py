"""Rich rendering: pure functions from stats and text to renderables, and the live view.

Nothing here computes anything: it formats what the API measured.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

if TYPE_CHECKING:
    from specmlx.api import Stats


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


def render(text: str, stats: Stats | None, method: str, note: str = "") -> Panel:
    """The chat reply panel: streaming text, live rates in the subtitle."""
    subtitle = Text(stats_line(stats, method) if stats is not None else "…")
    body: Text | Group = Text(text)
    if note:
        body = Group(Text(text), Text(note, style="dim italic"))
    return Panel(
        body, title="assistant", title_align="left", subtitle=subtitle, subtitle_align="right"
    )


@contextmanager
def live(console: Console) -> Iterator[Live]:
    """A Live region that refreshes a few times a second and stays on screen after."""
    with Live(console=console, refresh_per_second=8, transient=False) as view:
        yield view
