"""The configuration types of the API: what is loaded (`Models`) and how to generate with it
(`GenerationConfig`).

They sit in a module of their own so that everything above them (the methods table, the
session, the server, the bench) can name them without importing how they are used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specmlx.api.methods import MethodOptions, method, owner_of
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import UsageError

if TYPE_CHECKING:
    import mlx.nn as nn

    from specmlx.engine.policy import LearnedCosts


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate.

    `method=None` drafts with the draft model when one is loaded, else with the heads when
    some are loaded, else decodes plainly.
    `options` are the method's own settings (`specmlx.api.methods`: `NgramOptions(min_n=2)`,
    `LookaheadOptions(window=7)`, `DraftOptions(p_min=0.5)`); None takes its defaults, and
    options given without a method name the method they belong to.
    """

    method: str | None = None
    options: MethodOptions | None = None
    k: int | None = None  # draft length; None chooses it per step (adaptive, `-k auto`)
    max_k: int = 16  # adaptive k: the longest draft it may choose
    max_tokens: int = 256
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = None
    chat_template: bool = True

    def __post_init__(self) -> None:
        if self.method is not None:
            method(self.method)  # a known name, or a one-line error
        if self.options is not None:
            owner = owner_of(self.options)
            if self.method is not None and owner.name != self.method:
                raise UsageError(
                    f"{type(self.options).__name__} are options of --method {owner.name}, "
                    f"not of --method {self.method}"
                )
        if self.k is not None and self.k < 1:
            raise UsageError(f"k must be at least 1 (or auto), got {self.k}")
        if self.max_k < 1:
            raise UsageError(f"max-k must be at least 1, got {self.max_k}")
        if self.max_tokens < 1:
            raise UsageError(f"max-tokens must be at least 1, got {self.max_tokens}")


# Whose measured costs: drafter kind, tree size, sampler, calibrated target and draft call.
CostKey = tuple[str, int | None, SamplingConfig, float, float | None]


@dataclass
class Models:
    """A loaded target, its tokenizer, and an optional draft model."""

    target: nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper
    draft: nn.Module | None = None
    target_path: Path | None = None
    draft_path: Path | None = None
    # Heads trained for this target (`specmlx.heads`), by the method that drafts with them.
    heads: dict[str, Any] = field(default_factory=dict)
    # What adaptive k measured of each drafter's costs on this machine, for the next response.
    learned_costs: dict[CostKey, LearnedCosts] = field(default_factory=dict, repr=False)

    @property
    def vocab_size(self) -> int:
        return vocab_rows(self.target)

    @property
    def context_length(self) -> int | None:
        args = getattr(self.target, "args", None)
        return getattr(args, "max_position_embeddings", None)


def vocab_rows(model: nn.Module) -> int:
    """The rows of a model's output layer: its vocabulary, padding included."""
    args = getattr(model, "args", None)
    return int(args.vocab_size)
