"""The drafting methods, stated once: name, help, options, and how to build the drafter.

Everything that lists or checks methods reads `METHODS`: drafter construction, the CLI's
help text, the bench's rows, the "needs a draft model" check. Each method has a frozen
options type with typed defaults (`NgramOptions`, `LookaheadOptions`, ...); a generation's
`GenerationConfig.options` holds the options of the method it uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from specmlx.errors import UsageError

if TYPE_CHECKING:
    from specmlx.api import Models
    from specmlx.drafters.base import Drafter
    from specmlx.sampling import SamplingConfig


@dataclass(frozen=True)
class NoOptions:
    """A method without settings of its own."""


@dataclass(frozen=True)
class DraftOptions:
    """The draft model. `p_min`: end a draft after a token the draft model gives less
    probability than this (llama.cpp's `--draft-p-min`); None lets `-k auto` decide from
    the costs, and drafts all k at a fixed k."""

    p_min: float | None = None

    def __post_init__(self) -> None:
        if self.p_min is not None and not 0 <= self.p_min <= 1:
            raise UsageError(f"p-min must be between 0 and 1, got {self.p_min}")


@dataclass(frozen=True)
class NgramOptions:
    """Prompt lookup: the context suffixes looked up, `min_n` to `max_n` tokens long."""

    min_n: int = 1
    max_n: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise UsageError(f"need 1 <= ngram-min <= ngram-max, got {self.min_n} and {self.max_n}")


@dataclass(frozen=True)
class LookaheadOptions:
    """Lookahead decoding: Jacobi window W, n-gram size N, candidates G per step."""

    window: int = 5
    ngram: int = 4
    guesses: int = 5

    def __post_init__(self) -> None:
        if self.window < 1 or self.ngram < 2 or self.guesses < 0:
            raise UsageError("lookahead needs window >= 1, ngram-size >= 2 and guesses >= 0")


MethodOptions = NoOptions | DraftOptions | NgramOptions | LookaheadOptions
Builder = Callable[["Models", Any, "SamplingConfig"], "Drafter | None"]


@dataclass(frozen=True)
class Method:
    name: str
    help: str
    options: type  # its options dataclass
    needs_draft_model: bool
    build: Builder

    def settings(self, options: Any) -> dict[str, Any]:
        """The options as plain data, for reports."""
        return {f.name: getattr(options, f.name) for f in fields(options)}


def _none(models: Models, options: NoOptions, sampling: SamplingConfig) -> None:
    return None


def _draft(models: Models, options: DraftOptions, sampling: SamplingConfig) -> Drafter:
    from specmlx.drafters.draft_model import DraftModelDrafter

    if models.draft is None:
        raise UsageError("--method draft needs a draft model (--draft)")
    return DraftModelDrafter(models.draft, sampling, models.vocab_size)


def _ngram(models: Models, options: NgramOptions, sampling: SamplingConfig) -> Drafter:
    from specmlx.drafters.ngram import NgramDrafter

    return NgramDrafter(options.min_n, options.max_n)


def _lookahead(models: Models, options: LookaheadOptions, sampling: SamplingConfig) -> Drafter:
    from specmlx.drafters.lookahead import LookaheadDrafter

    return LookaheadDrafter(options.window, options.ngram, options.guesses)


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("none", "plain decoding, the baseline", NoOptions, False, _none),
        Method("draft", "a small draft model of the same tokenizer", DraftOptions, True, _draft),
        Method("ngram", "prompt lookup, no draft model", NgramOptions, False, _ngram),
        Method(
            "lookahead", "Lookahead decoding, no draft model", LookaheadOptions, False, _lookahead
        ),
    )
}


def method(name: str) -> Method:
    """The method called `name`, or a one-line error listing the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise UsageError(f"unknown method {name!r}; choose from {', '.join(METHODS)}") from None


def methods_help() -> str:
    """One line for the CLI: every method and what it is."""
    return "; ".join(f"{m.name}: {m.help}" for m in METHODS.values())
