"""The `specmlx train-heads` command (data, cached target features, then training) and
`specmlx draft-vocab` (what a reduced draft vocabulary saves and gives up).

Three resumable stages, each skipped when its output is already there: the target's own
answers to a prompt set (self-distillation) and/or the files the user names, their features
computed once by the target and cached in shards (`DATA/`), then the heads trained on the
shards into OUT (a checkpoint there is resumed; Ctrl-C checkpoints and stops). Only typer is
imported here: MLX loads when the command runs.
"""

from __future__ import annotations

import glob
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specmlx.errors import UsageError
from specmlx.heads.kinds import KINDS, TRAINABLE, trainable_kind

if TYPE_CHECKING:
    from specmlx.training.temperature import Fit

KIND_HELP = f"The kind of heads: {' or '.join(TRAINABLE)}."
_DEFAULT_LRS = ", ".join(f"{KINDS[name].train_lr:g} {name}" for name in TRAINABLE)
LR_HELP = f"Peak learning rate. Default: {_DEFAULT_LRS}."
CachedData = Annotated[
    Path, typer.Option(help="Cached features of the target (train-heads' --data folder).")
]
DataTarget = Annotated[
    str | None, typer.Option(help="The target the data was cached for. Default: the pair's.")
]
# What heads trained before a setting existed were trained with.
LEGACY_SETTINGS = {"holdout": 0, "feature_noise": 0.0, "answers_only": False}


