"""What is loaded: `Models`, a target with its tokenizer, an optional draft model and heads.

A module of its own, below everything that uses loaded models (the methods table builds
drafters from it, the session generates with it), so none of them import each other for it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specmlx.engine.anatomy import text_args, vocab_rows
from specmlx.engine.sampling import SamplingConfig

if TYPE_CHECKING:
    import mlx.nn as nn

    from specmlx.drafters.suffix_store import SuffixStore
    from specmlx.engine.policy import Experience, LearnedCosts


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
    # And what it saw of their drafts (acceptance, tree sizes, probing), under the same keys.
    experience: dict[CostKey, Experience] = field(default_factory=dict, repr=False)
    # A cost-sized tree drafter's proposal over a target call, timed once per loaded models
    # (by kind and tree shape), for every session built on them: what any proposal costs,
    # and what each level it grows adds.
    proposal_costs: dict[tuple[Any, ...], tuple[float, float]] = field(
        default_factory=dict, repr=False
    )
    # Earlier answers, for suffix decoding: made by the first session that drafts with it,
    # then shared by every session on these models (generate, chat, server, batch).
    suffix_store: SuffixStore | None = field(default=None, repr=False)
    # The MTP layer of the target's own checkpoint (`specmlx.heads.mtp`), read from its
    # files on first use (mlx-lm's load drops it).
    mtp_head: Any = field(default=None, repr=False)

    def mtp(self) -> Any:
        """The target's MTP layer (`MtpHead`), read once; a one-line error where the
        checkpoint has none, or has it in a shape the target's config does not fit."""
        if self.mtp_head is None:
            from specmlx.errors import UsageError
            from specmlx.heads.mtp import load_mtp

            if self.target_path is None:
                raise UsageError("--method mtp reads the target's checkpoint: load it from disk")
            self.mtp_head = load_mtp(self.target_path, self.target)
        return self.mtp_head

    @functools.cached_property
    def has_mtp(self) -> bool:
        """Whether the target's checkpoint holds an MTP layer `--method mtp` reads (from the
        headers of its files alone)."""
        from specmlx.heads.mtp import has_mtp

        return self.mtp_head is not None or has_mtp(self.target_path, self.target)

    def memory(self, budget: int, cache: str | None = None) -> SuffixStore:
        """The suffix memory of these models: `budget` tokens of earlier answers, read from
        and kept in the file `cache` when given (refused if made for another tokenizer)."""
        from specmlx.drafters.suffix_store import SuffixStore, load_store
        from specmlx.errors import UsageError

        path = None if cache is None else Path(cache).expanduser()
        store = self.suffix_store
        if store is not None:
            if store.path != path:
                raise UsageError(
                    f"these models keep their suffix memory in {store.path or 'memory only'}; "
                    "another --suffix-cache needs the models loaded again"
                )
            store.budget = budget
            return store
        if path is None:
            store = SuffixStore(budget, self.tokenizer_id)
        else:
            store = load_store(path, budget, self.tokenizer_id)
        self.suffix_store = store
        return store

    @functools.cached_property
    def tokenizer_id(self) -> str:
        """What names the tokenizer: a hash of its vocabulary and end tokens."""
        if self.tokenizer is None:
            return "none"
        from specmlx.heads.base import tokenizer_sha256

        return tokenizer_sha256(self.tokenizer)

    @property
    def vocab_size(self) -> int:
        return vocab_rows(self.target)

    @property
    def context_length(self) -> int | None:
        return getattr(text_args(self.target), "max_position_embeddings", None)
