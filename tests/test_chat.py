"""ChatSession: caches live across turns, and a reply stopped early leaves them usable."""

from __future__ import annotations

from dataclasses import replace
from itertools import zip_longest

import pytest

import specmlx
from specmlx.api.chat import ChatSession
from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.engine.stats import Stats

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


def test_session_total_is_the_sum_of_its_turns(tiny_dirs):
    models = specmlx.load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)
    session = ChatSession(models, CONFIG)
    turns = []
    for text in ("hello there", "and again"):
        reply(session, text)
        turns.append(session.last_stats)
    first, second = turns
    total = session.total
    assert total.responses == 2 and first.responses == second.responses == 1
    assert total.tokens == first.tokens + second.tokens
    assert total.prompt_tokens == first.prompt_tokens + second.prompt_tokens
    assert total.target_calls == first.target_calls + second.target_calls
    assert total.drafted == first.drafted + second.drafted > 0
    assert total.accepted == first.accepted + second.accepted
    for field in ("drafted_by_position", "accepted_by_position"):
        pairs = zip_longest(getattr(first, field), getattr(second, field), fillvalue=0)
        sums = [x + y for x, y in pairs]
        assert list(getattr(total, field)) == sums, field
    assert total.time_to_first_token > 0
    mean = (first.time_to_first_token + second.time_to_first_token) / 2
    assert total.time_to_first_token == pytest.approx(mean)
    assert total.peak_memory_gb == max(first.peak_memory_gb, second.peak_memory_gb)


def test_a_turn_stopped_before_its_first_token_adds_nothing(tiny_dirs):
    models = specmlx.load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)
    session = ChatSession(models, CONFIG)
    reply(session, "hello there")
    after_one = session.total

    def interrupted(inputs, cache=None):
        raise KeyboardInterrupt  # Ctrl-C during the prefill: no event, no stats of its own

    session.target.model = interrupted
    with pytest.raises(KeyboardInterrupt):
        reply(session, "and again")
    assert session.total == after_one  # the first turn's stats are not counted twice


def test_merging_nothing_keeps_the_generation():
    one = Stats(tokens=5, time_to_first_token=0.25, drafted_by_position=(3, 1))
    one = replace(one, accepted_by_position=(2, 0))
    assert Stats(responses=0).merge(one) == one
    assert one.merge(Stats(responses=0)) == one