def train_heads(
    out: Annotated[Path, typer.Option(help="Folder to write the heads to.")],
    target: Annotated[
        str | None,
        typer.Option(
            help="The target: folder, .gguf, alias or Hugging Face id. Default: the pair's."
        ),
    ] = None,
    kind: Annotated[str, typer.Option(help=KIND_HELP)] = "medusa",
    data: Annotated[
        Path | None,
        typer.Option(help="Where the target's features are cached. Default: OUT.data beside OUT."),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            help='A file of prompts, one per line (.txt) or {"prompt": ...} (.jsonl), '
            "for the target to answer. Default: the shipped set (no bench prompt in it)."
        ),
    ] = None,
    self_distill: Annotated[
        bool, typer.Option(help="Train on the target's own answers to the prompts.")
    ] = True,
    limit: Annotated[int | None, typer.Option(help="Answer only the first N prompts.")] = None,
    answer_tokens: Annotated[int, typer.Option(help="Most tokens per answer.")] = 256,
    batch_size: Annotated[int, typer.Option(help="Prompts answered at once.")] = 8,
    samples: Annotated[
        int,
        typer.Option(
            help="Answers per prompt: the greedy one, then ones sampled at --temperature."
        ),
    ] = 1,
    temperature: Annotated[
        float, typer.Option(help="Temperature of the sampled answers (--samples above 1).")
    ] = 0.8,
    magpie: Annotated[
        list[str] | None,
        typer.Option(
            metavar="N[@MODEL]",
            help="Also answer N prompts the target writes itself (Magpie: sampled from its "
            "chat template's user prefix), or N@MODEL: another instruct model writes them "
            "(a coder target writes few chat turns). Repeatable; kept in the data folder.",
        ),
    ] = None,
    questions: Annotated[
        list[str] | None,
        typer.Option(
            "--questions",
            metavar="N[@MODEL]",
            help="Also answer N questions the target (or MODEL) writes as --magpie does, each "
            "user turn begun with a common opening (What is the difference between, Why "
            "does, Explain, How should I, ...): a small model's free draws are rarely the "
            "questions people ask. Repeatable; kept in the data folder.",
        ),
    ] = None,
    tasks: Annotated[
        int,
        typer.Option(
            "--task-prompts",
            metavar="N",
            help="Also answer N prompts made from the Python files among --files: tasks on "
            "their functions and classes (explain, test, annotate, summarise, list as JSON, "
            "implement, review, shorten, port), kept in the data folder.",
        ),
    ] = 0,
    files: Annotated[
        list[Path] | None,
        typer.Option(
            "--files",
            metavar="PATH",
            help="Text or code files (or folders) to train on too; repeatable.",
        ),
    ] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option(
            metavar="PATTERN", help="Leave out --files whose path matches this pattern; repeatable."
        ),
    ] = None,
    file_tokens: Annotated[
        int | None,
        typer.Option(help="Read --files in a seeded random order until N tokens are in."),
    ] = None,
    steps: Annotated[int | None, typer.Option(help="Training steps. Default: one epoch.")] = None,
    epochs: Annotated[float, typer.Option(help="Epochs, when --steps is not given.")] = 1.0,
    seq_len: Annotated[int, typer.Option(help="Positions per training window.")] = 256,
    batch_tokens: Annotated[int, typer.Option(help="Positions per step.")] = 1024,
    lr: Annotated[float | None, typer.Option(help=LR_HELP)] = None,
    warmup: Annotated[int, typer.Option(help="Warm-up steps before the cosine decay.")] = 20,
    draft_vocab: Annotated[
        int, typer.Option(help="Heads score the N most frequent tokens of the data; 0: all.")
    ] = 4096,
    num_heads: Annotated[int, typer.Option(help="medusa: number of heads.")] = 4,
    feature_noise: Annotated[
        float,
        typer.Option(help="eagle only: uniform noise of this amplitude on its input features."),
    ] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the heads' weights and the data order.")] = 0,
    answers_only: Annotated[
        bool,
        typer.Option(help="Leave prompt positions out of the loss (read as context only)."),
    ] = False,
    holdout: Annotated[
        int,
        typer.Option(
            help="Keep every Nth prompt's answers (or piece of file) out of training "
            "and report the heads' accuracy on them; 0: train on all."
        ),
    ] = 20,
    checkpoint_every: Annotated[
        int, typer.Option(help="Steps between checkpoints and held-out evaluations.")
    ] = 50,
    patience: Annotated[
        int,
        typer.Option(
            help="Stop once N held-out evaluations in a row have not raised the held-out "
            "top-1 (the best heads are kept either way); 0: run every step."
        ),
    ] = 0,
    soft_targets: Annotated[
        bool,
        typer.Option(help="Learn the target's distributions rather than its greedy tokens."),
    ] = False,
    init_from_target: Annotated[
        bool, typer.Option(help="eagle: start its layer as a copy of the target's last one.")
    ] = False,
    save_dtype: Annotated[
        str | None,
        typer.Option(help="Store the heads' weights as bfloat16 or float16 (half the file)."),
    ] = None,
    unroll: Annotated[
        int | None,
        typer.Option(
            help="eagle, eagle3: steps the head runs on its own predictions in training "
            "(eagle3: its training-time test, 3 or more). Default: 2, eagle3 3."
        ),
    ] = None,
) -> None:
    """Train Medusa, EAGLE or EAGLE-3 heads for a target on its own answers (and your files).

    Resumable: rerun the same command after Ctrl-C and it goes on where it stopped.
    """
    trainable_kind(kind)
    if not self_distill and not files:
        raise UsageError("nothing to train on: give --files, or keep --self-distill")
    for path in files or []:
        if not path.exists() and not glob.has_magic(str(path)):  # a pattern: matched later
            raise UsageError(f"no such file or folder: {path}")
    if samples < 1 or not 0 < temperature < float("inf"):
        raise UsageError(f"need samples >= 1 and temperature > 0, got {samples}, {temperature}")
    if tasks and not (files and self_distill):
        raise UsageError("--task-prompts are made from --files and answered: give --files")
    from specmlx.training.magpie import MagpieDraws, cached_magpie_prompts

    draws = [MagpieDraws.parse(text) for text in magpie or []]
    draws += [MagpieDraws.parse(text, questions=True) for text in questions or []]
    if tasks < 0:
        raise UsageError(f"need --task-prompts >= 0, got {tasks}")
    if prompts is not None and not prompts.is_file():
        raise UsageError(f"no such prompts file: {prompts}")
    from specmlx.training.objectives import OBJECTIVES
    from specmlx.training.train import TrainConfig

    objective = OBJECTIVES[kind]
    if unroll is None:
        unroll = max(TrainConfig.unroll, objective.min_unroll)
    config = TrainConfig(
        kind=kind,
        steps=steps,
        epochs=epochs,
        seq_len=seq_len,
        batch_tokens=batch_tokens,
        lr=lr,
        warmup=warmup,
        seed=seed,
        draft_vocab=draft_vocab or None,
        num_heads=num_heads,
        checkpoint_every=checkpoint_every,
        holdout=holdout,
        feature_noise=feature_noise,
        answers_only=answers_only,
        patience=patience,
        soft_targets=soft_targets,
        init_from_target=init_from_target,
        save_dtype=save_dtype,
        unroll=unroll,
    )
    from rich.console import Console

    from specmlx.api.load import load
    from specmlx.engine.features import FeatureSpec
    from specmlx.training.checkpoint import check_out_dir, has_checkpoint
    from specmlx.training.data import (
        cache_features,
        file_corpus,
        generate_corpus,
    )
    from specmlx.training.train import settings_record
    from specmlx.training.train import train_heads as run_training

    err = Console(stderr=True, highlight=False)
    # eagle3 reads the reference's low, middle and high layers of the target unless told.
    default_layers = not config.feature_layers and objective.feature_layers is not None
    # What can be wrong with OUT is said before hours of generating and caching.
    check_out_dir(out)
    finished = _finished(out)
    if finished is not None and not has_checkpoint(out):
        wanted, defaults = settings_record(config), settings_record(TrainConfig())
        # A setting newer than the heads counts as what they were trained with: the behaviour
        # before it existed (no held-out prompts), else its default.
        defaults |= LEGACY_SETTINGS
        if default_layers:  # the target's, known once it is loaded: as they were
            wanted.pop("feature_layers")
        free = ("checkpoint_every", "save_dtype")  # change nothing the training computes
        wanted = {key: value for key, value in wanted.items() if key not in free}
        if any(finished.get(key, defaults.get(key)) != value for key, value in wanted.items()):
            raise UsageError(
                f"{out} holds heads trained with other settings; delete it or choose another --out"
            )
        err.print(f"{out} already holds these heads: nothing to do", soft_wrap=True)
        return
    with err.status("loading the target…"):
        models = load(target, default_draft=False)
    if default_layers:
        config = replace(config, feature_layers=objective.feature_layers(models.target))
    from specmlx.training.train import check_buildable

    check_buildable(models, config)  # before hours of generating and caching
    corpus, texts = None, None
    data_dir = data or out.with_name(out.name + ".data")
    if self_distill:
        from specmlx.training.data import train_prompts

        texts = _read_prompts(prompts) if prompts is not None else train_prompts()
        texts = texts[:limit] if limit is not None else texts
        for drawn in (d for d in draws if d.count):
            texts = texts + cached_magpie_prompts(
                models,
                data_dir,
                drawn.count,
                seed=seed,
                writer=drawn.writer,
                questions=drawn.questions,
                batch_size=max(batch_size, 32),
            )
        if tasks:
            from specmlx.training.tasks import cached_task_prompts

            with err.status("making task prompts from the files…"):
                texts = texts + cached_task_prompts(
                    data_dir, files or [], tasks, seed, exclude or ()
                )
        corpus = generate_corpus(
            models,
            texts,
            answer_tokens,
            seed=seed,
            batch_size=batch_size,
            samples=samples,
            temperature=temperature,
        )
    if files:
        extra = file_corpus(
            files,
            models.tokenizer,
            seq_len=max(seq_len, 512),
            max_tokens=file_tokens,
            seed=seed,
            exclude=exclude or (),
        )
        corpus = extra if corpus is None else corpus + extra
    assert corpus is not None
    cache_features(models, corpus, FeatureSpec(config.feature_layers), data_dir)
    origin = _origin(prompts if self_distill else None, self_distill, limit, files or [])
    records = [drawn.record() for drawn in draws if drawn.count]
    if records:  # one draw as a value (heads before writers recorded a count), several a list
        origin["magpie"] = records[0] if len(records) == 1 else records
    if tasks:
        origin["task_prompts"] = tasks
    report = run_training(models, config, data_dir, out, resume=True, prompts=texts, origin=origin)
    accuracy = " ".join(f"{a:.0%}" for a in report.accuracy)
    heldout = " ".join(f"{a:.0%}" for a in report.heldout) or "none"
    if "answers" in report.heldout_parts:
        answers = " ".join(f"{a:.0%}" for a in report.heldout_parts["answers"])
        heldout += f"; answers alone, which chose them: {answers}"
    if report.calibration is not None:
        heldout += f"; fitted, not applied: {describe_fit(report.calibration)}"
    err.print(
        f"{kind} heads written to {out}: {report.steps} steps in {report.seconds:.0f} s on "
        f"{report.data_tokens} tokens, loss {report.loss:.3f}, top-1 {accuracy}"
        + f" (held out: {heldout})",
        soft_wrap=True,
    )


