"""One generation session per loaded pair: its drafter serves every sampler, its caches carry
over, and the server's engine, chat and generate all run through it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

import specmlx
from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.session import Session
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import UsageError
from specmlx.server.engine import Done, Engine, Text

CONFIG = GenerationConfig(method="draft", k=3, max_tokens=12)
FIRST = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def models(tiny_dirs):
    return specmlx.load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)


def counting_draft_inputs(drafter) -> list[int]:
    """Record how many tokens each call of the draft model is fed."""
    fed: list[int] = []
    original = drafter.sequence.model

    def counting(inputs, cache=None):
        fed.append(inputs.shape[1])
        return original(inputs, cache=cache)

    drafter.sequence.model = counting
    return fed


async def _ask(engine: Engine, prompt_ids: list[int], config: GenerationConfig) -> str:
    job = engine.submit("test", prompt_ids, config)
    text = []
    async for message in job.messages():
        if isinstance(message, Text):
            text.append(message.text)
        assert not isinstance(message, Done) or message.finish in ("stop", "length")
    return "".join(text)


def test_server_requests_of_other_temperatures_reuse_the_drafter_and_its_cache(models):
    engine = Engine(models, CONFIG)
    engine.start()
    try:
        drafter = engine.session.drafter
        first_ids = encode_prompt(models, FIRST, True)
        greedy = replace(CONFIG, sampling=SamplingConfig())
        reply = asyncio.run(_ask(engine, first_ids, greedy))
        second = [*FIRST, {"role": "assistant", "content": reply}]
        second += [{"role": "user", "content": "and again"}]
        second_ids = encode_prompt(models, second, True)
        fed = counting_draft_inputs(drafter)
        hot = replace(CONFIG, sampling=SamplingConfig(temperature=0.8), seed=3)
        asyncio.run(_ask(engine, second_ids, hot))
    finally:
        engine.stop()
    assert engine.session.drafter is drafter  # not rebuilt for another sampler
    # The draft model's first call takes only what the first request left out of its cache.
    assert fed and fed[0] <= len(second_ids) - len(first_ids) + 1
    assert set(engine.session._policies) == {greedy.sampling, hot.sampling}


def test_a_request_may_not_change_what_shapes_the_drafter(models):
    session = Session(models, CONFIG)
    ids = encode_prompt(models, FIRST, True)
    assert list(session.stream(ids, replace(CONFIG, max_tokens=3)))  # its own length: fine
    with pytest.raises(UsageError, match="share its k"):
        list(session.stream(ids, replace(CONFIG, k=5)))


def test_one_session_streams_what_generate_returns(models):
    session = Session(models, CONFIG)
    ids = encode_prompt(models, FIRST, True)
    want = specmlx.generate(models, FIRST, CONFIG)
    for _ in range(2):  # the second request reuses the caches the first left
        got = [t for event in session.stream(ids) for t in event.token_ids]
        assert got == want.token_ids


def test_policies_are_kept_for_the_samplers_used_last(models):
    from specmlx.api.session import MAX_POLICIES

    session = Session(models, CONFIG)
    first = session.policy(SamplingConfig())
    for i in range(MAX_POLICIES + 3):
        session.policy(SamplingConfig(temperature=0.1 + i / 100))
    assert len(session._policies) == MAX_POLICIES
    assert session.policy(SamplingConfig()) is not first  # the oldest went
    hot = SamplingConfig(temperature=0.5)
    assert session.policy(hot) is session.policy(hot)


def test_a_new_session_starts_from_what_earlier_ones_saw_of_the_drafts(models):
    """`specmlx.generate` and each bench row make a session per call: the adaptive policy's
    acceptance and probing carry over on the loaded models, as its costs do."""
    from specmlx.engine.costs import CostProfile

    profile = CostProfile(1.0, 0.001, {n: 1.0 for n in range(1, 17)})
    config = GenerationConfig(method="draft", max_tokens=12)
    ids = encode_prompt(models, FIRST, True)
    first = Session(models, config, profile)
    list(first.steps(ids))
    policy = first.policy(config.sampling)
    assert policy.acceptance.steps > 0
    second = Session(models, config, profile).policy(config.sampling)
    assert second is not policy
    assert second.acceptance is policy.acceptance and second.probing is policy.probing
