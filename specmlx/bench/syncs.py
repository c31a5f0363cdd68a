"""Count host syncs: every point where the host waits for MLX to compute an array.

MLX is lazy: nothing runs until the host asks for a value (`item`, `tolist`, `int(...)`,
`bool(...)`) or calls `mx.eval`. Each such point stalls the host until the
device has caught up, so the loop aims at one per step. `counting_syncs` patches those entry
points for the duration of a `with` block and counts the calls that reach them; the bench's
`--overhead` mode and the tests read the count. `mx.async_eval` starts work without waiting
and is not a sync. (numpy's buffer protocol is not counted: nothing on the loop's path uses
it.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

# Methods of mx.array that hand a value to the host.
_ARRAY_METHODS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")


@dataclass
class SyncCount:
    """Host syncs seen so far inside a `counting_syncs` block."""

    count: int = 0


def _counted(original: Callable[..., Any], counter: SyncCount) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counter.count += 1
        return original(*args, **kwargs)

    return wrapper


@contextmanager
def counting_syncs() -> Iterator[SyncCount]:
    """Count every host sync until the block ends (not reentrant, not thread-safe)."""
    counter = SyncCount()
    originals: dict[str, Any] = {}
    for name in _ARRAY_METHODS:
        if hasattr(mx.array, name):
            originals[name] = getattr(mx.array, name)
            setattr(mx.array, name, _counted(originals[name], counter))
    original_eval = mx.eval
    mx.eval = _counted(original_eval, counter)
    try:
        yield counter
    finally:
        mx.eval = original_eval
        for name, method in originals.items():
            setattr(mx.array, name, method)
