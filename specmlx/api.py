"""The Python API: load a target (and a drafter) once, then generate or stream.

    import specmlx
    models = specmlx.load("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    result = specmlx.generate(models, "def quicksort(xs):", specmlx.GenerationConfig(k=4))
    print(result.text, result.stats.acceptance_rate)

`stream_generate` yields one `GenerationEvent` per target call, with the new text, the new
token ids and running statistics. `ChatSession` keeps a conversation and its caches, so each
turn prefills only what is new (`specmlx.chat`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specmlx.cache import Sequence
from specmlx.costs import CostProfile
from specmlx.decode import Step, decode
from specmlx.drafters.base import Drafter
from specmlx.errors import SpecmlxError, UsageError
from specmlx.methods import METHODS, Method, MethodOptions, method
from specmlx.policy import AdaptiveK, FixedK, LearnedCosts, Policy
from specmlx.sampling import SamplingConfig
from specmlx.stats import Stats


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate.

    `method=None` drafts with the draft model when one is loaded, else with the heads when
    some are loaded, else decodes plainly.
    `options` are the method's own settings (`specmlx.methods`: `NgramOptions(min_n=2)`,
    `LookaheadOptions(window=7)`, `DraftOptions(p_min=0.5)`); None takes its defaults, and
    options given without a method name the method they belong to.
    """

    method: str | None = None
    options: MethodOptions | None = None
    k: int | None = None  # draft length; None chooses it per step (adaptive, `-k auto`)
    max_k: int = 16  # adaptive k: the longest draft it may choose
    max_tokens: int = 256
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = None
    chat_template: bool = True

    def __post_init__(self) -> None:
        if self.method is not None:
            method(self.method)  # a known name, or a one-line error
        if self.options is not None:
            owner = _owner(self.options)
            if self.method is not None and owner.name != self.method:
                raise UsageError(
                    f"{type(self.options).__name__} are options of --method {owner.name}, "
                    f"not of --method {self.method}"
                )
        if self.k is not None and self.k < 1:
            raise UsageError(f"k must be at least 1 (or auto), got {self.k}")
        if self.max_k < 1:
            raise UsageError(f"max-k must be at least 1, got {self.max_k}")
        if self.max_tokens < 1:
            raise UsageError(f"max-tokens must be at least 1, got {self.max_tokens}")


def _owner(options: MethodOptions) -> Method:
    return next(m for m in METHODS.values() if isinstance(options, m.options))


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


# Whose measured costs: drafter kind, tree size, sampler, calibrated target and draft call.
CostKey = tuple[str, int | None, SamplingConfig, float, float | None]


@dataclass
class Models:
    """A loaded target, its tokenizer, and an optional draft model."""

    target: nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper
    draft: nn.Module | None = None
    target_path: Path | None = None
    draft_path: Path | None = None
    # Heads trained for this target (`specmlx.heads`), by the method that drafts with them.
    heads: dict[str, Any] = field(default_factory=dict)
    # What adaptive k measured of each drafter's costs on this machine, for the next response.
    learned_costs: dict[CostKey, LearnedCosts] = field(default_factory=dict, repr=False)

    @property
    def vocab_size(self) -> int:
        return _vocab_rows(self.target)

    @property
    def context_length(self) -> int | None:
        args = getattr(self.target, "args", None)
        return getattr(args, "max_position_embeddings", None)


def _vocab_rows(model: nn.Module) -> int:
    args = getattr(model, "args", None)
    return int(args.vocab_size)


def load(
    target: str | None = None,
    draft: str | None = None,
    *,
    heads: str | list[str] | None = None,
    progress: bool = True,
    default_draft: bool = True,
) -> Models:
    """Resolve and load a target, an optional draft model and optional heads.

    With no target, the registry's default pair is used (its draft too, unless `draft` is
    given or `default_draft` is off). References are anything `specmlx.resolve_model`
    takes: a folder, a .gguf file, an alias, a Hugging Face id. `heads`: a folder or Hugging
    Face id of Medusa or EAGLE heads (ours or a published layout) trained for this target,
    or a list of them, at most one of each kind.
    """
    from mlx_lm import load as mlx_load

    from specmlx.resolve import resolve_model

    if target is None:
        from specmlx.registry import default_pair

        target, pair_draft = default_pair()
        draft = draft or (pair_draft if default_draft else None)
    target_path = resolve_model(target, progress=progress)
    draft_path = resolve_model(draft, progress=progress) if draft else None
    target_model, tokenizer = _load_one(mlx_load, target_path)
    models = Models(target_model, tokenizer, target_path=target_path)
    if draft_path is not None:
        draft_model, draft_tokenizer = _load_one(mlx_load, draft_path)
        check_compatible(tokenizer, draft_tokenizer)
        models.draft, models.draft_path = draft_model, draft_path
    for ref in [heads] if isinstance(heads, str) else heads or []:
        from specmlx.heads import load_heads, method_of_heads

        loaded = load_heads(ref, target_model, tokenizer)
        name = method_of_heads(loaded)
        if name in models.heads:
            raise UsageError(f"two sets of {name} heads given; one of each kind, please")
        models.heads[name] = loaded
    return models


def _load_one(mlx_load: Any, path: Path) -> tuple[nn.Module, Any]:
    try:
        return mlx_load(str(path))
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise SpecmlxError(f"could not load the model in {path}: {exc}") from None


def check_compatible(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """The draft must speak the target's tokenizer: same ids, same strings, same specials.

    Model vocab sizes may still differ by padding rows; the drafter pads or cuts its logits.
    """
    target_vocab = target_tokenizer._tokenizer.get_vocab()
    draft_vocab = draft_tokenizer._tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        target_by_id = {i: s for s, i in target_vocab.items()}
        draft_by_id = {i: s for s, i in draft_vocab.items()}
        for i in range(max(len(target_by_id), len(draft_by_id))):
            t, d = target_by_id.get(i), draft_by_id.get(i)
            if t != d:
                raise SpecmlxError(
                    f"draft and target tokenizers differ: token id {i} is {t!r} in the "
                    f"target and {d!r} in the draft"
                )
    for name in ("eos_token_id", "bos_token_id"):
        t, d = getattr(target_tokenizer, name, None), getattr(draft_tokenizer, name, None)
        if t != d:
            raise SpecmlxError(f"draft and target tokenizers differ: {name} is {t} vs {d}")


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
        return _owner(config.options)
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
    from specmlx.calibration import load_or_measure

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
