"""Prompts the target writes itself (Magpie, Xu et al. 2024), for diverse self-distillation.

An instruct model given its chat template up to where a user's message begins writes a
plausible user message: sampled many times, that is a set of prompts as varied as the turns
it was tuned on, where a fixed set of a few hundred is not. `magpie_prompts` samples them
in batches and keeps each distinct non-empty one; `cached_magpie_prompts` keeps them in a
file of the data folder, so a resumed run reads the same prompts rather than drawing again.

Another instruct model may write them (`MagpieDraws.writer`): a small coder target writes
few usable chat turns, a small chat model many, and the target answers them either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from specmlx.api.models import Models
from specmlx.errors import UsageError
from specmlx.progress import progress_bar
from specmlx.training.data import kept_prompts

_MARK = "\x00specmlx-user-turn\x00"


@dataclass(frozen=True)
class MagpieDraws:
    """`count` Magpie draws, written by `writer` (a model reference) or by the target."""

    count: int
    writer: str | None = None

    @classmethod
    def parse(cls, text: str) -> MagpieDraws:
        """`N` (the target writes) or `N@MODEL` (MODEL, another instruct model, writes)."""
        count, _, writer = text.partition("@")
        if not count.strip().isdigit() or (_ and not writer.strip()):
            raise UsageError(f"--magpie takes N or N@MODEL, got {text!r}")
        return cls(int(count), writer.strip() or None)

    def file_name(self, seed: int) -> str:
        """The data folder's file of these draws' prompts: the writer's name in it, made
        safe for a file name (a model's folder or file by its last part)."""
        name = f"magpie-{self.count}-seed{seed}"
        if self.writer is not None:
            last = Path(self.writer.rstrip("/")).name or self.writer
            name += "-" + re.sub(r"[^A-Za-z0-9._-]+", "_", last)
        return name + ".jsonl"

    def record(self) -> int | dict[str, Any]:
        """As the heads' config records where their data came from: the writer as given (a
        registry name), or by its folder's name, never this machine's full path."""
        if self.writer is None:
            return self.count
        path = Path(self.writer)
        return {"count": self.count, "writer": path.name if path.is_absolute() else self.writer}


def user_prefix(tokenizer: Any) -> list[int]:
    """Token ids of the chat template up to where a user's message starts (the system turn
    the template adds by default included). # (n,)"""
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError("Magpie prompts need a chat template; this target has none")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _MARK}], add_generation_prompt=False, tokenize=False
    )
    prefix = text[: text.index(_MARK)]
    return tokenizer.encode(prefix, add_special_tokens=False)


def magpie_prompts(
    models: Models,
    count: int,
    max_tokens: int = 64,
    seed: int = 0,
    batch_size: int = 32,
    temperature: float = 1.0,
    progress: bool = True,
) -> list[str]:
    """Up to `count` distinct user messages the target writes from its template's user
    prefix, sampled at `temperature` (top-p 1.0, as Magpie does); those cut off at
    `max_tokens` or empty are dropped. The same for the same seed."""
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    if count < 1 or batch_size < 1:
        raise UsageError(f"need at least one Magpie prompt and batch, got {count}, {batch_size}")
    prefix = user_prefix(models.tokenizer)
    sampler = make_sampler(temperature, 1.0)
    prompts: dict[str, None] = {}
    n_batches = -(-count // batch_size)
    with progress_bar(progress, "writing prompts", n_batches) as bar:
        for b in range(n_batches):
            mx.random.seed(seed * 100_003 + b)
            rows = min(batch_size, count - b * batch_size)
            answers = batch_generate(
                models.target,
                models.tokenizer,
                [prefix] * rows,
                max_tokens=max_tokens,
                return_token_ids=True,
                sampler=sampler,
            ).token_ids
            for ids in answers:
                text = models.tokenizer.decode(ids).strip()
                if len(ids) < max_tokens and text:  # ended its turn, and said something
                    prompts.setdefault(text)
            bar.advance(f"{len(prompts)} prompts")
    return list(prompts)


def cached_magpie_prompts(
    models: Models,
    folder: Path,
    count: int,
    seed: int = 0,
    writer: str | None = None,
    **options: Any,
) -> list[str]:
    """`magpie_prompts` of `models`' target, or of `writer` (loaded only when its prompts
    are not kept yet), kept in `folder` (written whole or not at all) and read back from
    there on the next run."""
    draws = MagpieDraws(count, writer)

    def draw() -> list[str]:
        if writer is None:
            return magpie_prompts(models, count, seed=seed, **options)
        from specmlx.api.load import load

        return magpie_prompts(load(writer, default_draft=False), count, seed=seed, **options)

    return kept_prompts(folder / draws.file_name(seed), draw)
