"""Draft heads: small modules trained on a target's own hidden states (Medusa, EAGLE).

They draft from the features the target computes anyway, so they need no second model;
each is bound to the one target it was trained on. The kinds are listed once, in
`specmlx.heads.kinds`. `load_heads` reads our folders and the published Medusa / EAGLE /
EAGLE-3 layouts, `save_heads` writes ours. MLX is imported on first use of these names, so
the CLI's `train-heads` command (specmlx/cli/heads.py) keeps `specmlx --help` fast.

The heads floor sits below the drafters (which run these modules) and imports only the engine
and io; training them is the training floor's work, above the API.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HeadsConfig", "load_heads", "method_of_heads", "save_heads"]


def __getattr__(name: str) -> Any:
    if name in ("HeadsConfig", "method_of_heads"):
        from specmlx.heads import base

        return getattr(base, name)
    if name in ("load_heads", "save_heads"):
        from specmlx.heads import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
