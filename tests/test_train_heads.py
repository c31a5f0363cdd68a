"""Training heads: the feature cache is the target's own and resumable; training lowers the
loss, is deterministic by seed, and a resumed run ends where an uninterrupted one does."""

from __future__ import annotations

import json
import re
import signal

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import specmlx
from specmlx.bench.suites import SUITES, load_suite
from specmlx.engine.features import FeatureSpec, capturing
from specmlx.errors import SpecmlxError, UsageError
from specmlx.heads import load_heads
from specmlx.training.data import (
    Corpus,
    cache_features,
    draft_vocab,
    file_corpus,
    generate_corpus,
    target_features,
    train_prompts,
)
from specmlx.training.shards import open_shards
from specmlx.training.train import TrainConfig, train_heads
from tests.tiny import make_model_dir

PROMPTS = [
    "Write a Python function that adds two numbers.",
    "The capital of France is",
    "Once upon a time there was a little fox",
    "for i in range(10):",
    "Explain speculative decoding.",
    "import numpy as np",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-heads")
    return specmlx.load(str(make_model_dir(root / "target", "llama", seed=1)), progress=False)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-heads-other")
    return specmlx.load(str(make_model_dir(root / "other", "llama", seed=2)), progress=False)


@pytest.fixture(scope="module")
def corpus(models):
    generated = generate_corpus(models, PROMPTS, max_tokens=40, seed=0)
    return Corpus(
        generated.source, len(generated), [generated[i] for i in range(len(generated))].__getitem__
    )


@pytest.fixture(scope="module")
def data_dir(models, corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("features")
    cache_features(models, corpus, FeatureSpec(), folder, shard_tokens=100, progress=False)
    return folder


def fast(**overrides) -> TrainConfig:
    settings = dict(seq_len=16, batch_tokens=64, draft_vocab=96, warmup=2, checkpoint_every=4)
    return TrainConfig(**{**settings, **overrides})


def test_cached_features_are_the_targets_own(models, corpus, data_dir):
    data = open_shards(data_dir, whole=True)
    assert len(data.index.shards) > 1 and data.index.n_sequences == len(corpus)
    for i in range(len(corpus)):
        tokens = corpus[i]
        start, end = int(data.starts[i]), int(data.starts[i + 1])
        assert data.tokens[start:end].tolist() == tokens
        with capturing(models.target, FeatureSpec()) as seen:
            logits = models.target(mx.array(tokens, mx.uint32)[None])[0]
        own = seen.latest()[0]
        assert mx.allclose(data.features[start:end].astype(mx.float32), own, atol=1e-2, rtol=1e-2)
        assert data.nexts[start:end].tolist() == mx.argmax(logits, axis=-1).tolist()
    # A long sequence goes through in pieces, with the same result.
    whole, _, none = target_features(models.target, corpus[0], FeatureSpec())
    pieces, _, _ = target_features(models.target, corpus[0], FeatureSpec(), chunk=7)
    assert none is None  # the final state is the features themselves
    assert mx.allclose(whole.astype(mx.float32), pieces.astype(mx.float32), atol=1e-2)
    counts = data.index.count_array(models.vocab_size)
    assert counts.sum() == data.index.n_tokens == len(data.tokens)


def test_an_interrupted_cache_resumes_from_its_shards(models, corpus, data_dir, tmp_path):
    made, stops = [], [5]  # the first run stops while making sequence 5

    def make(i: int) -> list[int]:
        if i in stops:
            stops.clear()
            raise KeyboardInterrupt
        made.append(i)
        return corpus[i]

    cut = Corpus(corpus.source, len(corpus), make)
    with pytest.raises(KeyboardInterrupt):
        cache_features(models, cut, FeatureSpec(), tmp_path, shard_tokens=100, progress=False)
    partial = open_shards(tmp_path)
    assert not partial.index.complete and partial.index.n_sequences == 5  # none made is lost
    with pytest.raises(SpecmlxError, match="cut short"):
        open_shards(tmp_path, whole=True)
    made.clear()
    cache_features(models, cut, FeatureSpec(), tmp_path, shard_tokens=100, progress=False)
    assert made[0] == 5  # nothing made again
    resumed, whole = open_shards(tmp_path, whole=True), open_shards(data_dir, whole=True)
    assert np.array_equal(resumed.tokens, whole.tokens)
    assert mx.array_equal(resumed.features, whole.features)


def test_the_manifest_rejects_another_target_and_other_data(models, other, corpus, data_dir):
    with pytest.raises(SpecmlxError, match="another target"):
        cache_features(other, corpus, FeatureSpec(), data_dir, progress=False)
    with pytest.raises(SpecmlxError, match="another target"):
        train_heads(other, fast(steps=2), data_dir, data_dir.parent / "x", progress=False)
    reseeded = Corpus(corpus.source | {"seed": 1}, len(corpus), corpus.__getitem__)
    with pytest.raises(SpecmlxError, match="source differ"):
        cache_features(models, reseeded, FeatureSpec(), data_dir, progress=False)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_training_lowers_the_loss_and_saves_loadable_heads(models, data_dir, tmp_path, kind):
    lr = {"medusa": 1e-2, "eagle": 3e-3}[kind]
    report = train_heads(models, fast(kind=kind, steps=40, lr=lr), data_dir, tmp_path / "h", False)
    log = json.loads((tmp_path / "h" / "train_log.json").read_text())["steps"]
    first = np.mean([e["loss"] for e in log[:5]])
    assert report.finished and report.steps == 40 and len(log) == 40
    assert report.loss < 0.8 * first
    assert (tmp_path / "h" / "loss.png").stat().st_size > 0
    assert not (tmp_path / "h" / "checkpoint").exists()
    heads = load_heads(tmp_path / "h", models.target, models.tokenizer)
    assert heads.config.training["steps"] == 40 and heads.config.training["seed"] == 0
    assert heads.config.training["data"]["tokens"] == report.data_tokens
    assert heads.d2t is not None and heads.d2t.shape == (96,)


def weights(folder) -> dict[str, mx.array]:
    return mx.load(str(folder / "model.safetensors"))


def same(a: dict[str, mx.array], b: dict[str, mx.array]) -> bool:
    return a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_a_resumed_run_equals_an_uninterrupted_one(models, data_dir, tmp_path, kind):
    config = fast(kind=kind, steps=10, checkpoint_every=4)
    train_heads(models, config, data_dir, tmp_path / "whole", progress=False)
    stopped = train_heads(models, config, data_dir, tmp_path / "cut", False, stop_after=6)
    assert not stopped.finished and stopped.steps == 6
    with pytest.raises(UsageError, match="unfinished run"):
        train_heads(models, config, data_dir, tmp_path / "cut", progress=False)
    with pytest.raises(UsageError, match="lr differ"):
        train_heads(
            models, fast(kind=kind, steps=10, lr=0.5), data_dir, tmp_path / "cut", False, True
        )
    resumed = train_heads(models, config, data_dir, tmp_path / "cut", progress=False, resume=True)
    assert resumed.finished and resumed.steps == 10
    assert same(weights(tmp_path / "whole"), weights(tmp_path / "cut"))
    logs = [json.loads((tmp_path / d / "train_log.json").read_text()) for d in ("whole", "cut")]
    assert logs[0]["steps"] == logs[1]["steps"]


def test_the_same_seed_gives_the_same_weights(models, data_dir, tmp_path):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        config = fast(kind="eagle", steps=4, seed=seed)
        train_heads(models, config, data_dir, tmp_path / name, progress=False)
    assert same(weights(tmp_path / "a"), weights(tmp_path / "b"))
    assert not same(weights(tmp_path / "a"), weights(tmp_path / "c"))


def test_batched_generation_gives_the_plain_greedy_answers(models, corpus):
    batched = generate_corpus(models, PROMPTS, max_tokens=40, seed=0, batch_size=4)
    assert [batched[i] for i in range(len(PROMPTS))] == [corpus[i] for i in range(len(corpus))]


def test_eagle_trains_on_soft_targets_uncompiled(models, data_dir, tmp_path):
    config = fast(kind="eagle", steps=3, soft_targets=True, compile=False)
    report = train_heads(models, config, data_dir, tmp_path / "soft", progress=False)
    assert report.finished and np.isfinite(report.loss) and len(report.losses) == 2


def test_the_draft_vocabulary_is_the_most_frequent_tokens_and_the_stop_tokens():
    counts = np.array([5, 0, 9, 9, 1, 3])
    assert draft_vocab(counts, 3).tolist() == [2, 3, 0]
    assert draft_vocab(counts, 3, always=[1]).tolist() == [2, 3, 1]
    assert draft_vocab(counts, 3, always=[2, 1]).tolist() == [2, 3, 1]


def test_file_corpus_cuts_files_and_folders_into_sequences(models, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("def fibonacci(n):\n    return n\n" * 20)
    (tmp_path / "src" / "b.txt").write_text("The quick brown fox jumps over the lazy dog. " * 10)
    (tmp_path / "src" / ".hidden").mkdir()
    (tmp_path / "src" / ".hidden" / "c.py").write_text("print(1)\n" * 50)
    (tmp_path / "src" / "blob.bin").write_bytes(bytes(range(256)))
    folder = file_corpus([tmp_path / "src"], models.tokenizer, seq_len=32)
    globbed = file_corpus([str(tmp_path / "src" / "*.py")], models.tokenizer, seq_len=32)
    assert folder.source["files"] == 2 and globbed.source["files"] == 1
    assert all(16 <= len(folder[i]) <= 32 for i in range(len(folder)))
    assert len(folder) > len(globbed) > 1
    with pytest.raises(UsageError, match="no files match"):
        file_corpus([str(tmp_path / "*.rs")], models.tokenizer)


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def test_no_bench_prompt_is_in_the_training_prompts():
    training = train_prompts()
    assert len(training) >= 150 and len(set(training)) == len(training)
    for suite in SUITES:
        for prompt in load_suite(suite).prompts:
            assert prompt.text not in training
            # Nor a near copy: no training prompt shares most of a bench prompt's words.
            bench = words(prompt.text)
            for text in training:
                overlap = len(bench & words(text)) / len(bench | words(text))
                assert overlap < 0.5, (prompt.id, text)


def test_ctrl_c_checkpoints_the_step_under_way_and_the_run_resumes(
    models, data_dir, tmp_path, monkeypatch
):
    from specmlx.training import objectives

    config = fast(steps=8, checkpoint_every=100)
    train_heads(models, config, data_dir, tmp_path / "whole", progress=False)
    positions = objectives.Windows.positions

    def interrupted(self, step):
        if step == 3:  # Ctrl-C while step 4 is being prepared
            signal.raise_signal(signal.SIGINT)
        return positions(self, step)

    monkeypatch.setattr(objectives.Windows, "positions", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_heads(models, config, data_dir, tmp_path / "cut", progress=True)
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    resumed = train_heads(models, config, data_dir, tmp_path / "cut", progress=True, resume=True)
    assert resumed.finished
    log = json.loads((tmp_path / "cut" / "train_log.json").read_text())["steps"]
    assert same(weights(tmp_path / "whole"), weights(tmp_path / "cut")) and len(log) == 8


def test_an_unrolled_eagle_step_scores_the_head_on_its_own_predictions(models, data_dir):
    """unroll=2 adds a second step fed the head's own predicted features: the first step's
    terms are those of unroll=1, the total grows, and each step has its accuracy."""
    from specmlx.heads.base import HeadsConfig, target_vocab
    from specmlx.heads.eagle import EagleHead
    from specmlx.training.objectives import Windows, eagle_batch, eagle_loss, t2d_table
    from specmlx.training.train import target_args

    data = open_shards(data_dir, whole=True)
    vocab = target_vocab(models.target)
    config = HeadsConfig(
        kind="eagle",
        hidden_size=models.target.args.hidden_size,
        target_vocab=vocab,
        draft_vocab=vocab,
        target_args=target_args(models),
    )
    head = EagleHead.create(config, models.target)
    span = Windows(data, 16, 2, seed=0).positions(0)
    one = eagle_batch(data, *span, t2d_table(None, vocab), unroll=1)
    two = eagle_batch(data, *span, t2d_table(None, vocab), unroll=2)
    loss1, terms1, acc1 = eagle_loss(head, *one, ce_weight=0.1, soft=False)
    loss2, terms2, acc2 = eagle_loss(head, *two, ce_weight=0.1, soft=False)
    assert mx.allclose(terms1, terms2) and acc2.shape == (2,) and acc1.shape == (1,)
    assert loss2.item() > loss1.item()


def test_progress_goes_to_a_log_as_plain_lines(monkeypatch, capsys):
    """Where stderr is not a terminal (make > log, CI) a live bar shows nothing: a line every
    LOG_EVERY seconds and one at the end say how far a long run has got."""
    from specmlx import progress

    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)
    with progress.progress_bar(True, "caching features", 3, completed=1) as bar:
        bar.advance("100 tokens")
        bar.advance("250 tokens")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("caching features: 2/3, 0:00 elapsed") and "100 tokens" in lines[0]
    assert lines[1].startswith("caching features: 3/3") and lines[1] == lines[2]
    monkeypatch.setattr(progress, "LOG_EVERY", 3600.0)
    with progress.progress_bar(True, "training eagle", 5) as bar:
        bar.advance("loss 1.0")
    # Only the closing line: the interval has not passed.
    assert capsys.readouterr().err.splitlines() == ["training eagle: 1/5, 0:00 elapsed  loss 1.0"]


def test_coverage_counts_on_some_sequences_and_scores_the_held_out_ones():
    from specmlx.training.shards import FeatureData, FeatureIndex
    from specmlx.training.vocab import coverage

    # Sequence 0 (held out) and 2 (held out with hold_every=2); 1 and 3 are counted.
    tokens = np.array([5, 5, 6, 6, 6, 7, 9, 9, 1, 6, 6, 7], np.int32)
    nexts = np.array([6, 8, 6, 7, 9, 2, 9, 9, 1, 7, 7, 6], np.int32)
    starts = np.array([0, 2, 6, 9, 12])
    data = FeatureData({"eos_ids": [2]}, FeatureIndex(), tokens, nexts, mx.zeros((12, 4)), starts)
    # Counted, from sequences 1 and 3 ([6, 6, 6, 7] and [6, 6, 7]): 6 five times, 7 twice.
    # Held out next tokens: [6, 8] and [9, 9, 1].
    got = coverage(data, [1, 2, 3, 16], vocab=16, hold_every=2)
    # V_d 1: {2} (the stop token replaces 6); 2: {6, 2}; 3: {6, 7, 2}; 16: every id.
    assert got == {1: 0.0, 2: pytest.approx(1 / 5), 3: pytest.approx(1 / 5), 16: 1.0}
    # The first position of sequence 0 and two of sequence 2 are prompt: [8] and [1] remain.
    got = coverage(data, [2, 16], vocab=16, hold_every=2, skip=[1, 0, 2, 0])
    assert got == {2: 0.0, 16: 1.0}
    # Sequences 0 and 2 answer one prompt, 1 and 3 another: held out by group, 0 and 2 still.
    assert coverage(data, [1, 2, 3, 16], vocab=16, hold_every=2, groups=[0, 1, 0, 1]) == {
        1: 0.0,
        2: pytest.approx(1 / 5),
        3: pytest.approx(1 / 5),
        16: 1.0,
    }
    # Groups of two: held out are 0 and 1 (group 0), counted 2 and 3 ([9, 9, 1] and [6, 6, 7]).
    # V_d 3: 6 and 9 (twice each), the stop token 2 in place of 1; held out nexts
    # [6, 8, 6, 7, 9, 2]: four of six covered.
    held = coverage(data, [3], vocab=16, hold_every=2, groups=[0, 0, 1, 1])
    assert held == {3: pytest.approx(4 / 6)}


def test_prompt_positions_are_told_for_the_shipped_prompts_and_the_given_ones(models):
    from specmlx.api.generate import encode_prompt
    from specmlx.training.data import prompt_positions, prompt_set_sha256, train_prompts

    prompts = train_prompts()[:3]
    generated = {"kind": "generated", "prompts": 3, "prompts_sha256": prompt_set_sha256(prompts)}
    generated["chat_template"] = True
    files = {"kind": "files", "files": 1, "sha256": "x", "seq_len": 512}

    def skip(source, n=5, given=None):  # 3 answers, then 2 pieces of files
        return prompt_positions(models, source, n, given)

    lengths = [len(encode_prompt(models, p, True)) - 1 for p in prompts]
    assert skip({"parts": [generated, files]}) == lengths + [0, 0]
    assert skip(generated)[:3] == lengths
    own = ["my own", "prompts", "here"]
    mine = generated | {"prompts_sha256": prompt_set_sha256(own)}
    assert skip({"parts": [mine, files]}) is None
    mine_lengths = [len(encode_prompt(models, p, True)) - 1 for p in own]
    assert skip({"parts": [mine, files]}, given=own) == mine_lengths + [0, 0]
    assert skip({"parts": [files, generated]}) is None
    sampled = generated | {"samples": 2}  # 2 answers to each of the 3 prompts, then 2 pieces
    assert skip({"parts": [sampled, files]}, n=8) == lengths * 2 + [0, 0]


def test_the_draft_vocab_report_measures_every_size(models, data_dir, tmp_path):
    from typer.testing import CliRunner

    from specmlx.cli import app
    from specmlx.training.vocab import vocab_report

    rows = vocab_report(models, data_dir, [16, 64, 10**6], reps=2)
    vocab = models.target.args.vocab_size
    assert [r.draft_vocab for r in rows] == [16, 64, vocab]
    assert rows[0].coverage <= rows[1].coverage <= rows[2].coverage == 1.0
    assert all(r.medusa_c > 0 and r.eagle_c > 0 for r in rows)
    assert not rows[0].answers_only  # the test's own prompts: not the shipped set
    with pytest.raises(UsageError, match="above 1"):  # the tiny tokenizer's one stop token
        vocab_report(models, data_dir, [1], reps=1)
    out = tmp_path / "vocab.json"
    target = str(models.target_path)
    result = CliRunner().invoke(
        app,
        [
            "draft-vocab",
            "--target",
            target,
            "--data",
            str(data_dir),
            "--size",
            "16",
            "--reps",
            "1",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "| 16 |" in result.stdout and json.loads(out.read_text())[0]["draft_vocab"] == 16
    result = CliRunner().invoke(app, ["draft-vocab", "--data", str(tmp_path / "none")])
    assert result.exit_code != 0 and "no cached features" in result.output
    missing = tmp_path / "no-such-folder" / "vocab.json"
    result = CliRunner().invoke(
        app, ["draft-vocab", "--data", str(data_dir), "--json", str(missing)]
    )
    assert result.exit_code != 0 and "does not exist" in result.output  # before any loading


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_eval_heads_scores_the_held_out_text_as_training_did(models, data_dir, tmp_path, kind):
    """Scored again from their saved weights, heads get the held-out top-1 their training
    recorded for them (the best evaluation's); a folder without heads is a one-line error."""
    from typer.testing import CliRunner

    from specmlx.cli import app
    from specmlx.training.evaluate import heldout_top1

    config = fast(kind=kind, steps=8, checkpoint_every=4, holdout=2)
    train_heads(models, config, data_dir, tmp_path / "h", progress=False)
    recorded = load_heads(tmp_path / "h", models.target, None).config.training
    scores = heldout_top1(models, tmp_path / "h", data_dir)
    assert set(scores) == {"all", "answers"}  # the cache holds no files
    accuracy, sequences = scores["all"]
    assert sequences == 3 and scores["answers"] == scores["all"]  # answers to 1, 3 and 5 of 6
    assert accuracy == pytest.approx(recorded["heldout_accuracy"], abs=2e-4)
    assert len(accuracy) == (4 if kind == "medusa" else 2)
    args = ["eval-heads", "--target", str(models.target_path), "--data", str(data_dir)]
    result = CliRunner().invoke(app, [*args, "--heads", str(tmp_path / "h")])
    assert result.exit_code == 0, result.output
    assert f"held-out top-1 {accuracy[0]:.1%}" in result.stdout and " on all (" in result.stdout
    assert " on answers (3 sequences)" in result.stdout  # the cache has no files
    assert " on files " not in result.stdout
    result = CliRunner().invoke(app, [*args, "--heads", str(tmp_path)])
    assert result.exit_code != 0 and "holds no heads" in result.output
    trained_without = fast(kind=kind, steps=2, holdout=0)
    train_heads(models, trained_without, data_dir, tmp_path / "all", progress=False)
    with pytest.raises(UsageError, match="nothing held out"):
        heldout_top1(models, tmp_path / "all", data_dir)


def test_sampled_answers_follow_the_greedy_ones_prompt_by_prompt(models, corpus):
    from specmlx.api.generate import encode_prompt

    plain = generate_corpus(models, PROMPTS[:3], max_tokens=12, samples=2, temperature=1.0)
    batched = generate_corpus(models, PROMPTS[:3], 12, samples=2, temperature=1.0, batch_size=2)
    assert len(plain) == len(batched) == 6
    assert plain.source["samples"] == 2 and plain.source["sampled"]["temperature"] == 1.0
    greedy = generate_corpus(models, PROMPTS[:3], max_tokens=12)
    for made in (plain, batched):
        sequences = [made[j] for j in range(6)]
        assert sequences[:3] == [greedy[i] for i in range(3)]  # answer 0: the greedy one
        for i, prompt in enumerate(PROMPTS[:3]):  # answer 1 to prompt i is sequence 3 + i
            ids = encode_prompt(models, prompt, True)
            assert sequences[3 + i][: len(ids)] == ids
        assert sequences[3:] != sequences[:3]  # sampled at T=1 from a random tiny model
        assert [made[j] for j in range(6)] == sequences  # the same whenever made


def test_the_answers_to_one_prompt_are_one_group():
    from specmlx.training.data import sequence_groups
    from specmlx.training.train import split_sequences

    generated = {"kind": "generated", "prompts": 3, "samples": 2}
    files = {"kind": "files", "files": 1}
    assert sequence_groups(generated, 6) == [0, 1, 2, 0, 1, 2]
    assert sequence_groups({"parts": [generated, files]}, 8) == [0, 1, 2, 0, 1, 2, 3, 4]
    nested = {"parts": [{"parts": [generated, generated | {"samples": 1}]}, files]}
    assert sequence_groups(nested, 10) == [0, 1, 2, 0, 1, 2, 3, 4, 5, 6]
    assert sequence_groups(files, 3) == [0, 1, 2]
    assert split_sequences([0, 1, 2, 0, 1, 2, 3, 4], 2) == ([0, 2, 3, 5, 7], [1, 4, 6])
    assert split_sequences([0, 1, 2], 0) == ([0, 1, 2], [])


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_held_out_sequences_are_scored_and_never_trained_on(models, data_dir, tmp_path, kind):
    from specmlx.training.objectives import Windows

    data = open_shards(data_dir, whole=True)
    # 6 answers: with holdout 2, answers 1, 3 and 5 are held out.
    windows = Windows(data, 16, 4, seed=0, sequences=[0, 2, 4])
    trained = {i for i in range(6) if i % 2 == 0}
    for step in range(6):
        pos, _, _, segments = windows.positions(step)
        owners = np.searchsorted(data.starts, pos, side="right") - 1
        assert set(owners[segments >= 0].tolist()) <= trained
    held = Windows(data, 16, 4, seed=0, sequences=[1, 3, 5])
    rows = np.concatenate([pos for pos, _, _, _ in held.in_order()])
    assert (rows == held.pos).all()  # every window once, in order
    packed = held.pos[held.segments >= 0]  # every position of theirs once
    assert sorted(packed.tolist()) == [
        p for i in (1, 3, 5) for p in range(int(data.starts[i]), int(data.starts[i + 1]))
    ]

    config = fast(kind=kind, steps=10, checkpoint_every=4, holdout=2)
    report = train_heads(models, config, data_dir, tmp_path / "h", progress=False)
    log = json.loads((tmp_path / "h" / "train_log.json").read_text())
    assert [e["step"] for e in log["steps"] if "heldout" in e] == [4, 8, 10]
    assert log["data"]["heldout_sequences"] == 3
    assert len(report.heldout) == {"medusa": 4, "eagle": 2}[kind]
    assert all(0 <= a <= 1 for a in report.heldout)
    heads = load_heads(tmp_path / "h", models.target, models.tokenizer)
    best = heads.config.training["best_step"]
    assert list(report.heldout) == next(e["heldout"] for e in log["steps"] if e["step"] == best)
    scores = {e["step"]: np.mean(e["heldout"]) for e in log["steps"] if "heldout" in e}
    assert scores[best] == max(scores.values())
    assert heads.config.training["heldout_accuracy"] == list(report.heldout)
    whole = train_heads(
        models, fast(kind=kind, steps=2, holdout=0), data_dir, tmp_path / "w", False
    )
    assert whole.heldout == ()
    trained = json.loads((tmp_path / "w" / "train_log.json").read_text())["data"]["windows"]
    assert log["data"]["windows"] < trained  # the held-out answers' windows are not trained on


def test_the_draft_vocabulary_is_counted_on_the_trained_sequences_only(models, data_dir, tmp_path):
    from specmlx.training.train import split_sequences

    data = open_shards(data_dir, whole=True)
    trained, held = split_sequences(list(range(6)), 2)
    counts = np.zeros(models.vocab_size, np.int64)
    for i in trained:
        counts += np.bincount(
            data.tokens[data.starts[i] : data.starts[i + 1]], minlength=len(counts)
        )
    config = fast(steps=1, holdout=2, draft_vocab=24)
    train_heads(models, config, data_dir, tmp_path / "h", progress=False)
    heads = load_heads(tmp_path / "h", models.target, models.tokenizer)
    expected = draft_vocab(counts, 24, data.manifest["eos_ids"])
    assert np.array(heads.d2t).tolist() == expected.tolist()
    everything = draft_vocab(
        data.index.count_array(models.vocab_size), 24, data.manifest["eos_ids"]
    )
    assert expected.tolist() != everything.tolist()  # the held-out answers would change it
    recorded = (tmp_path / "h" / "config.json").read_text()
    assert str(data_dir) not in recorded and "dir" not in json.loads(recorded)["training"]["data"]


def test_feature_noise_is_bounded_drawn_per_step_and_resumes_alike(models, data_dir, tmp_path):
    from specmlx.training.objectives import with_noise

    batch = (mx.zeros((2, 8, 4)), mx.ones((2, 8)))
    assert with_noise(batch, 0.0, 0, 3) is batch
    a, b, c = (with_noise(batch, 0.5, 0, s)[0] for s in (3, 3, 4))
    assert mx.array_equal(a, b) and not mx.array_equal(a, c)
    assert 0 < mx.abs(a).max().item() <= 0.5 and mx.array_equal(
        with_noise(batch, 0.5, 0, 3)[1], batch[1]
    )

    config = fast(kind="eagle", steps=8, checkpoint_every=4, feature_noise=0.3)
    train_heads(models, config, data_dir, tmp_path / "whole", progress=False)
    train_heads(models, config, data_dir, tmp_path / "cut", False, stop_after=5)
    train_heads(models, config, data_dir, tmp_path / "cut", progress=False, resume=True)
    assert same(weights(tmp_path / "whole"), weights(tmp_path / "cut"))
    train_heads(models, fast(kind="eagle", steps=8), data_dir, tmp_path / "quiet", False)
    assert not same(weights(tmp_path / "whole"), weights(tmp_path / "quiet"))


def test_training_stops_when_held_out_accuracy_stops_rising(models, data_dir, tmp_path):
    """With patience 2, a run whose held-out score never rises (a rate too small to move
    it) stops two evaluations after its first, and publishes the heads of that first one:
    the weights a run stopped there leaves in its checkpoint."""
    config = fast(kind="medusa", steps=40, checkpoint_every=4, holdout=2, patience=2, lr=1e-9)
    report = train_heads(models, config, data_dir, tmp_path / "h", progress=False)
    training = load_heads(tmp_path / "h", models.target, models.tokenizer).config.training
    assert report.finished and report.steps == 12 and report.total_steps == 40
    assert training["steps"] == 12 and training["best_step"] == 4
    assert training["planned_steps"] == 40
    log = json.loads((tmp_path / "h" / "train_log.json").read_text())
    assert log["steps"][-1].get("converged") and len(log["steps"]) == 12
    train_heads(models, config, data_dir, tmp_path / "cut", False, stop_after=4)
    state = mx.load(str(tmp_path / "cut" / "checkpoint" / "state.safetensors"))
    at_best = {k.removeprefix("heads."): v for k, v in state.items() if k.startswith("heads.")}
    heads = load_heads(tmp_path / "h", models.target, models.tokenizer)
    published = dict(tree_flatten(heads.parameters()))
    assert at_best and all(mx.array_equal(published[k], v) for k, v in at_best.items())
    kept = {k.removeprefix("best."): v for k, v in state.items() if k.startswith("best.")}
    assert kept.keys() == at_best.keys()  # the checkpoint keeps the best weights for a resume
    with pytest.raises(UsageError, match="holdout"):
        fast(patience=2, holdout=0)


def test_prompt_positions_are_read_but_never_scored(models, data_dir):
    from specmlx.training.objectives import Windows, eagle_batch, medusa_batch, t2d_table

    data = open_shards(data_dir, whole=True)
    t2d = t2d_table(None, models.vocab_size)
    skip = [20] * 6  # positions 0..19 have a prompt token next: the answer starts at 21
    windows = Windows(data, 16, 4, seed=0, skip=skip)
    starts = data.starts[:-1]
    # Heads at position j draft token j+2: position 19 drafts the answer's first token, the
    # first scored; the positions before it are read as context.
    real = windows.segments >= 0
    owner = np.searchsorted(data.starts, windows.pos[real], side="right") - 1
    assert (windows.firsts[real] == starts[owner] + 19).all()
    pos, end, first, segments = windows.positions(0)
    scored = (pos >= first) & (pos + 1 < end)
    assert scored.any() and not scored.all()
    valid = np.array(eagle_batch(data, pos, end, first, segments, t2d, unroll=1)[5])
    assert (valid == scored).all()
    _, labels, medusa_valid = medusa_batch(data, pos, end, first, segments, t2d, heads=2)
    medusa_valid, labels = np.array(medusa_valid), np.array(labels)
    assert (medusa_valid[0] == scored).all()
    assert (medusa_valid[1] == ((pos >= first) & (pos + 2 < end))).all()
    # Head i's label is the target's greedy token after token j+1+i, as EAGLE's.
    for i in range(2):
        ahead = np.minimum(pos + 1 + i, end - 1)
        assert (labels[i] == np.where(medusa_valid[i], data.nexts[ahead], -1)).all()
    # A sequence with nothing to score (all prompt) is left out of the stream.
    lengths = np.diff(data.starts)
    all_prompt = Windows(data, 16, 4, seed=0, skip=[int(lengths[0]) - 1] + [0] * 5)
    kept = all_prompt.pos[all_prompt.segments >= 0]
    assert (np.searchsorted(data.starts, kept, side="right") - 1 > 0).all()
    # (the others whole, but for a last piece too short to score: under 3 positions)
    assert 0 <= int(lengths[1:].sum()) - all_prompt.n_tokens <= 2 * 5


def test_the_first_scored_position_drafts_the_answers_first_token(models, data_dir):
    """With the real prompts: at the first scored position, Medusa's first head and EAGLE's
    first step are both labelled with the answer's first token; the position before is not
    scored."""
    from specmlx.api.generate import encode_prompt
    from specmlx.training.data import prompt_positions
    from specmlx.training.objectives import Windows, eagle_batch, medusa_batch, t2d_table

    data = open_shards(data_dir, whole=True)
    t2d = t2d_table(None, models.vocab_size)
    skip = prompt_positions(models, data.manifest["source"], 6, PROMPTS)
    assert skip is not None
    windows = Windows(data, 64, 1, seed=0, skip=skip)
    checked = set()
    for pos, end, first, segments in windows.in_order():
        _, medusa_labels, medusa_valid = medusa_batch(data, pos, end, first, segments, t2d, heads=1)
        eagle = eagle_batch(data, pos, end, first, segments, t2d, unroll=1)
        for j in np.flatnonzero((pos[0] == first[0]) & (segments[0] >= 0)).tolist():
            owner = int(np.searchsorted(data.starts, pos[0, j], side="right") - 1)
            answer = int(data.starts[owner]) + len(encode_prompt(models, PROMPTS[owner], True))
            assert int(medusa_labels[0, 0, j]) == int(data.tokens[answer])
            assert int(eagle[4][0, j]) == int(data.tokens[answer])
            if j > 0:
                assert not bool(medusa_valid[0, 0, j - 1]) and not bool(eagle[5][0, j - 1])
            checked.add(owner)
    assert checked == set(range(6))


def test_training_scores_answers_when_it_can_tell_the_prompts(models, data_dir, tmp_path):
    answers = fast(steps=2, answers_only=True, holdout=2)
    told = train_heads(models, answers, data_dir, tmp_path / "a", False, prompts=PROMPTS)
    untold = train_heads(models, answers, data_dir, tmp_path / "b", False)
    every = train_heads(
        models, fast(steps=2, holdout=2), data_dir, tmp_path / "c", False, prompts=PROMPTS
    )
    logs = [json.loads((tmp_path / d / "train_log.json").read_text())["data"] for d in "abc"]
    assert [log["trained_on"] for log in logs] == ["answers", "all positions", "all positions"]
    assert [log["heldout_scored"] for log in logs] == ["answers", "all positions", "answers"]
    assert logs[0]["windows"] <= logs[1]["windows"] == logs[2]["windows"]
    assert told.finished and untold.finished and every.finished
    assert not same(weights(tmp_path / "a"), weights(tmp_path / "c"))  # the prompts masked
    # Held-out scores count answers where the prompts are told, whatever is trained on.
    plain = train_heads(models, fast(steps=2, holdout=2), data_dir, tmp_path / "d", False)
    assert same(weights(tmp_path / "c"), weights(tmp_path / "d"))  # the same training
    assert every.heldout != plain.heldout


def test_held_out_answers_and_files_are_scored_apart_and_answers_choose(models, corpus, tmp_path):
    """Held out from answers and pieces of files, each part is scored apart (all of them
    together too, position by position), and the heads published are those of the best
    score on the answers, which heads draft; eval-heads scores each part as training did."""
    from specmlx.training.evaluate import heldout_top1
    from specmlx.training.train import heldout_score

    for i in range(8):
        (tmp_path / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 10)
    data = corpus + file_corpus([tmp_path], models.tokenizer, seq_len=64)
    cache_features(models, data, FeatureSpec(), tmp_path / "data", progress=False)
    config = fast(kind="medusa", steps=16, checkpoint_every=4, holdout=2, lr=3e-3)
    report = train_heads(models, config, tmp_path / "data", tmp_path / "h", progress=False)
    log = json.loads((tmp_path / "h" / "train_log.json").read_text())
    held = [entry for entry in log["steps"] if "heldout" in entry]
    assert len(held) == 4 and log["data"]["chosen_by"] == "held-out answers"
    for entry in held:
        answers, files = entry["heldout_parts"]["answers"], entry["heldout_parts"]["files"]
        for every, a, f in zip(entry["heldout"], answers, files, strict=True):
            assert min(a, f) - 1e-4 <= every <= max(a, f) + 1e-4  # a mean of the two
    on_answers = {entry["step"]: np.mean(entry["heldout_parts"]["answers"]) for entry in held}
    training = load_heads(tmp_path / "h", models.target, None).config.training
    best = next(entry for entry in held if entry["step"] == training["best_step"])
    assert on_answers[training["best_step"]] == max(on_answers.values())
    assert training["heldout_parts"] == best["heldout_parts"] == report.heldout_parts
    assert training["heldout_accuracy"] == best["heldout"] == list(report.heldout)
    scores = heldout_top1(models, tmp_path / "h", tmp_path / "data")
    for part in ("answers", "files"):
        assert scores[part][0] == pytest.approx(best["heldout_parts"][part], abs=2e-4)
    assert scores["all"][0] == pytest.approx(best["heldout"], abs=2e-4)
    # The rule itself: answers where there are some, else everything held out.
    assert heldout_score({"heldout": [0.9], "heldout_parts": {"answers": [0.1, 0.3]}}) == 0.2
    assert heldout_score({"heldout": [0.5], "heldout_parts": {"files": [0.9]}}) == 0.5


@pytest.mark.parametrize(
    ("kind", "steps", "lr", "least"), [("medusa", 200, 1e-2, 0.75), ("eagle", 100, 3e-3, 0.6)]
)
def test_heads_that_memorise_their_data_draft_what_the_target_generates(
    models, corpus, data_dir, tmp_path, kind, steps, lr, least
):
    """Training and drafting agree on which token each position guesses: heads trained until
    they know the target's answers keep most of their drafts when the target answers the
    same prompts greedily. (Labels one position off keep under 1%.) Chains of top-1 guesses
    (width 1), so that every drafted token is one guess."""
    from specmlx.api.config import GenerationConfig
    from specmlx.api.methods import EagleOptions, MedusaOptions

    config = TrainConfig(
        kind=kind,
        steps=steps,
        lr=lr,
        seq_len=64,
        batch_tokens=384,
        draft_vocab=None,
        warmup=10,
        holdout=0,
        checkpoint_every=1000,
        adam_beta2=0.999,  # a few hundred steps at a high rate: the slow second moment
    )
    train_heads(models, config, data_dir, tmp_path / "h", progress=False)
    drafting = specmlx.load(str(models.target_path), heads=[str(tmp_path / "h")], progress=False)
    options = {
        "medusa": MedusaOptions(tree_size=5, width=1),
        "eagle": EagleOptions(tree_size=5, depth=4, width=1),
    }[kind]
    accepted = drafted = 0
    for i, prompt in enumerate(PROMPTS):
        generation = GenerationConfig(method=kind, options=options, k=4, max_tokens=40)
        result = specmlx.generate(drafting, prompt, generation)
        assert corpus[i][-len(result.token_ids) :] == result.token_ids  # the data it learned
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert drafted > 0 and accepted / drafted >= least
