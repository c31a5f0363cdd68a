"""EAGLE-3 heads of our own (`train-heads --kind eagle3`): the training-time test's batches
line up with the target's tokens, its unrolled steps compute what drafting computes, and
trained heads load back and draft the target's own tokens."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from typer.testing import CliRunner

import specmlx
from specmlx.api.config import GenerationConfig
from specmlx.api.methods import EagleOptions
from specmlx.cli import app
from specmlx.engine.features import FeatureSpec
from specmlx.errors import UsageError
from specmlx.heads import load_heads
from specmlx.heads.base import HeadsConfig, target_vocab
from specmlx.heads.eagle3 import Eagle3Head
from specmlx.training.data import cache_features, generate_corpus
from specmlx.training.eagle3_objective import draft_layer, eagle3_batch, eagle3_loss, unrolled
from specmlx.training.losses import segment_mask
from specmlx.training.objectives import OBJECTIVES, Windows, t2d_table
from specmlx.training.shards import open_shards
from specmlx.training.train import TrainConfig, check_buildable, target_args, train_heads
from tests.test_train_heads import PROMPTS
from tests.tiny import make_model_dir

LAYERS = (1, 3, 4)  # the reference's low, middle and high layers of an 8-layer target


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle3") / "target"
    make_model_dir(folder, "llama", seed=1, num_hidden_layers=8)
    return specmlx.load(str(folder), progress=False)


@pytest.fixture(scope="module")
def generated(models):
    return generate_corpus(models, PROMPTS, max_tokens=40, seed=0)


@pytest.fixture(scope="module")
def corpus(generated):
    return [generated[i] for i in range(len(generated))]


@pytest.fixture(scope="module")
def data_dir(models, generated, tmp_path_factory):
    folder = tmp_path_factory.mktemp("eagle3-features")
    cache_features(models, generated, FeatureSpec(LAYERS), folder, progress=False)
    return folder


def settings(**overrides) -> TrainConfig:
    base = dict(
        kind="eagle3",
        feature_layers=LAYERS,
        unroll=3,
        seq_len=16,
        batch_tokens=64,
        draft_vocab=96,
        warmup=2,
        checkpoint_every=1000,
    )
    return TrainConfig(**{**base, **overrides})


def fresh_head(models) -> Eagle3Head:
    vocab = target_vocab(models.target)
    config = HeadsConfig(
        kind="eagle3",
        hidden_size=models.target.args.hidden_size,
        target_vocab=vocab,
        draft_vocab=vocab,
        feature_layers=LAYERS,
        target_args=draft_layer(target_args(models), vocab),
    )
    mx.random.seed(3)
    return Eagle3Head.create(config, models.target)


def test_the_default_layers_are_the_references(models):
    assert OBJECTIVES["eagle3"].feature_layers(models.target) == LAYERS


def test_step_s_at_position_j_guesses_the_targets_token_after_j_plus_s(models, data_dir):
    data = open_shards(data_dir, whole=True)
    vocab = target_vocab(models.target)
    d2t = np.arange(0, vocab, 2)  # every other token: the rest fall outside, labels -1
    t2d = t2d_table(d2t, vocab)
    pos, end, first, segments = span = Windows(data, 16, 8, seed=0).positions(0)
    batch = eagle3_batch(data, *span, t2d, unroll=4)
    assert len(batch) == 2 + 3 * 4 and batch[0].shape == (*pos.shape, 3 * 64)
    sequence_of = np.searchsorted(data.starts, pos, side="right") - 1
    for step in range(1, 5):
        tokens, labels, valid = (
            np.array(a) for a in batch[2 + 3 * (step - 1) : 5 + 3 * (step - 1)]
        )
        ahead = pos + step
        assert np.array_equal(valid, (ahead < end) & (pos >= first) & (segments >= 0))
        # Never across a sequence's end: a valid position's token j+s is in its sequence.
        assert np.all(
            np.searchsorted(data.starts, ahead[valid], side="right") - 1 == sequence_of[valid]
        )
        assert np.array_equal(tokens[valid], data.tokens[ahead[valid]])
        assert np.array_equal(labels[valid], t2d[data.nexts[ahead[valid]]])
        assert np.all(labels[~valid] == -1)
        assert 0 < valid.sum() and np.any(labels[valid] == -1)  # out of the draft vocab


def test_each_test_step_computes_what_drafting_computes(models, data_dir):
    """Row j of step s attends to the first step's rows up to j (the target's features) and
    to its own earlier steps (its ancestors), rotated s-1 positions on: what the head gives
    drafting a chain after position j through its KV cache."""
    data = open_shards(data_dir, whole=True)
    head = fresh_head(models)
    start, stop = int(data.starts[2]), int(data.starts[3])
    pos = np.arange(start, stop)[None]  # one window: the whole of sequence 2
    span = (pos, np.full_like(pos, stop), np.full_like(pos, start), np.full_like(pos, 2))
    batch = eagle3_batch(data, *span, t2d_table(None, target_vocab(models.target)), unroll=3)
    features, mask, steps = batch[0], batch[1], batch[2:]
    hidden = unrolled(head, features, mask, list(steps[0::3]))
    tokens = data.tokens[start:stop]
    for j in (0, 5, stop - start - 4):
        cache = head.make_cache()
        drafted = head(features[0, : j + 1], mx.array(tokens[1 : j + 2]), cache)[-1:]
        assert mx.allclose(drafted[0], hidden[0][0, j], atol=1e-4)
        for step in (2, 3):
            drafted = head(drafted, mx.array(tokens[j + step : j + step + 1]), cache)
            assert mx.allclose(drafted[0], hidden[step - 1][0, j], atol=1e-4), (j, step)
    # The first step is the same however many follow; each step has its term and accuracy.
    loss3, terms3, accuracy3 = eagle3_loss(head, *batch)
    loss1, terms1, _ = eagle3_loss(head, *batch[:5])
    assert mx.allclose(terms1[0], terms3[0]) and terms3.shape == accuracy3.shape == (3,)
    assert loss3.item() > loss1.item()


class _ConcatenatedKeys:
    """The reference's training-time test (SpecForge): each step's keys and values after
    the last's in one cache, rotated `offset` positions on."""

    def __init__(self) -> None:
        self.offset = 0
        self.keys = self.values = None

    def update_and_fetch(self, keys, values):
        if self.keys is not None:
            keys = mx.concatenate([self.keys, keys], axis=2)
            values = mx.concatenate([self.values, values], axis=2)
        self.keys, self.values = keys, values
        return keys, values


