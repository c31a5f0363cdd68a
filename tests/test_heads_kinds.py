"""The kinds table: every kind's module, method, readers and objective exist, and a kind
the table lacks is refused in one line wherever it turns up."""

from __future__ import annotations

import json
import subprocess
import sys

import mlx_lm
import pytest

from specmlx.api.methods import METHODS
from specmlx.errors import SpecmlxError, UsageError
from specmlx.heads import HeadsConfig, load_heads, method_of_heads, save_heads
from specmlx.heads.base import fingerprint, target_vocab
from specmlx.heads.kinds import KINDS, TRAINABLE, head_kind, trainable_kind
from specmlx.heads.medusa import MedusaHeads
from specmlx.training.objectives import OBJECTIVES
from specmlx.training.train import TrainConfig


def test_every_kind_names_a_method_a_module_and_its_readers():
    for name, kind in KINDS.items():
        assert kind.name == name
        assert kind.method in METHODS and METHODS[kind.method].needs_heads, name
        assert callable(kind.module_class().create), name
        assert all(callable(read) for read in kind.published_readers()), name


def test_every_trainable_kind_has_an_objective():
    assert TRAINABLE and set(TRAINABLE) == set(OBJECTIVES)
    for name in TRAINABLE:
        assert KINDS[name].train_lr > 0
        assert TrainConfig(kind=name).learning_rate == KINDS[name].train_lr


def test_the_table_imports_no_mlx():
    code = (
        "import sys, specmlx.heads.kinds; print(any(m.split('.')[0] == 'mlx' for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_unknown_kind_is_one_line_naming_the_known_ones():
    with pytest.raises(SpecmlxError, match=r"unknown heads kind 'foo' \(known: medusa, eagle"):
        head_kind("foo")
    with pytest.raises(SpecmlxError, match="unknown heads kind 'foo'"):
        HeadsConfig("foo", 8, 50, 50)
    with pytest.raises(UsageError, match="train-heads trains medusa or eagle or eagle3"):
        trainable_kind("foo")
    with pytest.raises(UsageError, match="unknown heads kind 'foo'"):
        TrainConfig(kind="foo")


def test_the_method_of_heads_is_their_kinds():
    for name, kind in KINDS.items():
        heads = type("Stub", (), {"config": HeadsConfig(name, 8, 50, 50)})()
        assert method_of_heads(heads) == kind.method


def test_a_heads_folder_of_an_unknown_kind_is_refused_in_one_line(tiny_dirs, tmp_path):
    model, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    config = HeadsConfig(
        kind="medusa",
        hidden_size=model.args.hidden_size,
        target_vocab=target_vocab(model),
        draft_vocab=target_vocab(model),
        fingerprint=fingerprint(model, tokenizer),
    )
    folder = save_heads(MedusaHeads.create(config, model), tmp_path / "h")
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, "kind": "foo"}))
    with pytest.raises(SpecmlxError, match="unknown heads kind 'foo'") as error:
        load_heads(folder, model, tokenizer)
    assert "\n" not in str(error.value) and "medusa, eagle, eagle3" in str(error.value)
