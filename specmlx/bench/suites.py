"""Prompt suites for `specmlx bench`: the ones shipped with the package, or the user's own.

A suite is a JSONL file, one object per line with a "prompt" and an optional "id". The four
shipped suites of `all` probe different regimes: `code` (write or complete functions),
`extract` (summarize, quote or edit a text that is in the prompt, where copying makes drafts
easy), `chat` (open questions) and `creative` (high-entropy stories). `scripting` is what a
script sends a local model again and again (records to extract as JSON with one schema,
functions to give type hints and a docstring, tool calls in one format, taken in turn): it is
*ordered*, run in order with what earlier answers taught a drafter kept, and reported by
halves. A user's file may also be plain text, one prompt per line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specmlx.errors import UsageError

SUITES = ("code", "extract", "chat", "creative")  # `all`
ORDERED = ("scripting",)  # shipped too, not in `all`: each answer teaches the next


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


@dataclass(frozen=True)
class Suite:
    name: str
    prompts: tuple[Prompt, ...]
    ordered: bool = False  # later prompts gain from earlier answers: reported by halves

    def halves(self) -> tuple[frozenset[str], frozenset[str]] | None:
        """An ordered suite's prompt ids, first half and second half; None otherwise."""
        if not self.ordered or len(self.prompts) < 2:
            return None
        half = len(self.prompts) // 2
        ids = [p.id for p in self.prompts]
        return frozenset(ids[:half]), frozenset(ids[half:])


def suite_names(requested: list[str]) -> list[str]:
    """The suites to run, in the order asked, with `all` standing for every shipped suite."""
    names: list[str] = []
    for name in requested or ["all"]:
        for one in SUITES if name == "all" else [name]:
            if one not in (*SUITES, *ORDERED):
                known = ", ".join((*SUITES, *ORDERED))
                raise UsageError(f"unknown suite {one!r}; choose from {known}, all")
            if one not in names:
                names.append(one)
    return names


def load_suite(name: str, limit: int | None = None) -> Suite:
    """One of the shipped suites, its first `limit` prompts when given."""
    suite_names([name])
    _check_limit(limit)
    text = resources.files("specmlx").joinpath(f"data/suites/{name}.jsonl").read_text("utf-8")
    return Suite(name, _parse(text, name, jsonl=True)[:limit], ordered=name in ORDERED)


def load_prompts_file(path: Path, limit: int | None = None) -> Suite:
    """A user's prompts: JSONL with "prompt" fields (a .jsonl file, or lines starting with
    `{`), else plain text with one prompt per line. Named after the file."""
    _check_limit(limit)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read prompts file {path}: {exc}") from None
    lines = [line for line in text.splitlines() if line.strip()]
    jsonl = path.suffix == ".jsonl" or (bool(lines) and lines[0].lstrip().startswith("{"))
    prompts = _parse(text, path.stem, jsonl=jsonl)[:limit]
    if not prompts:
        raise UsageError(f"prompts file {path} holds no prompts")
    return Suite(path.stem, prompts)


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")


def _parse(text: str, name: str, *, jsonl: bool) -> tuple[Prompt, ...]:
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(Prompt(f"{name}-{len(prompts) + 1}", line.strip()))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{name}, line {number}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise UsageError(f'{name}, line {number}: expected an object with a "prompt" string')
        if not record["prompt"].strip():
            raise UsageError(f"{name}, line {number}: the prompt is empty")
        prompts.append(
            Prompt(str(record.get("id", f"{name}-{len(prompts) + 1}")), record["prompt"])
        )
    return tuple(prompts)