def describe_fit(fit: Fit) -> str:
    """Fitted temperatures in one line, with what they did to the top-1 probability."""

    def percent(values: list[float]) -> str:
        return " ".join(f"{v:.0%}" for v in values)

    return (
        f"temperatures {' '.join(f'{t:.2f}' for t in fit.temperatures)} on {fit.positions} "
        f"held-out positions: top-1 probability {percent(fit.confidence)} -> "
        f"{percent(fit.confidence_fitted)} (top-1 {percent(fit.accuracy)})"
    )


def _origin(prompts: Path | None, self_distill: bool, limit: int | None, files: list[Path]) -> dict:
    """Where the data came from, as the heads' config records it: the prompts file by name
    and the files as given when relative (else by name), never this machine's full paths."""
    origin: dict = {}
    if self_distill:
        origin["prompts"] = prompts.name if prompts is not None else "shipped"
        if limit is not None:
            origin["limit"] = limit
    if files:
        origin["files"] = [str(f) if not f.is_absolute() else f.name for f in files]
    return origin


def _finished(out: Path) -> dict | None:
    """The training settings of the finished heads in `out`, if it holds some."""
    import json

    try:
        return json.loads((out / "config.json").read_text())["training"]["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _read_prompts(path: Path) -> list[str]:
    import json

    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        try:
            return [json.loads(line)["prompt"] for line in lines]
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"{path}: each line must be a JSON object with a prompt") from None
    return lines


