"""Draft heads: small modules trained on a target's own hidden states (Medusa, EAGLE).

They draft from the features the target computes anyway, so they need no second model;
each is bound to the one target it was trained on. `load_heads` reads our folders and the
published Medusa / EAGLE / EAGLE-3 layouts, `save_heads` writes ours.
"""

from specmlx.heads.base import HeadsConfig, load_heads, method_of_heads, save_heads

__all__ = ["HeadsConfig", "load_heads", "method_of_heads", "save_heads"]
