"""Heads' temperatures: fitted where the labels came from, recorded by training, and applied
where drafts are sized (probabilities only: never the tokens proposed)."""

from __future__ import annotations

import dataclasses
import json

import mlx.core as mx
import numpy as np
import pytest

from specmlx.drafters.medusa import MedusaDrafter
from specmlx.errors import SpecmlxError
from specmlx.heads import HeadsConfig
from specmlx.heads.medusa import MedusaHeads
from specmlx.training.temperature import fit_temperatures
from specmlx.training.train import train_heads
from tests.test_heads_medusa import GREEDY, medusa_config, randomized, synced_heads
from tests.test_train_heads import corpus, data_dir, fast, models  # noqa: F401 (fixtures)


class Batches:
    """`Windows` as `fit_temperatures` reads them: spans, here indices into fixed batches."""

    def __init__(self, n: int):
        self.n = n

    def in_order(self):
        yield from ((i,) for i in range(self.n))


def drawn(temperatures: list[float], n: int = 6000, vocab: int = 40, seed: int = 0):
    """Logits (K, n, V) and labels drawn from softmax(logits / T) for each head's T."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(len(temperatures), n, vocab)) * 3
    labels = np.empty((len(temperatures), n), np.int64)
    for h, t in enumerate(temperatures):
        p = np.exp(logits[h] / t - (logits[h] / t).max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        labels[h] = [rng.choice(vocab, p=row) for row in p]
    return logits, labels


def fit(logits, labels, used, parts: int = 3):
    """`fit_temperatures` over the positions cut into `parts` batches."""
    cuts = np.array_split(np.arange(logits.shape[1]), parts)

    def batch_of(i):
        c = cuts[i]
        return mx.array(logits[:, c]), mx.array(labels[:, c]), mx.array(used[:, c])

    return fit_temperatures(lambda *batch: batch, batch_of, Batches(parts))


def test_the_fitted_temperature_is_the_one_the_labels_were_drawn_at():
    """Overconfident (T = 2.5) and underconfident (T = 0.6) heads: each fit finds its T,
    lowers the Brier score of the best candidates, and brings the top-1 probability to the top-1 accuracy."""
    logits, labels = drawn([2.5, 0.6])
    result = fit(logits, labels, np.ones(labels.shape, bool))
    assert result is not None and result.positions == labels.shape[1]
    assert result.temperatures[0] == pytest.approx(2.5, rel=0.1)
    assert result.temperatures[1] == pytest.approx(0.6, rel=0.1)
    for h in range(2):
        assert result.brier_fitted[h] < result.brier[h]
        assert abs(result.confidence_fitted[h] - result.accuracy[h]) < 0.03
        assert abs(result.confidence[h] - result.accuracy[h]) > 0.1  # T = 1 was off
    assert result.confidence[0] > result.accuracy[0]  # overconfident at T = 1


def test_positions_that_do_not_count_are_left_out():
    logits, labels = drawn([2.0], n=4000)
    used = np.ones(labels.shape, bool)
    used[:, ::2] = False
    corrupted = labels.copy()
    corrupted[:, ::2] = np.argmax(logits[:, ::2], -1)  # as if perfectly confident there
    assert fit(logits, corrupted, used) == fit(logits[:, 1::2], labels[:, 1::2], used[:, 1::2])
    # Tokens outside the draft vocabulary (-1) are misses of every candidate: fewer hits,
    # a hotter fit than on the same positions without them.
    unknown = labels.copy()
    unknown[:, ::3] = -1
    every = np.ones(labels.shape, bool)
    outside, inside = fit(logits, unknown, every), fit(logits, labels, every)
    assert outside.accuracy[0] < inside.accuracy[0] and outside.positions == labels.shape[1]
    assert outside.temperatures[0] > inside.temperatures[0]
    none = used.copy()
    none[:, :] = False
    assert fit(logits, labels, none) is None


def test_temperatures_change_the_probabilities_never_the_tokens(loaded):
    model, tokenizer = loaded("llama")
    heads = randomized(MedusaHeads.create(medusa_config(model, tokenizer), model), seed=2)
    row = mx.random.normal((model.args.hidden_size,), key=mx.random.key(0))
    ids, probs = heads.top_candidates(row, 5)
    hot = dataclasses.replace(heads.config, temperatures=(2.0, 0.5, 3.0))  # the 4th: the last
    heads.config = hot
    hot_ids, hot_probs = heads.top_candidates(row, 5)
    assert hot_ids.tolist() == ids.tolist()
    logits = heads(row[None])[:, 0]
    for h, t in enumerate([2.0, 0.5, 3.0, 3.0]):
        expected = mx.softmax(logits[h] / t, axis=-1)
        assert np.allclose(np.array(hot_probs[h]), np.array(expected[hot_ids[h]]), atol=1e-5)


def test_hotter_heads_draft_smaller_trees(loaded):
    """The tree's size rests on the paths' probabilities: the same heads at a temperature
    above 1 keep fewer nodes where verification has a price, the best-first prefix of the
    same tree."""
    heads, ids, target = synced_heads(loaded)

    def proposal(temperatures):
        heads.config = dataclasses.replace(heads.config, temperatures=temperatures)
        drafter = MedusaDrafter(heads, 12, 3, verify_cost=lambda n: 1.0 + 0.02 * (n - 1))
        drafter.prefill(ids, target)
        return drafter.propose(ids, 3, GREEDY)

    cold, hot = proposal(()), proposal((2.0,))
    assert 0 < hot.size < cold.size
    assert hot.tokens.tolist() == cold.tokens.tolist()[: hot.size]


def test_bad_temperatures_are_refused_in_one_line(loaded):
    model, tokenizer = loaded("llama")
    config = medusa_config(model, tokenizer).to_dict()
    assert config["temperatures"] == []
    assert HeadsConfig.from_dict(config | {"temperatures": [1.5, 2]}).temperature(3) == 2.0
    for bad in ([0.0], [-1.0], ["warm"], [float("nan")], "12", [True], None):
        with pytest.raises(SpecmlxError, match="temperatures") as caught:
            HeadsConfig.from_dict(config | {"temperatures": bad})
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_training_fits_and_records_the_heads_temperatures(models, data_dir, tmp_path, kind):  # noqa: F811
    """Heads trained with answers held out record one temperature per head (EAGLE: per
    unrolled step), fitted on those answers (the positions and labels their held-out top-1
    scores, a miss where the token is outside the draft vocabulary), in their training
    record; they draft as trained until eval-heads applies them."""
    config = fast(kind=kind, steps=12, holdout=3, lr=1e-2 if kind == "medusa" else 3e-3)
    report = train_heads(models, config, data_dir, tmp_path / "h", progress=False)
    fitted = report.calibration
    assert fitted is not None
    assert len(fitted.temperatures) == (config.num_heads if kind == "medusa" else config.unroll)
    assert fitted.accuracy == pytest.approx(report.heldout_parts["answers"], abs=2e-4)
    saved = json.loads((tmp_path / "h" / "config.json").read_text())
    assert saved["training"]["calibration"]["temperatures"] == fitted.temperatures
    assert saved["temperatures"] == []  # recorded, applied only on request (eval-heads)
    # Nothing held out: nothing to fit on, and nothing recorded.
    bare = train_heads(models, fast(kind=kind, steps=4, holdout=0), data_dir, tmp_path / "b")
    assert bare.calibration is None
    assert json.loads((tmp_path / "b" / "config.json").read_text())["temperatures"] == []


def test_eval_heads_applies_the_temperatures_training_recorded(models, data_dir, tmp_path):  # noqa: F811
    """`eval-heads --fit-temperatures` applies the temperatures training recorded (the
    same fit), written to config.json alone (the weights untouched)."""
    from typer.testing import CliRunner

    from specmlx.cli import app

    config = fast(kind="medusa", steps=8, holdout=2, lr=1e-2)
    report = train_heads(models, config, data_dir, tmp_path / "h", progress=False)
    path = tmp_path / "h" / "config.json"
    weights = (tmp_path / "h" / "model.safetensors").read_bytes()
    saved = json.loads(path.read_text())
    assert saved["temperatures"] == []  # training records them only
    args = ["eval-heads", "--target", str(models.target_path), "--data", str(data_dir)]
    result = CliRunner().invoke(app, [*args, "--heads", str(tmp_path / "h"), "--fit-temperatures"])
    assert result.exit_code == 0, result.output
    assert report.calibration is not None
    fitted = report.calibration.temperatures
    written = json.loads(path.read_text())
    assert written["temperatures"] == fitted
    assert written["training"]["calibration"]["fitted_on"].endswith(data_dir.name)
    assert f"temperatures {' '.join(f'{t:.2f}' for t in fitted)}" in result.stdout
    assert (tmp_path / "h" / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == sorted(
        ["config.json", "model.safetensors", "train_log.json", "loss.png"]
    )
    # EAGLE heads: one temperature per unrolled step; heads trained with nothing held out
    # are refused in one line, their config left as it was.
    eagle = train_heads(models, fast(kind="eagle", steps=4, holdout=2), data_dir, tmp_path / "e")
    assert eagle.calibration is not None and len(eagle.calibration.temperatures) == 2
    train_heads(models, fast(kind="medusa", steps=2, holdout=0), data_dir, tmp_path / "n")
    before = (tmp_path / "n" / "config.json").read_text()
    result = CliRunner().invoke(app, [*args, "--heads", str(tmp_path / "n"), "--fit-temperatures"])
    assert result.exit_code != 0 and "nothing held out" in result.output
    assert "Traceback" not in result.output
    assert (tmp_path / "n" / "config.json").read_text() == before