def _reference_steps(head, features, mask, tokens):
    """The reference's test steps: every step's keys after the last's, under the window's
    mask for the first step's and each row's own position for the later steps'."""
    cache = _ConcatenatedKeys()
    own = mx.broadcast_to(mx.eye(mask.shape[-1], dtype=mx.bool_), mask.shape)
    inputs, states = features, []
    for i, step_tokens in enumerate(tokens):
        cache.offset = i
        seen = mx.concatenate([mask] + [own] * i, axis=-1)
        inputs = head(inputs, step_tokens, cache=[cache], mask=seen)
        states.append(inputs)
    return states


def test_test_steps_attend_as_the_references_concatenated_keys_and_masks(models):
    """Scoring only the diagonals of the later steps' blocks gives what the reference's
    (s x L)-wide masked attention gives, on packed windows of several pieces: the hidden
    states and the gradients the heads train on."""
    head = fresh_head(models)
    mx.random.seed(4)
    width = len(LAYERS) * models.target.args.hidden_size
    features = mx.random.normal((2, 12, width))
    segments = np.array([[0] * 3 + [1] * 4 + [2] * 5, [0] * 7 + [1] * 5])
    mask = segment_mask(segments)
    tokens = [mx.random.randint(0, target_vocab(models.target), (2, 12)) for _ in range(3)]
    expected = _reference_steps(head, features, mask, tokens)
    for got, want in zip(unrolled(head, features, mask, tokens), expected, strict=True):
        assert mx.allclose(got, want, atol=1e-5)

    def loss(steps):
        def of(model):
            states = steps(head, features, mask, tokens)
            return sum((h * mx.arange(h.shape[-1])).sum() for h in states)

        return nn.value_and_grad(head, of)(head)[1]

    got, want = loss(unrolled), loss(_reference_steps)
    for (name, g), (_, w) in zip(tree_flatten(got), tree_flatten(want), strict=True):
        assert mx.allclose(g, w, rtol=1e-4, atol=1e-4 * mx.abs(w).max().item()), name


def test_training_lowers_the_loss_and_the_heads_draft_the_targets_tokens(
    models, data_dir, tmp_path
):
    config = settings(steps=40, lr=3e-3, holdout=2)
    report = train_heads(models, config, data_dir, tmp_path / "h", False)
    log = json.loads((tmp_path / "h" / "train_log.json").read_text())["steps"]
    assert report.finished and len(report.losses) == len(report.accuracy) == 3
    # Its temperatures are fitted on what the held-out top-1 scores, step by step.
    fitted = report.calibration
    assert fitted is not None and len(fitted.temperatures) == 3
    heldout = report.heldout_parts.get("answers", report.heldout)
    assert fitted.accuracy == pytest.approx(heldout, abs=2e-4)
    assert report.loss < 0.8 * np.mean([entry["loss"] for entry in log[:5]])
    heads = load_heads(tmp_path / "h", models.target, models.tokenizer)
    assert isinstance(heads, Eagle3Head) and heads.config.feature_layers == LAYERS
    assert heads.d2t is not None and heads.d2t.shape == (96,)
    drafting = specmlx.load(str(models.target_path), heads=[str(tmp_path / "h")], progress=False)
    for prompt in PROMPTS[:3]:
        common = dict(k=4, max_tokens=24)
        spec = specmlx.generate(drafting, prompt, GenerationConfig(method="eagle", **common))
        plain = specmlx.generate(models, prompt, GenerationConfig(method="none", **common))
        assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0