def draft_vocab_report(
    data: CachedData,
    target: DataTarget = None,
    size: Annotated[
        list[int] | None,
        typer.Option("--size", metavar="N", help="Draft vocabulary sizes to measure; repeatable."),
    ] = None,
    reps: Annotated[int, typer.Option(help="Timed proposals per size.")] = 7,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the rows to this JSON file.")
    ] = None,
) -> None:
    """What a reduced draft vocabulary saves in c and gives up in coverage, per size.

    Coverage: the share of the target's next tokens in held-out cached sequences that the
    heads could propose. c: one Medusa and one EAGLE proposal over one target call.
    """
    if not (data / "manifest.json").is_file():
        raise UsageError(f"no cached features in {data} (run train-heads with --data first)")
    if reps < 1:
        raise UsageError(f"reps must be at least 1, got {reps}")
    sizes = size or [1024, 4096, 8192, 32768, 1 << 30]
    if min(sizes) < 1:
        raise UsageError("draft vocabulary sizes must be positive")
    from specmlx.bench.report import check_writable

    if json_out is not None:
        check_writable(json_out)  # before minutes of loading and timing
    from rich.console import Console

    from specmlx.api.load import load
    from specmlx.heads.base import target_vocab
    from specmlx.io.files import write_atomic
    from specmlx.training.vocab import report_markdown, rows_json, vocab_report

    err = Console(stderr=True, highlight=False)
    with err.status("loading the target…"):
        models = load(target, default_draft=False)
    with err.status("measuring coverage and proposal costs…"):
        rows = vocab_report(models, data, sizes, reps=reps)
    print(report_markdown(rows, target_vocab(models.target)))
    if json_out is not None:
        import json

        write_atomic(json_out, json.dumps(rows_json(rows), indent=1) + "\n")


def eval_heads(
    heads: Annotated[
        list[Path],
        typer.Option(
            "--heads", metavar="DIR", help="A folder of heads trained here; repeatable, to compare."
        ),
    ],
    data: CachedData,
    target: DataTarget = None,
    fit_temperatures: Annotated[
        bool,
        typer.Option(
            "--fit-temperatures",
            help="Also fit the heads' temperatures (one per Medusa head or EAGLE step) on "
            "the held-out answers and write them to their config.json, where drafting "
            "applies them (train-heads records them without applying them).",
        ),
    ] = False,
) -> None:
    """Held-out top-1 of trained heads on one feature cache: heads trained on other data
    scored on the same held-out text (split and scored as train-heads does), over all
    held-out sequences, then the target's answers alone (what heads draft) and the pieces
    of files alone."""
    if not (data / "manifest.json").is_file():
        raise UsageError(f"no cached features in {data} (run train-heads with --data first)")
    for folder in heads:
        if not (folder / "config.json").is_file():
            raise UsageError(f"{folder} holds no heads (no config.json)")
    if fit_temperatures:
        from specmlx.bench.report import check_writable

        for folder in heads:  # before minutes of loading and scoring
            check_writable(folder / "config.json")
    from rich.console import Console

    from specmlx.api.load import load
    from specmlx.training.evaluate import heldout_temperatures, heldout_top1, write_temperatures

    err = Console(stderr=True, highlight=False)
    with err.status("loading the target…"):
        models = load(target, default_draft=False)
    for folder in heads:
        with err.status(f"scoring {folder}…"):
            scores = heldout_top1(models, folder, data)
        for part, (accuracy, sequences) in scores.items():
            top1 = " ".join(f"{a:.1%}" for a in accuracy)
            print(f"{folder}: held-out top-1 {top1} on {part} ({sequences} sequences)")
        if fit_temperatures:
            with err.status(f"fitting the temperatures of {folder}…"):
                fit = heldout_temperatures(models, folder, data)
            write_temperatures(folder, fit, data)
            print(f"{folder}: {describe_fit(fit)} (written to its config.json)")
