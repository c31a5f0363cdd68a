"""Many requests through one loaded pair, for scripts: `generate_many`, and the request lines
`specmlx batch` reads.

    import specmlx
    models = specmlx.load("smollm2-135m")
    config = specmlx.GenerationConfig(method="suffix", max_tokens=128)
    for result in specmlx.generate_many(models, prompts, config):
        print(result.text)

Requests that draft the same way (method, its options, k) share one `Session`: its target
cache (a prompt that extends the last one prefills only what is new), its drafter and what
adaptive k learned; the suffix memory is the models' own, shared by all of them. A request
may bring its own sampling, length, seed and template (`Request.config`), its method's
options, or another method: other options or another method get a session of their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from specmlx.api.config import GenerationConfig, method_of
from specmlx.api.generate import GenerationResult, encode_prompt
from specmlx.api.methods import METHODS, method, owner_of
from specmlx.api.models import Models
from specmlx.api.option_names import (
    FRACTIONS,
    OPTION_NAMES,
    TEXTS,
    implied_method,
    with_options,
)
from specmlx.api.session import Session
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.stats import Stats
from specmlx.errors import SpecmlxError, UsageError

Prompt = str | list[dict[str, str]]
# What a request line may set besides its prompt, and the type each takes.
LINE_KEYS: dict[str, type | tuple[type, ...]] = {
    "max_tokens": int,
    "temp": (int, float),
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": int,
    "seed": int,
    "method": str,
    "k": (int, str),
    "chat_template": bool,
}
# Method options a line may not set: they shape the memory every line shares.
SHARED = frozenset({"suffix_memory", "suffix_cache"})


@dataclass(frozen=True)
class Request:
    """One prompt (a string, or chat messages) and, optionally, its own config."""

    prompt: Prompt
    config: GenerationConfig | None = None


class Sessions:
    """One session per drafting setup on `models`, made on first use, then kept."""

    def __init__(self, models: Models, config: GenerationConfig):
        self.models, self.config = models, config
        self._sessions: dict[tuple[Any, ...], Session] = {}

    def session(self, config: GenerationConfig) -> Session:
        key = (config.method, config.options, config.k, config.max_k)
        if key not in self._sessions:
            self._sessions[key] = Session(self.models, config)
        return self._sessions[key]

    def generate(self, prompt: Prompt, config: GenerationConfig | None = None) -> GenerationResult:
        config = config or self.config
        prompt_ids = encode_prompt(self.models, prompt, config.chat_template)
        text, ids, stats, finish = [], [], Stats(), None
        for event in self.session(config).stream(prompt_ids, config):
            text.append(event.text)
            ids.extend(event.token_ids)
            stats, finish = event.stats, event.step.finish
        return GenerationResult("".join(text), ids, stats, finish)


def generate_many(
    models: Models,
    prompts: Iterable[Prompt | Request],
    config: GenerationConfig | None = None,
) -> Iterator[GenerationResult]:
    """The result of every prompt, in order, each yielded as it finishes."""
    sessions = Sessions(models, config or GenerationConfig())
    for prompt in prompts:
        request = prompt if isinstance(prompt, Request) else Request(prompt)
        yield sessions.generate(request.prompt, request.config)


def parse_request(record: Any, base: GenerationConfig) -> Request:
    """A request line's object: "prompt" (a string) or "messages" (chat messages), and any
    of LINE_KEYS and of the method options (OPTION_NAMES but SHARED) over `base`; anything
    else is a one-line UsageError."""
    if not isinstance(record, dict):
        raise UsageError("expected a JSON object")
    unknown = sorted(set(record) - {"id", "prompt", "messages", *LINE_KEYS, *OPTION_NAMES})
    if unknown:
        raise UsageError(
            f"unknown key {unknown[0]!r}; a line takes id, prompt or messages, "
            f"{', '.join(LINE_KEYS)}, and a method's options ({', '.join(OPTION_NAMES)})"
        )
    for key, kind in LINE_KEYS.items():
        value = record.get(key)
        if value is not None and (
            not isinstance(value, kind) or isinstance(value, bool) != (kind is bool)
        ):
            raise UsageError(f"{key} must be a {_kind_name(kind)}, got {value!r}")
    prompt = _prompt_of(record)
    config = base
    if "method" in record and record["method"] != base.method:
        # The batch's options where they are the line's method's too (suffix and its
        # hybrids: the shared memory's size and file among them), else its defaults.
        taken = method(record["method"]).options
        kept = base.options if isinstance(base.options, taken) else None
        config = replace(config, method=record["method"], options=kept)
    named = {key: record[key] for key in OPTION_NAMES if record.get(key) is not None}
    if named:
        config = _with_method_options(config, named)
    if "k" in record:
        k = record["k"]
        config = replace(config, k=None if k == "auto" else _whole(k, "k"))
    temperature = record.get("temperature", record.get("temp"))
    sampling = SamplingConfig(
        base.sampling.temperature if temperature is None else float(temperature),
        float(record.get("top_p", base.sampling.top_p)),
        record.get("top_k", base.sampling.top_k),
    )
    return Request(
        prompt,
        replace(
            config,
            max_tokens=record.get("max_tokens", base.max_tokens),
            sampling=sampling,
            seed=record.get("seed", base.seed),
            chat_template=record.get("chat_template", base.chat_template),
        ),
    )


def _with_method_options(config: GenerationConfig, named: dict[str, Any]) -> GenerationConfig:
    """The line's method (its own, the batch's, or the one its options imply) with the
    line's options set over the batch's."""
    for key, value in named.items():
        kind = str if key in TEXTS else (int, float) if key in FRACTIONS else int
        if isinstance(value, bool) or not isinstance(value, kind):
            raise UsageError(f"{key} must be a {_kind_name(kind)}, got {value!r}")
        if key in SHARED:
            raise UsageError(
                f"{key} is the batch's, not a line's: every line shares one suffix memory"
            )
    if config.method is not None:
        used = METHODS[config.method]
    elif config.options is not None:
        used = owner_of(config.options)
    else:
        implied = implied_method(list(named))
        if implied is None:
            raise UsageError(f"{', '.join(named)}: name the line's method")
        used = implied
    return replace(config, method=used.name, options=with_options(used, named, config.options))


def _prompt_of(record: dict[str, Any]) -> Prompt:
    if ("prompt" in record) == ("messages" in record):
        raise UsageError('a line needs "prompt" (a string) or "messages" (a list), not both')
    if "prompt" in record:
        if not isinstance(record["prompt"], str) or not record["prompt"].strip():
            raise UsageError('"prompt" must be a non-empty string')
        return record["prompt"]
    messages = record["messages"]
    if (
        not isinstance(messages, list)
        or not messages
        or not all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        raise UsageError('"messages" must be a list of {"role": ..., "content": ...} strings')
    return messages


def _whole(value: Any, name: str) -> int:
    if isinstance(value, int):
        return value
    raise UsageError(f"{name} must be a whole number or auto, got {value!r}")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "whole number", float: "number", str: "string", bool: "true or false"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names[k] for k in kinds if not (k is int and float in kinds))


@dataclass(frozen=True)
class BatchLine:
    """One input line's outcome: its record for the output file (a result, or an error),
    and the result's statistics when it generated."""

    number: int
    record: dict[str, Any]
    stats: Stats | None = None


