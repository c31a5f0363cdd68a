"""Heads through the CLI and the API: --heads DIR with --method medusa|eagle, their options,
and one-line errors where heads are missing or of the wrong kind."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten, tree_map
from typer.testing import CliRunner

from specmlx.api.config import GenerationConfig, method_of
from specmlx.api.load import load
from specmlx.api.methods import EagleOptions, MedusaOptions
from specmlx.cli import app
from specmlx.cli.options import MethodFlags
from specmlx.heads import HeadsConfig, save_heads
from specmlx.heads.base import fingerprint, target_vocab
from specmlx.heads.eagle import EagleHead
from specmlx.heads.medusa import MedusaHeads

runner = CliRunner()


def perturbed(module, seed: int):
    """The module with its trainable weights set to small random values: drafts that are
    sometimes right, sometimes wrong."""
    mx.random.seed(seed)
    weights = tree_map(lambda w: 0.05 * mx.random.normal(w.shape), module.trainable_parameters())
    module.load_weights(tree_flatten(weights), strict=False)
    return module


@pytest.fixture(scope="module")
def heads_dirs(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    model, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    base = dict(
        hidden_size=model.args.hidden_size,
        target_vocab=target_vocab(model),
        draft_vocab=target_vocab(model),
        fingerprint=fingerprint(model, tokenizer),
    )
    config = json.loads((tiny_dirs["llama"] / "config.json").read_text())
    medusa = perturbed(MedusaHeads.create(HeadsConfig(kind="medusa", **base), model), 1)
    eagle = perturbed(
        EagleHead.create(HeadsConfig(kind="eagle", target_args=config, **base), model), 2
    )
    return {
        "medusa": save_heads(medusa, root / "medusa"),
        "eagle": save_heads(eagle, root / "eagle"),
    }


def invoke(*args):
    return runner.invoke(app, list(args))


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_generate_with_heads_matches_plain(tiny_dirs, heads_dirs, method):
    target = str(tiny_dirs["llama"])
    common = ["generate", "hello", "--target", target, "--json", "--max-tokens", "24"]
    spec = invoke(
        *common,
        "--heads",
        str(heads_dirs[method]),
        "--method",
        method,
        "-k",
        "4",
        "--tree-size",
        "16",
    )
    plain = invoke(*common, "--method", "none")
    assert spec.exit_code == 0 and plain.exit_code == 0, spec.output + plain.output
    spec_out, plain_out = json.loads(spec.stdout), json.loads(plain.stdout)
    assert spec_out["token_ids"] == plain_out["token_ids"]
    assert spec_out["method"] == method and spec_out["stats"]["drafted"] > 0


def test_the_heads_kind_is_the_default_method(tiny_dirs, heads_dirs):
    models = load(str(tiny_dirs["llama"]), heads=[str(heads_dirs["medusa"])], progress=False)
    # (How many nodes a cost-sized tree keeps depends on this machine's timings: not asserted.)
    assert method_of(models, GenerationConfig(k=3)).name == "medusa"
    both = load(
        str(tiny_dirs["llama"]),
        heads=[str(heads_dirs["medusa"]), str(heads_dirs["eagle"])],
        progress=False,
    )
    assert set(both.heads) == {"medusa", "eagle"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--method", "medusa"], "needs trained heads"),
        (["--method", "ngram", "--heads", "HEADS-eagle"], "--heads is not used"),
        (["--method", "medusa", "--heads", "HEADS-eagle"], "needs medusa heads"),
        (["--method", "medusa", "--heads", "HEADS-medusa", "--depth", "3"], "--depth"),
        (["--heads", "HEADS-medusa", "--tree-size", "4"], "choose one with --method"),
        (["--method", "eagle", "--heads", "HEADS-eagle", "--tree-size", "1"], "tree-size >= 2"),
    ],
)
def test_bad_heads_input_is_one_line(tiny_dirs, heads_dirs, args, needle):
    args = [str(heads_dirs[a.split("-")[1]]) if a.startswith("HEADS-") else a for a in args]
    result = invoke("generate", "hi", "--target", str(tiny_dirs["llama"]), *args)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    last = [line for line in result.output.splitlines() if line.strip()][-1]
    assert last.startswith("error: ") and needle in last, result.output


def test_heads_of_an_unknown_kind_are_refused_in_one_line(tiny_dirs, heads_dirs, tmp_path):
    folder = tmp_path / "foo"
    folder.mkdir()
    for path in heads_dirs["medusa"].iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "kind": "foo"}))
    result = invoke("generate", "hi", "--target", str(tiny_dirs["llama"]), "--heads", str(folder))
    assert result.exit_code != 0 and "Traceback" not in result.output
    last = [line for line in result.output.splitlines() if line.strip()][-1]
    assert last == "error: unknown heads kind 'foo' (known: medusa, eagle, eagle3)", result.output


def test_heads_flags_become_the_options_of_the_method_in_use():
    flags = MethodFlags(tree_size=12, width=3)
    assert flags.options(flags.method("medusa")) == MedusaOptions(tree_size=12, width=3)
    assert flags.options(flags.method("eagle")) == EagleOptions(tree_size=12, width=3)
    assert MethodFlags(depth=3).method(None).name == "eagle"


def test_train_heads_command_trains_then_has_nothing_to_do(tiny_dirs, tmp_path):
    out = tmp_path / "medusa"
    args = ["train-heads", "--target", str(tiny_dirs["llama"]), "--out", str(out), "--limit", "2"]
    args += ["--answer-tokens", "12", "--steps", "3", "--seq-len", "16", "--batch-tokens", "32"]
    first = invoke(*args, "--draft-vocab", "0")
    assert first.exit_code == 0, first.output
    assert {"config.json", "model.safetensors", "train_log.json"} <= {p.name for p in out.iterdir()}
    # The heads record where their data came from, not this machine's paths.
    recorded = (out / "config.json").read_text()
    data = json.loads(recorded)["training"]["data"]
    assert data["origin"] == {"prompts": "shipped", "limit": 2}
    assert data["source"]["kind"] == "generated" and data["source"]["prompts"] == 2
    assert "dir" not in data and str(tmp_path) not in recorded
    again = invoke(*args, "--draft-vocab", "0")
    assert again.exit_code == 0 and "nothing to do" in again.output
    other = invoke(*args, "--draft-vocab", "64")  # other settings, same OUT
    assert other.exit_code != 0 and "other settings" in other.output.splitlines()[-1]
    # Heads from before the held-out split (no `holdout` recorded) trained on every prompt.
    config = json.loads((out / "config.json").read_text())
    del config["training"]["settings"]["holdout"]
    (out / "config.json").write_text(json.dumps(config))
    legacy = invoke(*args, "--draft-vocab", "0")
    assert legacy.exit_code != 0 and "other settings" in legacy.output.splitlines()[-1]
    assert invoke(*args, "--draft-vocab", "0", "--holdout", "0").exit_code == 0


def test_task_prompts_are_answered_and_told_apart_from_their_answers(tiny_dirs, tmp_path):
    """`--task-prompts N` answers N tasks on the functions of the --files beside the shipped
    prompts; the data folder keeps the prompts answered, from which eval-heads tells where
    each answer starts as training did (the same held-out score)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"m{i}.py").write_text(
            f'def f{i}(x):\n    """Add {i}."""\n    y = x + {i}\n    return y\n'
        )
    out, data = tmp_path / "h", tmp_path / "data"
    args = ["train-heads", "--target", str(tiny_dirs["llama"]), "--out", str(out)]
    args += ["--data", str(data), "--limit", "2", "--task-prompts", "4", "--files", str(src)]
    args += ["--answer-tokens", "8", "--steps", "4", "--seq-len", "16", "--batch-tokens", "32"]
    result = invoke(*args, "--holdout", "2", "--checkpoint-every", "2")
    assert result.exit_code == 0, result.output
    training = json.loads((out / "config.json").read_text())["training"]
    assert training["data"]["origin"]["task_prompts"] == 4
    assert training["data"]["source"]["parts"][0]["prompts"] == 2 + 4
    assert training["data"]["heldout_scored"] == "answers"
    answered = [json.loads(line)["prompt"] for line in (data / "answered-prompts.jsonl").open()]
    assert len(answered) == 6 and all("```python\ndef f" in p for p in answered[2:])
    target = str(tiny_dirs["llama"])
    scored = invoke("eval-heads", "--target", target, "--heads", str(out), "--data", str(data))
    assert scored.exit_code == 0, scored.output
    top1 = training["heldout_parts"]["answers"][0]
    assert f"held-out top-1 {top1:.1%}" in scored.stdout.splitlines()[1]  # the answers' line


