"""The OpenAI wire format: request models, response and chunk bodies, and error bodies.

Requests are pydantic models that accept the fields OpenAI's clients send and ignore the
ones this server has no use for (`user`, `presence_penalty`, ...); the ones it cannot honour
(`n` > 1, `logprobs`) are a 400, never silently dropped. Responses are plain dicts in the
shape the `openai` client parses. Every error is `{"error": {message, type, param, code}}`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specmlx.engine.stats import Stats


class APIError(Exception):
    """An error the client gets as OpenAI's error body, with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        """The content as one string; only text parts can be read."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        kinds = {part.type for part in self.content} - {"text"}
        if kinds:
            raise APIError(400, f"only text content is supported, got {', '.join(kinds)}")
        return "".join(part.text or "" for part in self.content)


class GenerationRequest(BaseModel):
    """What chat and completions requests share."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None  # None: the one model served
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # not OpenAI's, but vLLM's and llama.cpp's
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: Any = None

    def check(self) -> None:
        if self.n != 1:
            raise APIError(400, f"only n=1 is supported, got n={self.n}", param="n")
        if self.logprobs:
            raise APIError(400, "logprobs are not supported", param="logprobs")

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(GenerationRequest):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def chat(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int]

    def prompt_value(self) -> str | list[int]:
        """The one prompt: a string, or token ids."""
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", param="prompt")
            return self.prompt[0]
        if isinstance(self.prompt, list) and not self.prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        return self.prompt


Kind = Literal["chat", "completion"]


def new_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(stats: Stats, method: str, k: int | str | None) -> dict[str, Any]:
    """OpenAI's token counts, and how the speculation went (`verified_per_call`: the tokens a
    speculative call scored, k + 1 for a chain, the tree's nodes for a tree)."""
    speculative_calls = stats.target_calls - stats.plain_steps
    verified = 1 + stats.drafted / speculative_calls if speculative_calls else None
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.tokens,
        "total_tokens": stats.prompt_tokens + stats.tokens,
        "speculation": {
            "method": method,
            "k": k,
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "tokens_per_call": round(stats.tokens_per_call, 4),
            "verified_per_call": None if verified is None else round(verified, 2),
        },
    }


def _choice(kind: Kind, text: str | None, finish: str | None) -> dict:
    if kind == "completion":
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}


def response(
    kind: Kind, request_id: str, model: str, text: str, finish: str, usage: dict
) -> dict[str, Any]:
    """The whole non-streamed response."""
    return {
        "id": request_id,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [_choice(kind, text, finish)],
        "usage": usage,
    }


def chunk(
    kind: Kind,
    request_id: str,
    model: str,
    text: str | None = None,
    finish: str | None = None,
    *,
    role: bool = False,
    usage: dict | None = None,
    include_usage: bool = False,
) -> str:
    """One server-sent event of a stream. `usage` given: the last chunk, without choices."""
    if usage is not None:
        choices = []
    elif kind == "completion":
        choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
    else:
        delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if include_usage or usage is not None:
        body["usage"] = usage  # null on every chunk but the last, as OpenAI sends it
    return event(body)


def event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body)}\n\n"


DONE = "data: [DONE]\n\n"
