"""A conversation whose caches live across turns: each turn prefills only what is new."""

from __future__ import annotations

from collections.abc import Iterator

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.models import Models
from specmlx.api.session import GenerationEvent, Session
from specmlx.engine.cache import Sequence
from specmlx.engine.stats import Stats


class ChatSession:
    """A conversation over one generation `Session`: the messages so far, and the session's
    caches, which keep every earlier turn."""

    def __init__(self, models: Models, config: GenerationConfig):
        self.models = models
        self.config = config
        self.session = Session(models, config)
        self.messages: list[dict[str, str]] = []
        self.last_stats: Stats | None = None
        self.total = Stats(responses=0)  # no turns yet

    @property
    def target(self) -> Sequence:
        """The target's sequence, which holds the conversation so far."""
        return self.session.target

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
            for event in self.session.stream(prompt_ids):
                reply.append(event.text)
                self.last_stats = turn = event.stats
                yield event
        finally:
            self.messages.append({"role": "assistant", "content": "".join(reply)})
            if turn is not None:
                self.total = self.total.merge(turn)
