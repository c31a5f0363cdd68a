"""The Python API: load a target (and a drafter) once, then generate or stream.

    import specmlx
    models = specmlx.load("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    result = specmlx.generate(models, "def quicksort(xs):", specmlx.GenerationConfig(k=4))
    print(result.text, result.stats.acceptance_rate)

`stream_generate` yields one `GenerationEvent` per target call, with the new text, the new
token ids and running statistics; each call generates through a `Session` of its own (a script
that sends many prompts to one pair keeps one `specmlx.api.session.Session`). `ChatSession`
keeps a conversation and its caches, so each turn prefills only what is new
(`specmlx.api.chat`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from specmlx.api.config import GenerationConfig
from specmlx.api.models import Models
from specmlx.api.session import GenerationEvent, Session
from specmlx.engine.stats import Stats
from specmlx.errors import UsageError


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: Stats
    finish: str | None


def encode_prompt(
    models: Models, prompt: str | list[dict[str, str]], chat_template: bool
) -> list[int]:
    """Token ids of a prompt: a string, or a list of chat messages."""
    tokenizer = models.tokenizer
    if isinstance(prompt, list) or (chat_template and tokenizer.chat_template):
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        ids = tokenizer.encode(prompt)
    if not ids:
        raise UsageError("the prompt is empty")
    limit = models.context_length
    if limit is not None and len(ids) >= limit:
        raise UsageError(f"the prompt has {len(ids)} tokens; the target's context holds {limit}")
    return ids


def stream_generate(
    models: Models, prompt: str | list[dict[str, str]], config: GenerationConfig | None = None
) -> Iterator[GenerationEvent]:
    """Stream the target's continuation of `prompt`, one event per target call."""
    config = config or GenerationConfig()
    prompt_ids = encode_prompt(models, prompt, config.chat_template)
    yield from Session(models, config).stream(prompt_ids)


def generate(
    models: Models, prompt: str | list[dict[str, str]], config: GenerationConfig | None = None
) -> GenerationResult:
    """The whole continuation of `prompt` with its statistics."""
    text, ids, stats, finish = [], [], Stats(), None
    for event in stream_generate(models, prompt, config):
        text.append(event.text)
        ids.extend(event.token_ids)
        stats, finish = event.stats, event.step.finish
    return GenerationResult("".join(text), ids, stats, finish)
