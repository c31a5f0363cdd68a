"""Loading: resolve model references, load the target, its draft model and its heads, and
check that they belong together. `load_for` is what the commands call (generate, chat,
calibrate and serve alike): the models a config needs, ready to generate with.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import mlx.nn as nn

from specmlx.api.config import GenerationConfig, method_of
from specmlx.api.methods import METHODS, check_trees
from specmlx.api.models import Models
from specmlx.errors import SpecmlxError, UsageError


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

    from specmlx.io.resolve import resolve_model

    if target is None:
        from specmlx.io.registry import default_pair

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


def _silent(message: str) -> AbstractContextManager[Any]:
    return nullcontext()


def load_for(
    config: GenerationConfig,
    target: str | None = None,
    draft: str | None = None,
    heads: list[str] | None = None,
    *,
    stage: Callable[[str], AbstractContextManager[Any]] = _silent,
) -> Models:
    """Load the models `config` generates with, then, for adaptive k, this device's call
    costs (measured once per device and pair, then read from the cache). `stage(message)`
    wraps each slow part (the CLI shows a spinner).

    Without a method, heads given draft: the registry pair's draft model stays unloaded.
    (The bench loads with `load`, for the several methods it runs; train-heads loads only a
    target.)
    """
    named = METHODS[config.method] if config.method is not None else None
    default_draft = named.needs_draft_model if named is not None else not heads
    with stage("loading models…"):
        models = load(target, draft, heads=heads, default_draft=default_draft)
    used = method_of(models, config)
    check_trees(used, models.target)  # a refused method costs no calibration
    if config.k is None and used.name != "none":
        from specmlx.api.calibration import load_or_measure

        with stage("calibrating call costs for adaptive k (once per device and pair)…"):
            load_or_measure(models, used.needs_draft_model)
    return models
