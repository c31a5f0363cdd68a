"""ChatSession: caches live across turns, and a reply stopped early leaves them usable."""

from __future__ import annotations

import specmlx
from specmlx.api import GenerationConfig, encode_prompt
from specmlx.chat import ChatSession

CONFIG = GenerationConfig(method="draft", k=3, max_tokens=12)


def reply(session: ChatSession, text: str) -> list[int]:
    return [t for event in session.send(text) for t in event.token_ids]


def test_second_turn_prefills_only_the_new_turn(tiny_dirs):
    models = specmlx.load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)
    session = ChatSession(models, CONFIG)
    first_prompt = encode_prompt(models, [{"role": "user", "content": "hello there"}], True)
    reply(session, "hello there")
    fed = []
    original = session.target.model

    def counting(inputs, cache=None):
        fed.append(inputs.shape[1])
        return original(inputs, cache=cache)

    session.target.model = counting
    reply(session, "and again")
    prompt = encode_prompt(models, session.messages[:-1], True)
    # The first turn's prompt stays cached: only the reply (as the template re-renders it)
    # and the new turn are prefilled.
    assert fed[0] <= len(prompt) - len(first_prompt)


def test_stopped_reply_then_next_turn_matches_a_fresh_session(tiny_dirs):
    models = specmlx.load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)
    session = ChatSession(models, CONFIG)
    events = session.send("tell me a story")
    next(events)
    events.close()  # what Ctrl-C does in `specmlx chat`
    partial = session.messages[-1]
    assert partial["role"] == "assistant"
    second = reply(session, "go on")

    fresh = ChatSession(models, CONFIG)
    fresh.messages = [dict(m) for m in session.messages[:-2]]
    assert reply(fresh, "go on") == second


def test_reset_forgets_the_conversation(tiny_dirs):
    models = specmlx.load(str(tiny_dirs["llama"]), progress=False)
    session = ChatSession(models, GenerationConfig(max_tokens=6))
    first = reply(session, "hi")
    reply(session, "more")
    session.reset()
    assert session.messages == []
    assert reply(session, "hi") == first
