"""Held-out top-1 of trained heads on any feature cache: heads of two recipes compared on
the same held-out text; and their temperatures fitted there.

Training scores its heads on its own data's held-out sequences (`TrainConfig.holdout`), so
heads trained on other data were scored on other text. `heldout_top1` scores heads on the
held-out sequences of the cache it is given, split, windowed and scored exactly as training
splits, windows and scores them, with the heads' own settings (their training record) and
their own draft vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specmlx.api.models import Models
from specmlx.errors import UsageError
from specmlx.heads.base import CONFIG_FILE, check_target, target_vocab
from specmlx.heads.store import load_heads
from specmlx.io.files import write_atomic
from specmlx.training.data import (
    prompt_positions,
    read_answered,
    read_prompts,
    sequence_groups,
    split_parts,
    train_prompts,
)
from specmlx.training.losses import BatchFn, Objective
from specmlx.training.objectives import OBJECTIVES, Windows, heldout_by_part, t2d_table
from specmlx.training.shards import open_shards
from specmlx.training.temperature import Fit
from specmlx.training.train import TrainConfig, heldout_fit, split_sequences


def heldout_top1(
    models: Models, heads_dir: Path, data_dir: Path
) -> dict[str, tuple[list[float], int]]:
    """Per part of the held-out sequences of `data_dir` (all of them, the target's answers
    alone, the pieces of files alone; a part the cache lacks is left out): the top-1
    accuracy of each head (EAGLE: each unrolled step) of the heads in `heads_dir`, on answer
    positions where the cache's prompts can be told (as in training), and how many
    sequences that is."""
    held = _held_out(models, heads_dir, data_dir)
    loss_fn = held.objective.loss(held.heads, held.config)
    accuracy = heldout_by_part(loss_fn, held.batch_of, held.windows, held.objective.labelled)
    if not accuracy:
        raise UsageError(f"{data_dir} holds no held-out sequence to score")
    mx.clear_cache()
    counts = {part: len(ids) for part, ids in held.parts.items()} | {"all": len(held.ids)}
    return {
        part: (accuracy[part], counts[part]) for part in ("all", *held.parts) if part in accuracy
    }


def heldout_temperatures(models: Models, heads_dir: Path, data_dir: Path) -> Fit:
    """The temperatures of the heads in `heads_dir` fitted on the held-out answers of
    `data_dir` (else its held-out pieces of files), as training fits them: to apply the
    fit training recorded, or to fit them on other text."""
    held = _held_out(models, heads_dir, data_dir)
    if held.objective.logits is None:
        raise UsageError(f"{held.config.kind} heads have no temperatures to fit")
    fit = heldout_fit(held.heads, held.config, held.objective, held.batch_of, held.windows)
    if fit is None:
        raise UsageError(f"{data_dir} holds no held-out position to fit temperatures on")
    mx.clear_cache()
    return fit


def write_temperatures(heads_dir: Path, fit: Fit, data_dir: Path) -> None:
    """Record `fit`, made on `data_dir`, in the config.json of `heads_dir` (the weights are
    untouched), never half written."""
    path = Path(heads_dir) / CONFIG_FILE
    try:
        config = json.loads(path.read_text())
        config["temperatures"] = fit.temperatures
        record = fit.record() | {"fitted_on": f"the held-out sequences of {Path(data_dir).name}"}
        config.setdefault("training", {})["calibration"] = record
        write_atomic(path, json.dumps(config, indent=2) + "\n")
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None


@dataclass(frozen=True)
class _HeldOut:
    """Trained heads and the held-out windows of a cache, cut as their training cut them."""

    heads: nn.Module
    config: TrainConfig
    objective: Objective
    batch_of: BatchFn
    windows: dict[str, Windows]  # by part: answers, files
    parts: dict[str, list[int]]  # the held-out sequences of each part
    ids: list[int]  # all held-out sequences


def _held_out(models: Models, heads_dir: Path, data_dir: Path) -> _HeldOut:
    heads = load_heads(heads_dir, models.target, models.tokenizer)
    training = heads.config.training or {}
    if "settings" not in training:
        raise UsageError(f"{heads_dir} holds no training record: heads trained elsewhere")
    known = {f.name for f in fields(TrainConfig)}
    settings = {k: v for k, v in training["settings"].items() if k in known}
    config = TrainConfig(**settings | {"feature_layers": tuple(settings["feature_layers"])})
    if not config.holdout:
        raise UsageError(f"{heads_dir} were trained with nothing held out (holdout 0)")
    data = open_shards(Path(data_dir), whole=True, layers=config.feature_layers)
    check_target(data.manifest["fingerprint"], models.target, models.tokenizer)
    source, n = data.manifest["source"], data.index.n_sequences
    skip = _answer_positions(models, source, n, Path(data_dir))
    _, held_ids = split_sequences(sequence_groups(source, n), config.holdout)
    parts = split_parts(source, held_ids)
    objective = OBJECTIVES[config.kind]
    d2t = None if heads.d2t is None else np.array(heads.d2t)
    batch_of = objective.batches(data, t2d_table(d2t, target_vocab(models.target)), config)
    batch_size = config.batch_tokens // config.seq_len
    windows = {
        part: Windows(data, config.seq_len, batch_size, config.seed, ids, skip)
        for part, ids in parts.items()
    }
    return _HeldOut(heads, config, objective, batch_of, windows, parts, held_ids)


def _answer_positions(models: Models, source: dict, n: int, data_dir: Path) -> list[int] | None:
    """The prompt positions to leave unscored, told from the prompts train-heads kept in the
    data folder (in a folder made before it kept them: the shipped prompts and the Magpie
    prompts); None: every position."""
    shipped = train_prompts()
    answered = read_answered(data_dir)
    candidates = [shipped] + [
        shipped + read_prompts(path) for path in sorted(data_dir.glob("magpie-*.jsonl"))
    ]
    for prompts in reversed(candidates + ([answered] if answered else [])):
        skip = prompt_positions(models, source, n, prompts)
        if skip is not None:
            return skip
    return None