def read_finished(out_lines: list[str]) -> tuple[set[str], list[str]]:
    """Of an earlier run's output lines: the ids that have a result (as JSON text), and the
    lines to keep: results only (errors are retried; a last line cut off by an interrupted
    run is dropped)."""
    done, keep = set(), []
    for line in out_lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "text" in record and "id" in record:
            done.add(json.dumps(record["id"]))
            keep.append(line)
    return done, keep


def run_batch(
    models: Models, in_lines: list[str], config: GenerationConfig, done: set[str]
) -> Iterator[BatchLine]:
    """Every input line not in `done` (ids as JSON text), in order: its result record (`id`
    as given or the line number, `text`, `finish_reason`, `method`, `stats`), or an error
    record (`id`, `error`: one line) for a line that is not a request or fails; blank
    lines are skipped. The models' sessions are shared by all lines."""
    sessions = Sessions(models, config)
    seen: dict[str, int] = {}
    for number, line in enumerate(in_lines, 1):
        if not line.strip():
            continue
        record: Any = None
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            yield BatchLine(number, {"id": number, "error": f"not JSON ({exc.msg})"})
            continue
        given = record.get("id") if isinstance(record, dict) else None
        id_ = number if given is None else given
        key = json.dumps(id_)
        if key in seen:
            error = f"id {key} is also on line {seen[key]}"
            yield BatchLine(number, {"id": id_, "line": number, "error": error})
            continue
        seen[key] = number
        if key in done:
            continue
        try:
            request = parse_request(record, config)
            result = sessions.generate(request.prompt, request.config)
        except SpecmlxError as exc:
            yield BatchLine(number, {"id": id_, "error": str(exc)})
            continue
        method = method_of(models, request.config or config).name
        out = {
            "id": id_,
            "text": result.text,
            "finish_reason": result.finish,
            "method": method,
            "stats": result.stats.as_dict(),
        }
        yield BatchLine(number, out, result.stats)