def test_a_resumed_run_equals_an_uninterrupted_one(models, data_dir, tmp_path):
    config = settings(steps=6, checkpoint_every=3)
    train_heads(models, config, data_dir, tmp_path / "whole", progress=False)
    stopped = train_heads(models, config, data_dir, tmp_path / "cut", False, stop_after=3)
    assert not stopped.finished
    train_heads(models, config, data_dir, tmp_path / "cut", progress=False, resume=True)
    whole, cut = (mx.load(str(tmp_path / d / "model.safetensors")) for d in ("whole", "cut"))
    assert whole.keys() == cut.keys() and all(mx.array_equal(whole[k], cut[k]) for k in whole)


@pytest.fixture(scope="module")
def small(models, tmp_path_factory):
    """Three short answers, cached: one window holds them all, so that every position is
    trained on its whole context, as drafting reads it (windows cut a sequence's context)."""
    folder = tmp_path_factory.mktemp("eagle3-small")
    generated = generate_corpus(models, PROMPTS[:3], max_tokens=24, seed=0)
    cache_features(models, generated, FeatureSpec(LAYERS), folder, progress=False)
    return folder, [generated[i] for i in range(len(generated))]


def test_heads_that_memorise_their_data_draft_what_the_target_generates(models, small, tmp_path):
    """Training and drafting agree on which token each depth guesses: heads trained until
    they know the target's answers keep most of their drafts when the target answers the
    same prompts greedily. Chains of top-1 guesses, as deep as the test steps trained."""
    data_dir, corpus = small
    config = settings(
        steps=50, lr=1e-2, seq_len=256, batch_tokens=256, draft_vocab=None, warmup=5, holdout=0
    )
    report = train_heads(models, config, data_dir, tmp_path / "h", progress=False)
    assert min(report.accuracy) > 0.9, report.accuracy
    drafting = specmlx.load(str(models.target_path), heads=[str(tmp_path / "h")], progress=False)
    options = EagleOptions(tree_size=4, depth=3, width=1)
    accepted = drafted = 0
    for i, prompt in enumerate(PROMPTS[:3]):
        generation = GenerationConfig(method="eagle", options=options, k=3, max_tokens=24)
        result = specmlx.generate(drafting, prompt, generation)
        assert corpus[i][-len(result.token_ids) :] == result.token_ids  # the data it learned
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert drafted > 0 and accepted / drafted >= 0.8, accepted / drafted


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"unroll": 2}, "3 or more test steps"),
        ({"feature_layers": (4,)}, "2 or more target layers"),
        ({"soft_targets": True}, "not soft targets"),
    ],
)
def test_settings_eagle3_is_not_trained_with_are_refused(
    models, data_dir, tmp_path, overrides, needle
):
    config = settings(steps=2, **overrides)
    with pytest.raises(UsageError, match=needle):
        check_buildable(models, config)
    if "feature_layers" not in overrides:  # (another cache's layers: refused before that)
        with pytest.raises(UsageError, match=needle):
            train_heads(models, config, data_dir, tmp_path / "h", progress=False)
        assert not (tmp_path / "h" / "config.json").exists()


def test_a_target_config_without_a_layer_shape_is_one_line():
    with pytest.raises(UsageError, match="lacks intermediate_size, num_attention_heads"):
        draft_layer({"hidden_size": 64}, 10)
    config = draft_layer({"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4}, 10)
    assert (config["num_key_value_heads"], config["head_dim"], config["vocab_size"]) == (4, 16, 10)


def test_train_heads_eagle3_reads_the_reference_layers_and_unrolls_3(models, tmp_path):
    def train(out, *extra):
        args = ["train-heads", "--kind", "eagle3", "--target", str(models.target_path)]
        args += ["--out", str(out), "--limit", "2", "--answer-tokens", "12", "--steps", "2"]
        args += ["--seq-len", "16", "--batch-tokens", "32", "--draft-vocab", "0", *extra]
        return CliRunner().invoke(app, args)

    first = train(tmp_path / "a")
    assert first.exit_code == 0, first.output
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["kind"] == "eagle3" and config["feature_layers"] == list(LAYERS)
    assert config["training"]["settings"]["unroll"] == 3
    again = train(tmp_path / "a")
    assert again.exit_code == 0 and "nothing to do" in again.output, again.output
    fewer = train(tmp_path / "b", "--unroll", "2")
    assert fewer.exit_code != 0 and "3 or more test steps" in fewer.output, fewer.output
    assert not (tmp_path / "b.data").exists()  # refused before any caching
