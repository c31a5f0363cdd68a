"""The Python API: load a target (and a drafter) once, then generate or stream.

    import specmlx
    models = specmlx.load("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    result = specmlx.generate(models, "def quicksort(xs):", specmlx.GenerationConfig(k=4))
    print(result.text, result.stats.acceptance_rate)

`stream_generate` yields one `GenerationEvent` per target call, with the new text, the new
token ids and running statistics. `ChatSession` keeps a conversation and its caches, so each
turn prefills only what is new (`specmlx.api.chat`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from specmlx.api.config import GenerationConfig
from specmlx.api.methods import METHODS, Method, MethodOptions, owner_of
from specmlx.api.models import CostKey, Models
from specmlx.engine.cache import Sequence
from specmlx.engine.costs import CostProfile
from specmlx.engine.decode import Step, decode
from specmlx.engine.draft import Drafter
from specmlx.engine.policy import AdaptiveK, FixedK, LearnedCosts, Policy
from specmlx.engine.stats import Stats
from specmlx.errors import UsageError


@dataclass(frozen=True)
class GenerationEvent:
    """One target call's worth of output."""

    text: str  # new text (a token's bytes may complete in a later event)
    token_ids: tuple[int, ...]
    step: Step
    stats: Stats


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


def method_of(models: Models, config: GenerationConfig) -> Method:
    """The method a config asks for: named, implied by its options, or by default the draft
    model when one is loaded."""
    if config.method is not None:
        return METHODS[config.method]
    if config.options is not None:
        return owner_of(config.options)
    if models.draft is None and models.heads:
        return METHODS[next(iter(models.heads))]
    return METHODS["draft" if models.draft is not None else "none"]


def options_of(models: Models, config: GenerationConfig) -> MethodOptions:
    """The options the method runs with: the config's, or the method's defaults."""
    return config.options if config.options is not None else method_of(models, config).options()


def method_settings(models: Models, config: GenerationConfig) -> dict[str, Any]:
    """What shapes a method's drafts, for reports: k, and the method's options."""
    used = method_of(models, config)
    if used.name == "none":
        return {}
    settings: dict[str, Any] = {"k": "auto" if config.k is None else config.k}
    settings.update(used.settings(options_of(models, config)))
    return {key: value for key, value in settings.items() if value is not None}


def make_drafter(models: Models, config: GenerationConfig) -> Drafter | None:
    """The drafter the config asks for, or None for plain decoding."""
    return method_of(models, config).build(models, options_of(models, config), config.sampling)


def make_policy(
    models: Models,
    config: GenerationConfig,
    drafter: Drafter | None,
    profile: CostProfile | None = None,
) -> Policy:
    """The policy that sets each step's draft length: fixed k, or adaptive from this
    combination's calibrated costs (`profile`, or measured once per device and then read
    from the cache)."""
    options = options_of(models, config)
    p_min = getattr(options, "p_min", None)
    if drafter is None:
        return FixedK(0)
    if config.k is not None:
        return FixedK(config.k, p_min)
    from specmlx.api.calibration import load_or_measure

    traits = drafter.traits
    if profile is None:
        profile, _ = load_or_measure(models, with_draft=traits.uses_model)
    # The costs earlier responses measured carry over: they are the machine's, not a
    # response's (each sampler adds its own per-step cost: greedy, top-p, top-k).
    key: CostKey = (
        traits.kind,
        traits.tree_size,
        config.sampling,
        profile.target_call_seconds,
        profile.draft_call_seconds,
    )
    return AdaptiveK(
        profile,
        traits,
        learned=models.learned_costs.setdefault(key, LearnedCosts()),
        max_k=config.max_k,
        p_min=p_min,
    )


def stream_ids(
    models: Models,
    target: Sequence,
    drafter: Drafter | None,
    prompt_ids: list[int],
    config: GenerationConfig,
    policy: Policy,
) -> Iterator[GenerationEvent]:
    """Stream the continuation of `prompt_ids` through the given target sequence, with the
    `policy` from `make_policy` (an adaptive one keeps learning across calls)."""
    if config.seed is not None:
        mx.random.seed(config.seed)
    mx.reset_peak_memory()
    detokenizer = models.tokenizer.detokenizer
    detokenizer.reset()
    stop = frozenset(models.tokenizer.eos_token_ids)
    stats = Stats(prompt_tokens=len(prompt_ids))
    start = time.perf_counter()
    for step in decode(
        target,
        prompt_ids,
        drafter,
        policy=policy,
        max_tokens=config.max_tokens,
        sampling=config.sampling,
        stop_tokens=stop,
    ):
        stats = stats.add(step, time.perf_counter() - start)
        for token in step.tokens:
            if token not in stop:
                detokenizer.add_token(token)
        if step.finish is not None:
            detokenizer.finalize()
        yield GenerationEvent(detokenizer.last_segment, step.tokens, step, stats)


def stream_generate(
    models: Models, prompt: str | list[dict[str, str]], config: GenerationConfig | None = None
) -> Iterator[GenerationEvent]:
    """Stream the target's continuation of `prompt`, one event per target call."""
    config = config or GenerationConfig()
    prompt_ids = encode_prompt(models, prompt, config.chat_template)
    drafter = make_drafter(models, config)
    policy = make_policy(models, config, drafter)
    yield from stream_ids(models, Sequence(models.target), drafter, prompt_ids, config, policy)


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
