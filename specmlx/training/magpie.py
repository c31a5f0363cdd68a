"""Prompts the target writes itself (Magpie, Xu et al. 2024), for diverse self-distillation.

An instruct model given its chat template up to where a user's message begins writes a
plausible user message: sampled many times, that is a set of prompts as varied as the turns
it was tuned on, where a fixed set of a few hundred is not. `magpie_prompts` samples them
in batches and keeps each distinct non-empty one; `cached_magpie_prompts` keeps them in a
file of the data folder, so a resumed run reads the same prompts rather than drawing again.

Another instruct model may write them (`MagpieDraws.writer`): a small coder target writes
few usable chat turns, a small chat model many, and the target answers them either way.

Question draws (`MagpieDraws.questions`, `--questions`) begin each user turn with one of
`OPENINGS` ("What is the difference between", "Why does", "Explain", ...) and let the writer
go on from there. A small model's free draws come out alike ("I'm planning to launch a
business...", plans and lists), and the answers to them are easier to foresee than the
answers to the questions people ask a chat model: SmolLM2-135M's Medusa heads guessed the
target's answers to held-out free draws 28% of the time and to the bench's chat questions
16%. An opening steers a draw toward such a question and leaves its subject to the writer.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from specmlx.api.models import Models
from specmlx.errors import UsageError
from specmlx.progress import progress_bar
from specmlx.training.data import kept_prompts

_MARK = "\x00specmlx-user-turn\x00"

# How the user turns of question draws begin: the common forms of a question or request put
# to a chat model (explain, compare, why, how, advise, recommend, describe).
OPENINGS = (
    "What is",
    "What are",
    "What is the difference between",
    "What causes",
    "What happens when",
    "What would happen if",
    "What should I know about",
    "Why do",
    "Why does",
    "Why is",
    "How does",
    "How do",
    "How do I",
    "How can I",
    "How should I",
    "Explain",
    "Can you explain",
    "Explain in simple terms",
    "Describe",
    "Tell me about",
    "Help me understand",
    "When should I",
    "Should I",
    "Is it true that",
    "Which is better,",
    "Compare",
    "What are the pros and cons of",
    "Give me tips for",
    "Give me advice on",
    "What's a good way to",
    "I want to",
    "I'm trying to",
    "Recommend",
    "Suggest",
    "Who was",
    "Where does",
    "Summarize",
    "In a few sentences,",
)


@dataclass(frozen=True)
class MagpieDraws:
    """`count` Magpie draws, written by `writer` (a model reference) or by the target."""

    count: int
    writer: str | None = None
    questions: bool = False  # each user turn begins with one of OPENINGS

    @classmethod
    def parse(cls, text: str, questions: bool = False) -> MagpieDraws:
        """`N` (the target writes) or `N@MODEL` (MODEL, another instruct model, writes)."""
        count, _, writer = text.partition("@")
        if not count.strip().isdigit() or (_ and not writer.strip()):
            option = "--questions" if questions else "--magpie"
            raise UsageError(f"{option} takes N or N@MODEL, got {text!r}")
        return cls(int(count), writer.strip() or None, questions)

    def file_name(self, seed: int) -> str:
        """The data folder's file of these draws' prompts: the writer's name in it, made
        safe for a file name (a model's folder or file by its last part)."""
        kind = "questions-" if self.questions else ""
        name = f"magpie-{kind}{self.count}-seed{seed}"
        if self.writer is not None:
            last = Path(self.writer.rstrip("/")).name or self.writer
            name += "-" + re.sub(r"[^A-Za-z0-9._-]+", "_", last)
        return name + ".jsonl"

    def record(self) -> int | dict[str, Any]:
        """As the heads' config records where their data came from: the writer as given (a
        registry name), or by its folder's name, never this machine's full path."""
        if self.writer is None and not self.questions:
            return self.count
        record: dict[str, Any] = {"count": self.count}
        if self.writer is not None:
            path = Path(self.writer)
            record["writer"] = path.name if path.is_absolute() else self.writer
        if self.questions:
            record["questions"] = True
        return record


def user_prefix(tokenizer: Any, opening: str = "") -> list[int]:
    """Token ids of the chat template up to where a user's message starts (the system turn
    the template adds by default included), and the message's `opening` words after it,
    encoded together. # (n,)"""
    return tokenizer.encode(_user_prefix_text(tokenizer) + opening, add_special_tokens=False)


def _user_prefix_text(tokenizer: Any) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError("Magpie prompts need a chat template; this target has none")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _MARK}], add_generation_prompt=False, tokenize=False
    )
    return text[: text.index(_MARK)]