def test_magpie_prompts_another_model_writes_are_recorded_by_its_name(tiny_dirs, tmp_path):
    """`--magpie N --magpie N@MODEL --questions N`: the target's own draws, another
    model's and question draws, each kept in its own file of the data folder, and the
    heads record all three."""
    out, data = tmp_path / "h", tmp_path / "data"
    writer = str(tiny_dirs["llama-draft"])
    args = ["train-heads", "--target", str(tiny_dirs["llama"]), "--out", str(out)]
    args += ["--data", str(data), "--limit", "2", "--magpie", "2", "--magpie", f"3@{writer}"]
    args += ["--questions", "2"]
    args += ["--answer-tokens", "8", "--steps", "2", "--seq-len", "16", "--batch-tokens", "32"]
    result = invoke(*args, "--holdout", "0")
    assert result.exit_code == 0, result.output
    assert (data / "magpie-2-seed0.jsonl").is_file()
    assert (data / "magpie-3-seed0-llama-draft.jsonl").is_file()
    assert (data / "magpie-questions-2-seed0.jsonl").is_file()
    origin = json.loads((out / "config.json").read_text())["training"]["data"]["origin"]
    assert origin["magpie"] == [
        2,
        {"count": 3, "writer": "llama-draft"},  # not the full path
        {"count": 2, "questions": True},
    ]
    assert str(tmp_path) not in (out / "config.json").read_text()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--kind", "hydra"], "unknown heads kind 'hydra'; train-heads trains medusa or eagle"),
        (["--kind", "eagle3"], "eagle3 heads read three of the target's layers"),
        (["--no-self-distill"], "nothing to train on"),
        (["--files", "/no/such/file"], "no such file"),
        (["--samples", "0"], "need samples >= 1"),
        (["--temperature", "inf", "--samples", "2"], "temperature > 0"),
        (["--holdout", "1"], "holdout must be 0 (none) or at least 2"),
        (["--kind", "eagle", "--feature-noise", "-1"], "feature noise must be >= 0"),
        (["--kind", "eagle", "--feature-noise", "nan"], "feature noise must be >= 0"),
        (["--feature-noise", "0.1"], "feature noise is for eagle heads"),
        (["--task-prompts", "4"], "--task-prompts are made from --files"),
        (["--magpie", "many"], "--magpie takes N or N@MODEL, got 'many'"),
        (["--magpie", "8@"], "--magpie takes N or N@MODEL, got '8@'"),
        (["--magpie", "-1"], "--magpie takes N or N@MODEL, got '-1'"),
        (["--questions", "some"], "--questions takes N or N@MODEL, got 'some'"),
    ],
)
def test_train_heads_bad_input_is_one_line(tiny_dirs, tmp_path, extra, needle):
    result = invoke(
        "train-heads", "--target", str(tiny_dirs["llama"]), "--out", str(tmp_path / "h"), *extra
    )
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert needle in result.output.splitlines()[-1], result.output


def test_train_heads_refuses_a_folder_of_other_files_before_any_work(tiny_dirs, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "important.txt").write_text("keep me")
    result = invoke("train-heads", "--target", str(tiny_dirs["llama"]), "--out", str(out))
    assert result.exit_code != 0 and "not a heads folder" in result.output.splitlines()[-1]
    assert not (tmp_path / "mine.data").exists()  # nothing generated or cached
