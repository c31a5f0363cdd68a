"""Each drafting method's options: frozen dataclasses with typed defaults, checked when made
(a bad value is a one-line UsageError). `GenerationConfig.options` holds the options of the
method a generation uses; `specmlx.api.methods` says which method takes which."""

from __future__ import annotations

from dataclasses import dataclass

from specmlx.errors import UsageError


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


@dataclass(frozen=True)
class MedusaOptions:
    """Medusa heads (`--heads`): trees of the most probable paths through each head's top
    `width` tokens; `tree_size` None keeps as many as pay for their verification (from the
    calibrated v(n) and the heads' own cost, timed when built), a number keeps that many
    (root included)."""

    tree_size: int | None = None
    width: int = 8

    def __post_init__(self) -> None:
        if (self.tree_size is not None and self.tree_size < 2) or self.width < 1:
            raise UsageError("medusa needs tree-size >= 2 and width >= 1")


@dataclass(frozen=True)
class EagleOptions:
    """EAGLE heads (`--heads`): a dynamic tree grown `width` nodes wide for up to `depth`
    levels; `tree_size` None keeps as many nodes as pay for their verification (from the
    calibrated v(n) and the proposal's own cost, timed when built), a number keeps that many
    (root included)."""

    tree_size: int | None = None
    depth: int = 6
    width: int = 8

    def __post_init__(self) -> None:
        if (self.tree_size is not None and self.tree_size < 2) or self.depth < 1 or self.width < 1:
            raise UsageError("eagle needs tree-size >= 2, depth >= 1 and width >= 1")


@dataclass(frozen=True)
class SuffixOptions:
    """Suffix decoding: drafts what followed the longest earlier match of the context, in
    the prompt, the answer so far and earlier answers (`memory` tokens of them, per loaded
    target, the oldest dropped first; `cache`: a file that keeps them across runs). A draft
    holds at most `factor` tokens per matched token; a branch fewer than `min_prob` of its
    parent's occurrences took is dropped; `tree_size` None keeps as many nodes as pay (from
    the calibrated v(n)), a number at most that many (root included). With a fallback
    (`suffix+draft`, `suffix+heads`) a step drafts from the suffix where it expects at least
    `min_score` tokens kept, else from the fallback."""

    tree_size: int | None = None
    factor: float = 2.0
    min_prob: float = 0.1
    memory: int = 100_000
    cache: str | None = None
    min_score: float = 2.0

    def __post_init__(self) -> None:
        if self.tree_size is not None and self.tree_size < 2:
            raise UsageError(f"suffix needs tree-size >= 2, got {self.tree_size}")
        if self.factor <= 0 or not 0 <= self.min_prob <= 1 or self.min_score < 0:
            raise UsageError("suffix needs factor > 0, min-prob in [0, 1] and min-score >= 0")
        if self.memory < 1:
            raise UsageError(f"suffix-memory must be at least 1 token, got {self.memory}")


@dataclass(frozen=True)
class MtpOptions:
    """Multi-token prediction from the target's own checkpoint (`mtp.*` tensors). `hidden`:
    the target's hidden state the MTP layer reads, and the layer's own that it reads back
    when drafting past one token: "post-norm", after the final norm, as the model's authors
    and vLLM feed it; "pre-norm", before it, as mlx-lm#990's branch does."""

    hidden: str = "post-norm"

    def __post_init__(self) -> None:
        if self.hidden not in ("post-norm", "pre-norm"):
            raise UsageError(f"mtp-hidden must be post-norm or pre-norm, got {self.hidden!r}")


MethodOptions = (
    NoOptions
    | DraftOptions
    | NgramOptions
    | LookaheadOptions
    | MedusaOptions
    | EagleOptions
    | SuffixOptions
    | MtpOptions
)
