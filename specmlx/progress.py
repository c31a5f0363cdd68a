"""Progress of long work (training, caching features, benchmarks) on stderr.

On a terminal: a transient Rich bar with a count, the time taken and left, and a free text
field. Anywhere else (a log file, CI), where a live bar would print nothing: a plain line at
most every LOG_EVERY seconds, and one at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LOG_EVERY = 60.0  # seconds between progress lines when stderr is not a terminal


class _Bar:
    def __init__(self, bar: Any, task: Any):
        self._bar, self._task = bar, task

    def advance(self, info: str = "") -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=info)


class _LogBar(_Bar):
    """Progress for a stderr that is not a terminal (a log file, CI): a plain line at most
    every `every` seconds, and one at the end, where a live bar would print nothing."""

    def __init__(self, console: Any, description: str, total: int, done: int, every: float):
        super().__init__(None, None)
        self._console, self._description = console, description
        self._total, self._done, self._info = total, done, ""
        self._every = every
        self._start = self._last = time.monotonic()

    def advance(self, info: str = "") -> None:
        self._done, self._info = self._done + 1, info
        if time.monotonic() - self._last >= self._every:
            self.log()

    def log(self) -> None:
        self._last = time.monotonic()
        elapsed = int(self._last - self._start)
        info = f"  {self._info}" if self._info else ""
        self._console.print(
            f"{self._description}: {self._done}/{self._total}, "
            f"{elapsed // 60}:{elapsed % 60:02d} elapsed{info}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


@contextmanager
def progress_bar(enabled: bool, description: str, total: int, completed: int = 0) -> Iterator[_Bar]:
    """A transient bar on stderr, with a free text field (`advance(info)`); on a stderr that
    is not a terminal, a line every LOG_EVERY seconds instead."""
    if not enabled:
        yield _Bar(None, None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    # Rich calls a console a terminal when FORCE_COLOR is set (as CI often does): ask the OS.
    if not sys.stderr.isatty():
        log = _LogBar(console, description, total, completed, LOG_EVERY)
        try:
            yield log
        finally:
            log.log()  # how far it got, also when cut short
        return
    columns = (
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        yield _Bar(bar, bar.add_task(description, total=total, completed=completed, info=""))


def note(enabled: bool, text: str) -> None:
    """One plain line on stderr beside the progress (what a long run kept or skipped)."""
    if enabled:
        from rich.console import Console

        Console(stderr=True).print(text, markup=False, highlight=False, soft_wrap=True)
