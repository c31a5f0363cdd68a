"""How to generate: `GenerationConfig`, in a module of its own (what is loaded is
`specmlx.api.models.Models`), so that the session, the server, the bench and the CLI can
name it without importing how it is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specmlx.api.methods import MethodOptions, method, owner_of
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import UsageError


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