def magpie_prompts(
    models: Models,
    count: int,
    max_tokens: int = 64,
    seed: int = 0,
    batch_size: int = 32,
    temperature: float = 1.0,
    progress: bool = True,
    openings: Sequence[str] = (),
) -> list[str]:
    """Up to `count` distinct user messages the target writes from its template's user
    prefix, sampled at `temperature` (top-p 1.0, as Magpie does); those cut off at
    `max_tokens` or empty are dropped. With `openings`, each message begins with one of them
    drawn at random, and the target writes on from it. The same for the same seed."""
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    if count < 1 or batch_size < 1:
        raise UsageError(f"need at least one Magpie prompt and batch, got {count}, {batch_size}")
    tokenizer = models.tokenizer
    prefix_text = _user_prefix_text(tokenizer)  # the template applied once, not per draw
    rows_of = {
        o: tokenizer.encode(prefix_text + o, add_special_tokens=False) for o in ("", *openings)
    }
    draws = random.Random(seed)
    sampler = make_sampler(temperature, 1.0)
    prompts: dict[str, None] = {}
    n_batches = -(-count // batch_size)
    with progress_bar(progress, "writing prompts", n_batches) as bar:
        for b in range(n_batches):
            mx.random.seed(seed * 100_003 + b)
            rows = min(batch_size, count - b * batch_size)
            begun = [draws.choice(openings) for _ in range(rows)] if openings else [""] * rows
            answers = batch_generate(
                models.target,
                models.tokenizer,
                [rows_of[o] for o in begun],
                max_tokens=max_tokens,
                return_token_ids=True,
                sampler=sampler,
            ).token_ids
            for opening, ids in zip(begun, answers, strict=True):
                said = _continuation(tokenizer, opening, ids)
                text = (opening + said).strip()
                if len(ids) < max_tokens and said.strip():  # ended its turn, said something
                    prompts.setdefault(text)
            bar.advance(f"{len(prompts)} prompts")
    return list(prompts)


def _continuation(tokenizer: Any, opening: str, ids: list[int]) -> str:
    """The text of `ids`, written after `opening`: decoded behind it, as a tokenizer that
    drops a leading space from a text's first token would otherwise glue it on."""
    if not opening:
        return tokenizer.decode(ids)
    begun = tokenizer.encode(opening, add_special_tokens=False)
    return tokenizer.decode(begun + list(ids))[len(tokenizer.decode(begun)) :]


def cached_magpie_prompts(
    models: Models,
    folder: Path,
    count: int,
    seed: int = 0,
    writer: str | None = None,
    questions: bool = False,
    **options: Any,
) -> list[str]:
    """`magpie_prompts` of `models`' target, or of `writer` (loaded only when its prompts
    are not kept yet), begun with `OPENINGS` if `questions`, kept in `folder` (written whole
    or not at all) and read back from there on the next run."""
    draws = MagpieDraws(count, writer, questions)
    openings = OPENINGS if questions else ()

    def draw() -> list[str]:
        model = models
        if writer is not None:
            from specmlx.api.load import load

            model = load(writer, default_draft=False)
        return magpie_prompts(model, count, seed=seed, openings=openings, **options)

    return kept_prompts(folder / draws.file_name(seed), draw)
