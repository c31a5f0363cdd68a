"""specmlx serve: the real server (uvicorn on a free port) over HTTP, on tiny models.

Clients are httpx and the official openai client. Greedy output through the server must
equal `specmlx.generate` for the same request; the server's worker shares the models with
the test, so expectations are computed while the server is idle.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx
import openai
import pytest
import uvicorn

import specmlx
from specmlx.api.config import GenerationConfig
from specmlx.api.generate import encode_prompt
from specmlx.api.session import Session
from specmlx.server.app import create_app
from specmlx.server.engine import Engine, Record
from specmlx.server.stops import StopText

CONFIG = GenerationConfig(method="draft", k=3, max_tokens=24)
MODEL = "tiny"


@dataclass
class Served:
    url: str
    engine: Engine
    records: list[Record]

    def client(self, api_key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0)


@contextlib.contextmanager
def running(
    models, max_queue: int = 16, api_key: str | None = None, config: GenerationConfig = CONFIG
) -> Iterator[Served]:
    records: list[Record] = []
    engine = Engine(models, config, max_queue, log=records.append)
    app = create_app(engine, MODEL, api_key=api_key)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{port}", engine, records)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def models(tiny_dirs):
    return specmlx.load(str(tiny_dirs["llama"]), str(tiny_dirs["llama-draft"]), progress=False)


@pytest.fixture(scope="module")
def served(models) -> Iterator[Served]:
    with running(models) as s:
        yield s


def expected(models, prompt, max_tokens: int = 24, **sampling) -> specmlx.GenerationResult:
    chat = isinstance(prompt, list)
    config = replace(CONFIG, max_tokens=max_tokens, chat_template=chat)
    return specmlx.generate(models, prompt, config)


def chat_of(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]


def test_health_and_models(served):
    health = httpx.get(f"{served.url}/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL
    listed = served.client().models.list()
    assert [m.id for m in listed.data] == [MODEL]


def test_chat_through_openai_client_equals_generate(served, models):
    want = expected(models, chat_of("hello there"))
    reply = served.client().chat.completions.create(
        model=MODEL, messages=chat_of("hello there"), max_tokens=24, temperature=0
    )
    assert reply.choices[0].message.content == want.text
    assert reply.choices[0].finish_reason == want.finish
    usage = reply.usage.model_dump()
    assert usage["completion_tokens"] == want.stats.tokens
    assert usage["prompt_tokens"] == want.stats.prompt_tokens
    assert usage["total_tokens"] == want.stats.prompt_tokens + want.stats.tokens
    speculation = usage["speculation"]
    assert speculation["method"] == "draft" and speculation["k"] == 3
    assert speculation["drafted"] == want.stats.drafted
    assert speculation["accepted"] == want.stats.accepted


@pytest.mark.parametrize("method", ["ngram", "lookahead"])
def test_draft_free_methods_equal_generate(models, method):
    config = GenerationConfig(method=method, k=3, max_tokens=16)
    want = specmlx.generate(models, chat_of("for i in range(10):"), config)
    with running(models, config=config) as s:
        reply = s.client().chat.completions.create(
            model=MODEL, messages=chat_of("for i in range(10):"), max_tokens=16
        )
    assert reply.choices[0].message.content == want.text
    assert reply.usage.model_dump()["speculation"]["method"] == method


def test_chat_stream_with_usage(served, models):
    want = expected(models, chat_of("tell me a story"))
    stream = served.client().chat.completions.create(
        model=MODEL,
        messages=chat_of("tell me a story"),
        max_completion_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == want.finish and not any(finishes[:-1])
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == want.stats.tokens


def test_completions_plain_and_streamed(served, models):
    prompt = "def fibonacci(n):"
    want = expected(models, prompt, max_tokens=16)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 16}
    plain = httpx.post(f"{served.url}/v1/completions", json=body).json()
    assert plain["object"] == "text_completion"
    assert plain["choices"][0]["text"] == want.text
    with httpx.stream("POST", f"{served.url}/v1/completions", json={**body, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == want.text
    assert all("usage" not in c for c in chunks)  # not asked for
    client = served.client().completions.create(model=MODEL, prompt=prompt, max_tokens=16)
    assert client.choices[0].text == want.text


def _stop_across_tokens(models, result) -> str:
    """A stop string of two characters: the last of one generated token, the first of the
    next (after a few tokens, so that something comes before it)."""
    text, ids = result.text, result.token_ids
    for i in range(3, len(ids) - 1):
        before = models.tokenizer.decode(ids[: i + 1])
        stop = text[len(before) - 1 : len(before) + 1]
        if before and text.startswith(before) and len(stop) == 2 and "\ufffd" not in stop:
            return stop
    pytest.skip("no token boundary to stop at")


def test_stop_string_spanning_tokens_never_appears(served, models):
    prompt = "The capital of France is"
    want = expected(models, prompt)
    stop = _stop_across_tokens(models, want)
    cut = want.text[: want.text.find(stop)]
    assert cut
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "stop": [stop, "\x00never"]}
    plain = httpx.post(f"{served.url}/v1/completions", json=body).json()
    assert plain["choices"][0]["text"] == cut
    assert plain["choices"][0]["finish_reason"] == "stop"
    with httpx.stream("POST", f"{served.url}/v1/completions", json={**body, "stream": True}) as r:
        chunks = [json.loads(e) for e in sse_events(r)[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == cut
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_stop_text_holds_back_partial_matches():
    stops = StopText(("END",))
    assert [stops.feed(p) for p in ("ab E", "N", "x")] == ["ab ", "", "ENx"]
    assert [stops.feed(p) for p in ("E", "ND tail")] == ["", ""] and stops.stopped
    tail = StopText(("END",))
    assert tail.feed("abEN") == "ab" and tail.flush() == "EN"


def test_next_turn_reuses_the_prompt_cache(served, models):
    first = chat_of("hello there")
    reply = served.client().chat.completions.create(model=MODEL, messages=first, max_tokens=8)
    turn = [*first, {"role": "assistant", "content": reply.choices[0].message.content}]
    second = [*turn, {"role": "user", "content": "and again"}]
    fed: list[int] = []
    target = served.engine.target
    original = target.model

    def counting(inputs, cache=None):
        fed.append(inputs.shape[1])
        return original(inputs, cache=cache)

    target.model = counting
    try:
        served.client().chat.completions.create(model=MODEL, messages=second, max_tokens=8)
    finally:
        target.model = original
    new = len(encode_prompt(models, second, True)) - len(encode_prompt(models, first, True))
    assert fed[0] <= new  # only what the first request did not already hold


def test_eight_concurrent_clients(served, models):
    prompts = [f"request number {i} says" for i in range(8)]
    wants = [expected(models, chat_of(p), max_tokens=12).text for p in prompts]
    got: dict[int, str] = {}

    def ask(i: int) -> None:
        reply = served.client().chat.completions.create(
            model=MODEL, messages=chat_of(prompts[i]), max_tokens=12
        )
        got[i] = reply.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [got.get(i) for i in range(8)] == wants


def test_seeded_sampling_repeats(served):
    def ask() -> str:
        body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.9, "seed": 7}
        return httpx.post(f"{served.url}/v1/completions", json=body).json()["choices"][0]["text"]

    assert ask() == ask()


def _gated(monkeypatch, gate: threading.Event, delay: float = 0.0) -> None:
    """Make each generation wait for `gate`, then take `delay` per step."""
    original = Session.stream

    def slow(self, *args, **kwargs):
        gate.wait(30)
        events = original(self, *args, **kwargs)
        try:
            for event in events:
                time.sleep(delay)
                yield event
        finally:
            events.close()

    monkeypatch.setattr(Session, "stream", slow)


def test_queue_overflow_is_429(models, monkeypatch):
    gate = threading.Event()
    _gated(monkeypatch, gate)
    with running(models, max_queue=1) as s:
        body = {"prompt": "hi", "max_tokens": 4}
        results: list[int] = []

        def post() -> None:
            results.append(httpx.post(f"{s.url}/v1/completions", json=body, timeout=30).status_code)

        first = threading.Thread(target=post)
        first.start()
        while not s.engine.busy:  # the first runs (held at the gate) ...
            time.sleep(0.01)
        second = threading.Thread(target=post)
        second.start()
        while s.engine.waiting < 1:  # ... the second waits ...
            time.sleep(0.01)
        third = httpx.post(f"{s.url}/v1/completions", json=body)  # ... the third is refused
        assert third.status_code == 429 and third.headers["retry-after"] == "1"
        assert third.json()["error"]["type"] == "rate_limit_error"
        with pytest.raises(openai.RateLimitError):
            s.client().completions.create(model=MODEL, prompt="hi", max_tokens=4)
        gate.set()
        first.join(30)
        second.join(30)
        assert results == [200, 200]


def test_disconnect_mid_stream_frees_the_server(models, monkeypatch):
    gate = threading.Event()
    gate.set()
    _gated(monkeypatch, gate, delay=0.05)  # 400 tokens would take 20 s at least
    with running(models) as s:
        body = {"prompt": "hi", "max_tokens": 400, "stream": True}
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break  # one chunk, then hang up
        start = time.monotonic()
        reply = httpx.post(f"{s.url}/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        assert reply.status_code == 200
        assert time.monotonic() - start < 5
        cancelled = s.records[0]
        assert cancelled.finish == "cancelled" and cancelled.completion_tokens < 100


def test_disconnect_before_a_plain_reply_frees_the_server(models, monkeypatch):
    """A non-streaming client that hangs up cancels its job: the job ends before its first
    token is sent, and the next request is served right after it. The generation is held at
    the gate until the server has seen the disconnect, so nothing here depends on timing."""
    want = expected(models, "hi", max_tokens=4)
    gate = threading.Event()
    _gated(monkeypatch, gate)
    with running(models) as s:
        payload = json.dumps({"prompt": "hi", "max_tokens": 400}).encode()
        head = (
            "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        url = httpx.URL(s.url)
        with socket.create_connection((url.host, url.port)) as client:
            client.sendall(head.encode() + payload)
            deadline = time.monotonic() + 20
            while not s.engine.busy:  # the job runs, held at the gate ...
                assert time.monotonic() < deadline, "the request never started"
                time.sleep(0.01)
            with s.engine._lock:
                (job,) = s.engine._live
        # ... and its client hangs up.
        assert job.cancelled.wait(20), "the server did not cancel the abandoned job"
        gate.set()
        reply = httpx.post(f"{s.url}/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        assert reply.status_code == 200
        assert reply.json()["choices"][0]["text"] == want.text
        cancelled = s.records[0]  # logged before the worker took the next job
        assert cancelled.request_id == job.request_id and cancelled.finish == "cancelled"
        assert cancelled.completion_tokens < 400


def test_errors_are_openai_shaped(served, models, monkeypatch):
    url = f"{served.url}/v1/chat/completions"
    bad_json = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]["message"]
    hot = httpx.post(url, json={"messages": chat_of("hi"), "temperature": 5})
    assert hot.status_code == 400 and hot.json()["error"]["param"] == "temperature"
    assert set(hot.json()["error"]) == {"message", "type", "param", "code"}
    many = httpx.post(url, json={"messages": chat_of("hi"), "n": 2})
    assert many.status_code == 400 and many.json()["error"]["param"] == "n"
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    picture = httpx.post(url, json={"messages": [{"role": "user", "content": image}]})
    assert picture.status_code == 400 and "image_url" in picture.json()["error"]["message"]
    no_prompt = httpx.post(f"{served.url}/v1/completions", json={"max_tokens": 3})
    assert no_prompt.status_code == 400 and no_prompt.json()["error"]["param"] == "prompt"
    client = served.client()
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-9", messages=chat_of("hi"))
    assert unknown.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    monkeypatch.setattr(models.target.args, "max_position_embeddings", 16)
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model=MODEL, prompt="hello world " * 20)
    message = long.value.body["message"]
    assert "context holds 16" in message and "tokens" in message
    assert httpx.get(f"{served.url}/v1/nowhere").json()["error"]["code"] == "not_found"


def test_internal_failure_is_500_and_the_next_request_is_served(served, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")
        yield  # a generator, as Session.stream is

    monkeypatch.setattr(Session, "stream", broken)
    client = served.client()
    with pytest.raises(openai.InternalServerError) as failure:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4)
    assert "boom" in failure.value.body["message"]
    stream = client.chat.completions.create(
        model=MODEL, messages=chat_of("hi"), max_tokens=4, stream=True
    )
    with pytest.raises(openai.APIError, match="boom"):
        list(stream)  # the headers were sent: the error comes as an event
    monkeypatch.undo()
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=4).choices[0].text


def test_api_key(models):
    with running(models, api_key="sesame") as s:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert httpx.get(f"{s.url}/v1/models").status_code == 401
        assert s.client("sesame").models.list().data[0].id == MODEL
        assert httpx.get(f"{s.url}/health").status_code == 200  # open, for load balancers


def test_shutdown_ends_open_streams_and_the_worker(models, monkeypatch):
    gate = threading.Event()
    gate.set()
    _gated(monkeypatch, gate, delay=0.05)
    with running(models) as s:
        body = {"prompt": "hi", "max_tokens": 400, "stream": True}
        stream = httpx.stream("POST", f"{s.url}/v1/completions", json=body)
        response = stream.__enter__()
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        start = time.monotonic()
    assert time.monotonic() - start < 5  # the graceful timeout (1 s here), then cut
    assert not s.engine._thread.is_alive()
    with pytest.raises(httpx.HTTPError):
        list(lines)  # the stream was cut, not finished
    stream.__exit__(None, None, None)


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_heads_serve_what_generate_gives(models, method):
    from specmlx.api.methods import EagleOptions, MedusaOptions
    from specmlx.testing import tiny_heads

    with_heads = replace(models, heads=tiny_heads(models.target, seed=5))
    options = {"medusa": MedusaOptions(tree_size=8), "eagle": EagleOptions(tree_size=8)}[method]
    config = GenerationConfig(options=options, k=3, max_tokens=16)
    want = specmlx.generate(with_heads, chat_of("for i in range(10):"), config)
    with running(with_heads, config=config) as s:
        reply = s.client().chat.completions.create(
            model=MODEL, messages=chat_of("for i in range(10):"), max_tokens=16
        )
    assert reply.choices[0].message.content == want.text
    speculation = reply.usage.model_dump()["speculation"]
    assert speculation["method"] == method and speculation["drafted"] > 0
    assert 1 < speculation["verified_per_call"] <= 8
