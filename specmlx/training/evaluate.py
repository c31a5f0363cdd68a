"""Held-out top-1 of trained heads on any feature cache: heads of two recipes compared on
the same held-out text.

Training scores its heads on its own data's held-out sequences (`TrainConfig.holdout`), so
heads trained on other data were scored on other text. `heldout_top1` scores heads on the
held-out sequences of the cache it is given, split, windowed and scored exactly as training
splits, windows and scores them, with the heads' own settings (their training record) and
their own draft vocabulary.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import mlx.core as mx
import numpy as np

from specmlx.api.models import Models
from specmlx.errors import UsageError
from specmlx.heads.base import check_target, target_vocab
from specmlx.heads.store import load_heads
from specmlx.training.data import (
    prompt_positions,
    read_answered,
    read_prompts,
    sequence_groups,
    split_parts,
    train_prompts,
)
from specmlx.training.objectives import OBJECTIVES, Windows, heldout_by_part, t2d_table
from specmlx.training.shards import open_shards
from specmlx.training.train import TrainConfig, split_sequences


def heldout_top1(
    models: Models, heads_dir: Path, data_dir: Path
) -> dict[str, tuple[list[float], int]]:
    """Per part of the held-out sequences of `data_dir` (all of them, the target's answers
    alone, the pieces of files alone; a part the cache lacks is left out): the top-1
    accuracy of each head (EAGLE: each unrolled step) of the heads in `heads_dir`, on answer
    positions where the cache's prompts can be told (as in training), and how many
    sequences that is."""
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
    loss_fn = objective.loss(heads, config)
    batch_size = config.batch_tokens // config.seq_len
    windows = {
        part: Windows(data, config.seq_len, batch_size, config.seed, ids, skip)
        for part, ids in parts.items()
    }
    accuracy = heldout_by_part(loss_fn, batch_of, windows, objective.labelled)
    if not accuracy:
        raise UsageError(f"{data_dir} holds no held-out sequence to score")
    mx.clear_cache()
    counts = {part: len(ids) for part, ids in parts.items()} | {"all": len(held_ids)}
    return {part: (accuracy[part], counts[part]) for part in ("all", *parts) if part in accuracy}


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
