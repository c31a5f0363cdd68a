"""Train Medusa heads or an EAGLE head on a feature cache (`specmlx.training.data`).

    data = generate_corpus(models, max_tokens=256)
    cache_features(models, data, FeatureSpec(), Path("data/smollm2"))
    report = train_heads(models, TrainConfig(kind="medusa", steps=600), Path("data/smollm2"),
                         Path("heads/smollm2-medusa"))

The target is only read here (its output rows, its embeddings): its features come from the
cache. AdamW (β2 0.95, as EAGLE trains) with a linear warm-up and a cosine decay; the losses
are in `specmlx.training.objectives`. Every `holdout`-th prompt's answers are kept out of
training, and the heads' top-1 accuracy on them (answer positions), at each checkpoint and
at the end, goes to the log: what they will keep when drafting new answers, and, beside the
training accuracy, how far they overfit their data. The heads published are those of the
best held-out score (`heldout_score`), and with `patience` the run stops once that many
evaluations in a row have not raised it: trained until held-out accuracy stops rising.
Every `checkpoint_every` steps, and on Ctrl-C (the step under way finishes first; a second
Ctrl-C stops at once), the run's state goes to `out_dir/checkpoint`; `resume=True` continues
from it and ends with the same weights as an uninterrupted run. A finished run leaves the heads (`save_heads`, with a record of the data,
steps, seed, losses and time in their config), `train_log.json` and `loss.png` in out_dir.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from specmlx.api.models import Models
from specmlx.engine.anatomy import hidden_size
from specmlx.errors import UsageError
from specmlx.heads.base import HeadsConfig, check_target, fingerprint, target_vocab
from specmlx.heads.kinds import KINDS, trainable_kind
from specmlx.progress import progress_bar
from specmlx.training import checkpoint as ckpt
from specmlx.training.data import draft_vocab, prompt_positions, sequence_groups, split_parts
from specmlx.training.losses import BatchFn, Objective
from specmlx.training.objectives import (
    OBJECTIVES,
    Windows,
    heldout_by_part,
    schedule,
    step_function,
    t2d_table,
    with_noise,
)
from specmlx.training.shards import FeatureData, open_shards
from specmlx.training.temperature import Fit, fit_temperatures


@dataclass(frozen=True)
class TrainConfig:
    """How to train. `steps=None` runs `epochs` passes over the cached windows."""

    kind: str = "medusa"  # a kind the kinds table marks trainable: "medusa" | "eagle"
    steps: int | None = None
    epochs: float = 1.0
    seq_len: int = 256  # positions per window (never across two sequences)
    batch_tokens: int = 2048  # positions per step: batch_tokens // seq_len windows
    lr: float | None = None  # peak learning rate; None: the kind's train_lr (kinds table)
    warmup: int = 20  # steps of linear warm-up, then a cosine decay to lr * min_lr
    min_lr: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # global gradient norm; 0: no clipping
    seed: int = 0  # the heads' initial weights and the data order
    draft_vocab: int | None = 16384  # V_d most frequent tokens of the data; None: all
    num_heads: int = 4  # medusa
    num_layers: int = 1  # medusa: residual blocks per head
    feature_layers: tuple[int, ...] = ()  # must be those the cache holds
    medusa_decay: float = 0.8  # head i's loss weight: decay ** i
    eagle_ce_weight: float = 0.1
    # Cross-entropy against the target's distribution (from its cached final hidden state)
    # instead of its greedy token: medusa and eagle.
    soft_targets: bool = False
    unroll: int = 2  # eagle: steps the head runs on its own predictions in the loss
    feature_noise: float = 0.0  # uniform noise of this amplitude on the input features
    # Train on answer positions only: a prompt (the user's text, the chat template) is then
    # read as context and left out of the loss. Off by default: the target's next tokens
    # inside prompts are its behaviour too, and masking them did not help (SmolLM2's EAGLE
    # head). The held-out score counts answers either way, where the prompts can be told.
    answers_only: bool = False
    # The answers to every holdout-th prompt (and every holdout-th piece of file) are never
    # trained on: the heads' accuracy there, at each checkpoint and at the end, is what they
    # do on text they have not seen. 0: none.
    holdout: int = 20
    checkpoint_every: int = 100  # also the steps between held-out evaluations
    # Stop after this many held-out evaluations in a row without a gain of `min_gain` in the
    # held-out score; 0: run every step.
    patience: int = 0
    min_gain: float = 0.002
    adam_beta2: float = 0.95
    # eagle: the decoder layer starts as a copy of the target's last layer (else as the
    # identity: its residual branches zero).
    init_from_target: bool = False
    # The published weights' dtype on disk ("bfloat16": half the file); None: as trained.
    save_dtype: str | None = None
    # Compile the step where its math stays in MLX (not on MLX's CPU backend, whose
    # exponentials the losses take in NumPy: `losses.host_math`).
    compile: bool = True

    def __post_init__(self) -> None:
        trainable_kind(self.kind)  # one line naming those train-heads trains, if not one
        positive = {"seq-len": self.seq_len, "batch-tokens": self.batch_tokens}
        positive |= {"num-heads": self.num_heads, "checkpoint-every": self.checkpoint_every}
        positive["unroll"] = self.unroll
        if self.steps is not None:
            positive["steps"] = self.steps
        if self.draft_vocab is not None:
            positive["draft-vocab"] = self.draft_vocab
        for name, value in positive.items():
            if value < 1:
                raise UsageError(f"{name} must be at least 1, got {value}")
        if self.batch_tokens < self.seq_len:
            raise UsageError(f"batch-tokens ({self.batch_tokens}) below seq-len ({self.seq_len})")
        if not 0 <= self.feature_noise < math.inf:
            raise UsageError(f"feature noise must be >= 0, got {self.feature_noise}")
        if self.feature_noise and not OBJECTIVES[self.kind].feature_noise:
            noisy = " or ".join(k for k, o in OBJECTIVES.items() if o.feature_noise)
            raise UsageError(f"feature noise is for {noisy} heads")
        if self.holdout < 0 or self.holdout == 1:
            raise UsageError(f"holdout must be 0 (none) or at least 2, got {self.holdout}")
        if not self.epochs > 0 or (self.lr is not None and not self.lr > 0):
            raise UsageError("epochs and lr must be positive")
        if self.warmup < 0 or not 0 <= self.min_lr <= 1 or self.num_layers < 0:
            raise UsageError("need warmup >= 0, 0 <= min-lr <= 1 and num-layers >= 0")
        if self.patience < 0 or not 0 <= self.adam_beta2 < 1:
            raise UsageError("need patience >= 0 and 0 <= adam-beta2 < 1")
        if self.patience and not self.holdout:
            raise UsageError("patience stops on the held-out score: it needs a holdout")
        if self.save_dtype not in (None, "float32", "bfloat16", "float16"):
            raise UsageError(f"save dtype: float32, bfloat16 or float16, not {self.save_dtype}")
        if self.init_from_target and not OBJECTIVES[self.kind].target_layer:
            raise UsageError(f"{self.kind} heads copy no target layer (init-from-target)")

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else KINDS[self.kind].train_lr


@dataclass(frozen=True)
class TrainReport:
    out_dir: Path
    kind: str
    steps: int  # steps done, earlier runs included
    total_steps: int
    finished: bool  # False: stopped early (`stop_after`); the checkpoint holds the run
    seconds: float  # training time, earlier runs included
    loss: float  # mean over the last steps
    losses: tuple[float, ...]  # medusa: each head's cross-entropy; eagle: SmoothL1, CE
    accuracy: tuple[float, ...]  # top-1, per head (eagle: per unrolled step)
    heldout: tuple[float, ...]  # the same on the held-out sequences (empty: none held out)
    data_tokens: int
    plot: Path | None = None
    heldout_parts: dict[str, list[float]] = field(default_factory=dict)  # answers, files
    # Fitted on the held-out answers (`specmlx.training.temperature`); None: not fitted.
    calibration: Fit | None = None


def train_heads(
    models: Models,
    config: TrainConfig,
    data_dir: Path | str,
    out_dir: Path | str,
    progress: bool = True,
    resume: bool = False,
    stop_after: int | None = None,
    prompts: list[str] | None = None,
    origin: dict | None = None,
) -> TrainReport:
    """Train heads of `config.kind` on the features cached in `data_dir` into `out_dir`.

    `resume` continues the run checkpointed in out_dir (without it, a checkpoint there is an
    error rather than lost). `stop_after` stops, checkpointed, once that many steps are done.
    `prompts`: those the data was generated from, when not the shipped set (to tell where
    each answer starts). `origin`: where the data came from, in words a reader elsewhere can
    follow (the prompts file's name, the files as given), recorded with the heads beside the
    corpus' own record; not checked on resume.
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    data = open_shards(data_dir, whole=True, layers=config.feature_layers)
    check_target(data.manifest["fingerprint"], models.target, models.tokenizer)
    ckpt.check_out_dir(out_dir)
    if ckpt.has_checkpoint(out_dir) and not resume:
        raise UsageError(f"{out_dir} holds an unfinished run: resume it, or delete its checkpoint")
    vocab = target_vocab(models.target)
    source, n = data.manifest["source"], data.index.n_sequences
    skip = prompt_positions(models, source, n, prompts)
    train_ids, held_ids = split_sequences(sequence_groups(source, n), config.holdout)
    d2t = _draft_ids(config, data, vocab, train_ids)
    batch_size = config.batch_tokens // config.seq_len
    trained_skip = skip if config.answers_only else None
    windows = Windows(data, config.seq_len, batch_size, config.seed, train_ids, trained_skip)
    heldout = {}  # scored apart: answers, pieces of files
    for part, ids in split_parts(source, held_ids).items():
        part_windows = Windows(data, config.seq_len, batch_size, config.seed, ids, skip)
        if len(part_windows):
            heldout[part] = part_windows
    if not len(windows):
        raise UsageError(f"{data_dir} holds no sequence of 3 tokens or more to train on")
    total = config.steps or max(1, math.ceil(config.epochs * len(windows) / windows.batch_size))
    summary = _data_summary(data, windows, d2t) | {"heldout_sequences": len(held_ids)}
    summary["trained_on"] = "all positions" if trained_skip is None else "answers"
    summary["heldout_scored"] = "all positions" if skip is None else "answers"
    summary["chosen_by"] = "held-out answers" if "answers" in heldout else "all held out"
    record = {"settings": settings_record(config), "data": summary}

    heads = _create(models, config, d2t)
    learning_rate = schedule(config.learning_rate, config.warmup, total, config.min_lr)
    optimizer = optim.AdamW(
        learning_rate, betas=[0.9, config.adam_beta2], weight_decay=config.weight_decay
    )
    optimizer.init(heads.trainable_parameters())
    run = ckpt.RunState()
    if resume and ckpt.has_checkpoint(out_dir):
        run = ckpt.load_checkpoint(out_dir, heads, optimizer, record)
    objective = OBJECTIVES[config.kind]
    loss_fn = objective.loss(heads, config)
    batch_of = objective.batches(data, t2d_table(d2t, vocab), config)
    step_fn = step_function(heads, optimizer, loss_fn, config.grad_clip, config.compile)
    evaluate = partial(heldout_by_part, loss_fn, batch_of, heldout, objective.labelled)

    with (
        ckpt.deferred_interrupt() as interrupt,
        progress_bar(progress, f"training {config.kind}", total, run.step) as bar,
    ):
        while run.step < total:
            start = time.perf_counter()
            batch = batch_of(*windows.positions(run.step))
            noisy = with_noise(batch, config.feature_noise, config.seed, run.step)
            loss, terms, accuracy = step_fn(*noisy)
            row = mx.concatenate([loss[None], optimizer.learning_rate[None], terms, accuracy])
            mx.eval(heads.state, optimizer.state, row)
            values = row.tolist()  # the step's one host sync (besides host_math's)
            run.seconds += time.perf_counter() - start
            bar.advance(run.record(values, len(terms)))
            stopping = interrupt.requested or run.step == stop_after
            due = run.step % config.checkpoint_every == 0
            if heldout and (due or run.step == total):
                scores = evaluate()
                run.log[-1]["heldout"] = scores.pop("all")
                run.log[-1]["heldout_parts"] = scores
                weights = dict(tree_flatten(heads.trainable_parameters()))
                run.improved(heldout_score(run.log[-1]), weights, config.min_gain)
                converged = config.patience and run.stale >= config.patience
                if converged:
                    run.log[-1]["converged"] = True
                    break
            if stopping or due:
                ckpt.save_checkpoint(out_dir, heads, optimizer, run, record)
            if interrupt.requested:
                raise KeyboardInterrupt
            if stopping:
                return _report(out_dir, config, run, total, summary, finished=False)

    if run.best:  # the heads of the best held-out score, not merely the last ones
        heads.load_weights(list(run.best.items()), strict=False)
    final = run.final()
    described = summary if origin is None else summary | {"origin": origin}
    training = {"data": described, "steps": run.step, "seed": config.seed, "losses": final}
    training["heldout_accuracy"] = best_heldout(run)
    training["heldout_parts"] = best_evaluation(run).get("heldout_parts", {})
    training |= {"best_step": run.best_step, "planned_steps": total}
    training |= {"seconds": round(run.seconds, 2), "settings": settings_record(config)}
    # Measured and recorded, not applied: on the Qwen 1.5B target's code the fitted Medusa
    # temperatures cut tau 2.25 -> 2.03 and 1.51x -> 1.40x where verification is cheap
    # (docs/benchmarks.md); `eval-heads --fit-temperatures` applies them on request.
    fit = heldout_fit(heads, config, objective, batch_of, heldout)
    if fit is not None:
        training["calibration"] = fit.record()
    heads.config = replace(heads.config, training=training)
    log = {"settings": settings_record(config), "data": described, "steps": run.log}
    dtype = None if config.save_dtype is None else getattr(mx, config.save_dtype)
    plot = ckpt.publish(heads, out_dir, log, dtype)
    report = _report(out_dir, config, run, total, summary, finished=True, plot=plot)
    return replace(report, calibration=fit)


def heldout_fit(
    heads: nn.Module,
    config: TrainConfig,
    objective: Objective,
    batch_of: BatchFn,
    heldout: dict[str, Windows],
) -> Fit | None:
    """The heads' temperatures, fitted on the held-out answers (what heads draft), else on
    the held-out pieces of files; None where the kind fits none or nothing is held out."""
    windows = heldout.get("answers") or heldout.get("files")
    if objective.logits is None or windows is None:
        return None
    return fit_temperatures(objective.logits(heads, config), batch_of, windows)


def split_sequences(groups: list[int], holdout: int) -> tuple[list[int], list[int]]:
    """The cached sequences trained on, and those held out: every holdout-th group (all the
    answers to one prompt go the same way)."""
    held = [holdout > 0 and g % holdout == holdout - 1 for g in groups]
    return [i for i, h in enumerate(held) if not h], [i for i, h in enumerate(held) if h]


def settings_record(config: TrainConfig) -> dict:
    """The settings as recorded with the heads and checked on resume."""
    return {**asdict(config), "feature_layers": list(config.feature_layers)}


def _draft_ids(
    config: TrainConfig, data: FeatureData, vocab: int, sequences: list[int]
) -> np.ndarray | None:
    """The draft vocabulary's target ids, most frequent first in the trained `sequences`
    (the held-out ones must not choose it: their score would flatter the heads), or None:
    the whole vocabulary."""
    if config.draft_vocab is None or config.draft_vocab >= vocab:
        return None
    counts = np.zeros(vocab, np.int64)
    for i in sequences:
        piece = data.tokens[int(data.starts[i]) : int(data.starts[i + 1])]
        counts += np.bincount(piece, minlength=vocab)[:vocab]
    return draft_vocab(counts, config.draft_vocab, data.manifest["eos_ids"])


def _data_summary(data: FeatureData, windows: Windows, d2t: np.ndarray | None) -> dict:
    """What the heads were trained on, as their config records it: the corpus' own record
    (prompt set, files, counts, digests), never this machine's paths."""
    covered = 1.0 if d2t is None else float(np.isin(data.tokens, d2t).mean())
    return {
        "source": data.manifest["source"],
        "sequences": data.index.n_sequences,
        "tokens": data.index.n_tokens,
        "windows": len(windows),
        "draft_vocab": None if d2t is None else len(d2t),
        "draft_vocab_coverage": round(covered, 4),  # of the data's tokens
    }


def _create(models: Models, config: TrainConfig, d2t: np.ndarray | None) -> nn.Module:
    """Fresh heads for the target, their initial weights drawn from the seed."""
    target = models.target
    objective = OBJECTIVES[config.kind]
    draft_vocab = target_vocab(target) if d2t is None else len(d2t)
    heads_config = HeadsConfig(
        kind=config.kind,
        hidden_size=hidden_size(target),
        target_vocab=target_vocab(target),
        draft_vocab=draft_vocab,
        feature_layers=config.feature_layers,
        **objective.shape(config),
        target_args=layer_args(models, config, draft_vocab),
        fingerprint=fingerprint(target, models.tokenizer),
    )
    module = KINDS[config.kind].module_class()
    mx.random.seed(config.seed)
    if d2t is None:
        heads = module.create(heads_config, target)
    else:
        heads = module.create(heads_config, target, d2t=mx.array(d2t, mx.int32))
    if config.init_from_target:
        copy_last_layer(heads, target)
    # Trained in float32: EAGLE-3's own lm_head starts as the target's output rows, often
    # bfloat16, where AdamW's small steps would round away (the other kinds' weights are
    # float32 already).
    heads.set_dtype(mx.float32)
    mx.eval(heads.parameters())
    return heads


def layer_args(models: Models, config: TrainConfig, draft_vocab: int) -> dict:
    """HeadsConfig.target_args of fresh heads: the target's config.json where they copy a
    target layer (EAGLE), the config of their own layer where they have one (EAGLE-3's,
    derived from the target's), else nothing."""
    objective = OBJECTIVES[config.kind]
    if objective.draft_layer is not None:
        return objective.draft_layer(target_args(models), draft_vocab)
    return target_args(models) if objective.target_layer else {}


def copy_last_layer(head: nn.Module, target: nn.Module) -> None:
    """The head's decoder layer (EAGLE-1: one of the target's own kind) takes the weights
    of the target's last layer, dequantized where the target is quantized."""
    from specmlx.engine.features import backbone

    last = backbone(target).layers[-1]
    weights = {}
    for name, module in last.named_modules():
        if isinstance(module, nn.QuantizedLinear):
            bias = module.get("bias")
            weights[f"{name}.weight"] = mx.dequantize(
                module.weight,
                module.scales,
                module.get("biases"),
                group_size=module.group_size,
                bits=module.bits,
                mode=module.mode,
            )
            if bias is not None:
                weights[f"{name}.bias"] = bias
    own = dict(tree_flatten(last.parameters()))
    own = {k: v for k, v in own.items() if not k.endswith((".scales", ".biases"))}
    own |= weights
    layer_keys = set(dict(tree_flatten(head.layer.parameters())))
    missing = layer_keys - set(own)
    if missing:
        raise UsageError(f"the target's last layer lacks {sorted(missing)[0]}: cannot copy it")
    head.layer.load_weights([(k, own[k].astype(mx.float32)) for k in layer_keys])


def check_buildable(models: Models, config: TrainConfig) -> None:
    """One line now, not after hours of generating and caching, if heads of `config.kind`
    cannot sit on this target: a copied layer needs a family mlx-lm builds layers of, an
    own layer a target config it can copy; and settings the kind refuses."""
    objective = OBJECTIVES[config.kind]
    objective.shape(config)  # eagle3: fewer than 3 test steps, or than 2 layers
    if objective.target_layer:
        from specmlx.heads.eagle import decoder_layer

        decoder_layer(target_args(models))
    layer_args(models, config, target_vocab(models.target))


def target_args(models: Models) -> dict:
    """The target's config.json (what mlx-lm builds its blocks from)."""
    path = models.target_path and Path(models.target_path) / "config.json"
    if path and path.is_file():
        return json.loads(path.read_text())
    return {k: v for k, v in vars(models.target.args).items() if not k.startswith("_")}


def _report(
    out_dir: Path,
    config: TrainConfig,
    run: ckpt.RunState,
    total: int,
    summary: dict,
    finished: bool,
    plot: Path | None = None,
) -> TrainReport:
    final = run.final()
    return TrainReport(
        out_dir,
        config.kind,
        run.step,
        total,
        finished,
        run.seconds,
        final["loss"],
        tuple(final["losses"]),
        tuple(final["accuracy"]),
        tuple(best_heldout(run)),
        summary["tokens"],
        plot,
        best_evaluation(run).get("heldout_parts", {}),
    )


def heldout_score(entry: dict) -> float:
    """What early stopping and the choice of weights go by: the held-out top-1 accuracies
    of the heads (EAGLE: of its unrolled steps) on the held-out answers where there are
    some (else on all held-out sequences), averaged. Answers, because heads draft answers:
    scored over all positions, a few pieces of files outweigh many short answers (more of
    the standard library raised that score while the Qwen heads drafted answers no
    better). Later heads count as much as the first: a draft keeps its deep tokens only
    where they are right too."""
    accuracy = entry.get("heldout_parts", {}).get("answers") or entry["heldout"]
    return float(np.mean(accuracy)) if accuracy else -1.0


def best_heldout(run: ckpt.RunState) -> list[float]:
    """The held-out accuracies of the best evaluation in the run's log (else the newest;
    empty: none measured)."""
    return best_evaluation(run).get("heldout", [])


def best_evaluation(run: ckpt.RunState) -> dict:
    """The log entry of the run's best held-out evaluation (else its newest; {}: none)."""
    held = [entry for entry in run.log if "heldout" in entry]
    best = [entry for entry in held if entry["step"] == run.best_step]
    return (best or held or [{}])[-1]
