"""How to generate: `GenerationConfig`, in a module of its own (what is loaded is
`specmlx.api.models.Models`), so that the session, the server, the bench and the CLI can
name it without importing how it is used; and which method a config runs on loaded models
(`method_of`, `options_of`, `method_settings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specmlx.api.methods import METHODS, Method, MethodOptions, method, owner_of
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import UsageError

if TYPE_CHECKING:
    from specmlx.api.models import Models


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate.

    `method=None` drafts with the draft model when one is loaded, else with the heads when
    some are loaded, else with the target's own MTP layer when its checkpoint has one, else
    decodes plainly.
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
            if self.method is not None and method(self.method).options is not owner.options:
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


def method_of(models: Models, config: GenerationConfig) -> Method:
    """The method a config asks for: named, implied by its options, or by default the draft
    model when one is loaded, else the heads when some are, else the target's MTP layer
    when its checkpoint has one."""
    if config.method is not None:
        return METHODS[config.method]
    if config.options is not None:
        return owner_of(config.options)
    if models.draft is None and models.heads:
        return METHODS[next(iter(models.heads))]
    if models.draft is None and models.has_mtp:
        return METHODS["mtp"]
    return METHODS["draft" if models.draft is not None else "none"]


def options_of(models: Models, config: GenerationConfig) -> MethodOptions:
    """The options the method runs with: the config's, or the method's defaults."""
    return config.options if config.options is not None else method_of(models, config).options()


def method_settings(models: Models, config: GenerationConfig) -> dict[str, Any]:
    """What shapes a method's drafts, for reports: k, and the method's options."""
    used = method_of(models, config)
    if used.name == "none":
        return {}
    settings: dict[str, Any] = {"k": "auto" if config.k is None else config.k}
    settings.update(used.settings(options_of(models, config)))
    return {key: value for key, value in settings.items() if value is not None}
