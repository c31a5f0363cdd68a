"""A conversation whose caches live across turns: each turn prefills only what is new."""

from __future__ import annotations

from collections.abc import Iterator

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import (
    GenerationEvent,
    encode_prompt,
    make_drafter,
    make_policy,
    stream_ids,
)
from specmlx.api.models import Models
from specmlx.engine.cache import Sequence
from specmlx.engine.stats import Stats


class ChatSession:
    """A conversation whose caches live across turns: each turn prefills only what is new."""

    def __init__(self, models: Models, config: GenerationConfig):
        self.models = models
        self.config = config
        self.messages: list[dict[str, str]] = []
        self.target = Sequence(models.target)
        self.drafter = make_drafter(models, config)
        self.policy = make_policy(models, config, self.drafter)
        self.last_stats: Stats | None = None
        self.total = Stats(responses=0)  # no turns yet

    def reset(self) -> None:
        """Forget the conversation (the caches keep what the next turn can reuse)."""
        self.messages = []

    def send(self, text: str) -> Iterator[GenerationEvent]:
        """Stream the reply to one user turn; the reply so far is kept if stopped early."""
        self.messages.append({"role": "user", "content": text})
        prompt_ids = encode_prompt(self.models, self.messages, True)
        reply: list[str] = []
        turn: Stats | None = None  # this turn's; last_stats may still be the previous turn's
        try:
            for event in stream_ids(
                self.models, self.target, self.drafter, prompt_ids, self.config, self.policy
            ):
                reply.append(event.text)
                self.last_stats = turn = event.stats
                yield event
        finally:
            self.messages.append({"role": "assistant", "content": "".join(reply)})
            if turn is not None:
                self.total = self.total.merge(turn)
