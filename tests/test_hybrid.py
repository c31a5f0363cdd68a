"""Hybrid targets (Qwen3.5, Qwen3-Next: Gated DeltaNet layers mixed with full attention),
loaded from tiny checkpoints in the layout their authors release: every chain method is
lossless on them, heads and suffix decoding draft chains there, rewinds leave the caches as
a fresh prefill would, and Lookahead (trees only) is refused up front."""

from __future__ import annotations

import json
from dataclasses import replace

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten
from safetensors import safe_open
from typer.testing import CliRunner

import specmlx
from specmlx.api.methods import METHODS, EagleOptions, MedusaOptions, SuffixOptions
from specmlx.api.models import Models
from specmlx.cli import app
from specmlx.drafters.draft_model import DraftModelDrafter
from specmlx.drafters.medusa import MedusaDrafter
from specmlx.engine.anatomy import hidden_size, output_layer, vocab_rows
from specmlx.engine.cache import Sequence
from specmlx.engine.decode import decode
from specmlx.engine.features import FeatureSpec
from specmlx.engine.policy import FixedK
from specmlx.engine.sampling import SamplingConfig
from specmlx.errors import UsageError
from specmlx.heads.base import HeadsConfig
from specmlx.heads.eagle3 import Eagle3Head
from specmlx.heads.medusa import MedusaHeads
from specmlx.training.eagle3_objective import draft_layer
from tests import test_distribution as dist
from tests.test_cli_heads import perturbed
from tests.tiny import make_model_dir
from tests.tiny_hybrid import make_hybrid_dir, random_model
from tests.tiny_mtp import damp

KINDS = ("qwen3_5", "qwen3_next")
PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
CHAINS = [
    m.name
    for m in METHODS.values()
    if (not m.drafts_trees or m.chains_if_needed) and m.name != "none"
]
TREES = [m.name for m in METHODS.values() if m.drafts_trees and not m.chains_if_needed]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    out = {kind: make_hybrid_dir(root / kind, kind, seed=1) for kind in KINDS}
    out["llama"] = make_model_dir(root / "llama", "llama", seed=2)
    for kind in KINDS:  # targets that lean on their current token: heads can guess them
        out[f"{kind}-close"] = damp(make_hybrid_dir(root / f"{kind}-close", kind, seed=1), 0.05)
    out["sharp"] = damp(make_hybrid_dir(root / "sharp", "qwen3_5", seed=1), 0.05, head=5.0)
    return out


@pytest.fixture(scope="module")
def loaded(folders):
    """Each hybrid target with the tiny llama as its draft model."""
    return {
        kind: specmlx.load(str(folders[kind]), str(folders["llama"]), progress=False)
        for kind in KINDS
    }


@pytest.fixture(scope="module")
def heads(folders, loaded):
    """Medusa heads and an EAGLE-3 head for each hybrid target (random weights: drafts that
    are mostly wrong, so every step rewinds something)."""
    out = {}
    for kind in KINDS:
        target = loaded[kind].target
        vocab = vocab_rows(target)
        base = dict(hidden_size=hidden_size(target), target_vocab=vocab, draft_vocab=vocab)
        config = json.loads((folders[kind] / "config.json").read_text())
        eagle = HeadsConfig(
            kind="eagle3", feature_layers=(0, 1, 3), target_args=draft_layer(config, vocab), **base
        )
        mx.random.seed(5)
        out[kind] = {
            "medusa": perturbed(MedusaHeads.create(HeadsConfig(kind="medusa", **base), target), 1),
            "eagle": Eagle3Head.create(eagle, target),
        }
    return out


def test_an_eagle3_layer_copies_the_nested_text_config(folders):
    """Qwen3.5 keeps its sizes under text_config and its rope base under rope_parameters."""
    config = json.loads((folders["qwen3_5"] / "config.json").read_text())
    layer = draft_layer(config, 320)
    text = config["text_config"]
    assert layer["hidden_size"] == text["hidden_size"] == 64
    assert layer["rope_theta"] == text["rope_parameters"]["rope_theta"]
    assert layer["model_type"] == "llama" and layer["vocab_size"] == 320


def guessing_heads(models: Models, num_heads: int = 3) -> MedusaHeads:
    """Medusa heads that are often right on a target that leans on its current token
    (`damp`): there its greedy next token is nearly a function B of the current one, and the
    feature f(x) it reads nearly one of the token it was fed. Head i's own lm_head row for y
    sums f(x) over the x with B^(i+2)(x) = y (the token i + 1 past the next): a nearest-
    match lookup, right where the target is a bigram model, wrong where it is not."""
    target = models.target
    vocab = vocab_rows(target)
    config = HeadsConfig(
        kind="medusa",
        hidden_size=hidden_size(target),
        target_vocab=vocab,
        draft_vocab=vocab,
        num_heads=num_heads,
        own_lm_head=True,
    )
    heads = MedusaHeads.create(config, target)
    seq = Sequence(target)
    seq.capture(FeatureSpec())
    seq.sync([*range(vocab), 0])
    features = seq.feature_rows()  # (vocab, d): row x read token x
    step = mx.argmax(target(mx.array([list(range(vocab))]))[0], axis=-1)  # B, nearly
    ahead = step[step]  # B(B(x))
    for head in heads.heads:
        onehot = (ahead[:, None] == mx.arange(vocab)[None, :]).astype(mx.float32)  # x -> y
        head[-1].weight = onehot.T @ features  # (vocab, d)
        ahead = step[ahead]
    mx.eval(heads.parameters())
    return heads


def held(seq: Sequence) -> list[mx.array]:
    """What the cache holds for the confirmed tokens: every recurrent entry, every KV row."""
    out = []
    for c in seq.cache:
        if hasattr(c, "keys"):
            out += [c.keys[..., : c.offset, :], c.values[..., : c.offset, :]]
        else:
            out += list(c.cache)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_released_layout_loads_back_to_the_random_model(tmp_path, kind):
    mtp = {"mtp.fc.weight": mx.ones((64, 128)), "mtp.norm.weight": mx.zeros((64,))}
    folder = make_hybrid_dir(tmp_path / kind, kind, seed=3, extra_tensors=mtp)
    config = json.loads((folder / "config.json").read_text())
    with safe_open(folder / "model.safetensors", "np") as f:
        stored = {name: f.get_slice(name).get_shape() for name in f.keys()}
    prefix = "model.language_model." if kind == "qwen3_5" else "model."
    assert stored[f"{prefix}layers.0.linear_attn.conv1d.weight"][1] == 1  # (C, 1, kernel)
    assert "lm_head.weight" in stored and "mtp.fc.weight" in stored
    if kind == "qwen3_5":
        assert config["text_config"]["model_type"] == "qwen3_5_text"
        assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    else:
        assert f"{prefix}layers.1.mlp.experts.3.down_proj.weight" in stored
    model, _ = mlx_lm.load(str(folder))  # sanitize: renames, reshapes, +1 norms, drops mtp
    expected = dict(tree_flatten(random_model(config, seed=3).parameters()))
    weights = dict(tree_flatten(model.parameters()))
    assert weights.keys() == expected.keys()
    for name, value in weights.items():
        assert mx.array_equal(value, expected[name]).item(), name


@pytest.mark.parametrize("kind", KINDS)
def test_sizes_are_read_from_the_text_model(loaded, kind):
    models = loaded[kind]
    target = models.target
    assert vocab_rows(target) == models.vocab_size == 320 and hidden_size(target) == 64
    assert models.context_length == 4096
    assert output_layer(target) is (
        target.language_model.lm_head if kind == "qwen3_5" else target.lm_head
    )
    seq = Sequence(target)
    seq.capture(FeatureSpec((1,)))  # what EAGLE-3 heads would read
    seq.sync(list(range(10, 20)))
    assert seq.feature_rows().shape == (9, 64)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["ngram", "draft", "suffix", "suffix+draft"])  # mtp: its own
def test_greedy_chain_methods_equal_plain(loaded, kind, method):
    models = loaded[kind]
    models.suffix_store = None  # no answer of another test in the suffix memory

    def run(name):
        config = specmlx.GenerationConfig(method=name, k=3, max_tokens=24, chat_template=False)
        if name.startswith("suffix"):  # drafts unpriced: a timed calibration on a busy
            config = replace(config, options=SuffixOptions(tree_size=8))  # host drafts none
        return specmlx.generate(models, PROMPT, config)

    plain, spec = run("none"), run(method)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > spec.stats.accepted  # rejections were rewound


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["medusa", "eagle", "suffix+heads"])
def test_heads_draft_chains_on_a_hybrid(loaded, heads, kind, method):
    """Heads, which draft trees elsewhere, draft chains here (one token per head or level):
    greedy output as plain decoding's, at a fixed k and at -k auto. At the fixed k the
    chain's length is fixed too (tree_size 4): sized by the machine's timed call costs,
    random heads' drafts may not pay at all."""
    models = Models(loaded[kind].target, loaded[kind].tokenizer, heads=heads[kind])
    fixed = {"medusa": MedusaOptions, "eagle": EagleOptions, "suffix+heads": SuffixOptions}
    for k in (3, None):
        options = fixed[method](tree_size=4) if k is not None else None
        config = specmlx.GenerationConfig(
            method=method, options=options, k=k, max_tokens=24, chat_template=False
        )
        session = specmlx.Session(models, config)
        steps = list(session.steps(models.tokenizer.encode(PROMPT)))
        plain = specmlx.generate(
            models, PROMPT, replace(config, method="none", options=None, k=None)
        )
        assert [t for s in steps for t in s.tokens] == plain.token_ids, (method, k)
        assert not any(s.tree for s in steps)
        if k is not None:
            assert sum(s.n_drafted for s in steps) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_heads_that_guess_well_are_kept_and_rewound(folders, kind):
    """Heads often right: chains partly kept, partly rewound, the output plain decoding's."""
    models = specmlx.load(str(folders[f"{kind}-close"]), progress=False)
    models.heads["medusa"] = guessing_heads(models)
    config = specmlx.GenerationConfig(method="medusa", k=3, max_tokens=32, chat_template=False)
    spec = specmlx.generate(models, PROMPT, config)
    plain = specmlx.generate(models, PROMPT, replace(config, method="none", k=None))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > spec.stats.accepted > spec.stats.drafted / 8


@pytest.mark.parametrize("kind", KINDS)
def test_target_as_its_own_draft_is_exact_and_accepted(loaded, kind):
    """The draft side's recurrent caches rewind too; all drafts are kept."""
    models = loaded[kind]
    itself = Models(models.target, models.tokenizer, draft=models.target)
    config = specmlx.GenerationConfig(method="draft", k=3, max_tokens=16, chat_template=False)
    spec = specmlx.generate(itself, PROMPT, config)
    plain = specmlx.generate(models, PROMPT, replace(config, method="none", k=None))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted == spec.stats.drafted > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("drafting", ["draft", "medusa"])
def test_rewound_caches_equal_a_fresh_prefill(folders, loaded, kind, drafting):
    """After every step: the caches, and the hidden states kept for heads."""
    if drafting == "draft":
        models = loaded[kind]
        drafter = DraftModelDrafter(models.draft, models.vocab_size)
    else:
        models = specmlx.load(str(folders[f"{kind}-close"]), progress=False)
        drafter = MedusaDrafter(guessing_heads(models), tree_size=4, chains=True)
    ids = models.tokenizer.encode(PROMPT)
    seq = Sequence(models.target)
    rejected = kept = 0
    steps = decode(seq, ids, drafter, policy=FixedK(3), max_tokens=16, sampling=SamplingConfig())
    for step in steps:
        rejected += step.n_drafted - step.n_accepted
        kept += step.n_accepted
        fresh = Sequence(models.target)
        fresh.capture(seq.feature_spec)
        fresh.sync([*seq.tokens, 0])
        ours, theirs = held(seq), held(fresh)
        if seq.feature_spec is not None:
            ours, theirs = [*ours, seq.feature_rows()], [*theirs, fresh.feature_rows()]
        assert len(ours) == len(theirs) > 0
        for a, b in zip(ours, theirs, strict=True):
            # Not bit for bit: OpenBLAS rounds a 4-token call and a prefill differently.
            assert a.shape == b.shape and mx.allclose(a, b, rtol=1e-4, atol=1e-4).item()
    assert rejected > 0
    assert kept > 0 or drafting == "draft"  # the tiny llama's drafts: all rejected


@pytest.mark.parametrize("kind", KINDS)
def test_draft_model_keeps_a_hybrid_targets_distribution(folders, loaded, monkeypatch, kind):
    """χ² at T=1 with top-p: the first two tokens of many responses against the exact joint."""
    monkeypatch.setattr(dist, "RUNS", 400)  # each run prefills the hybrid anew: keep it short
    target, tokenizer = mlx_lm.load(str(folders[kind]))
    head = output_layer(target)
    head.weight = head.weight * 3.0  # a peaked target: enough likely pairs to count
    sampling = SamplingConfig(temperature=1.0, top_p=0.9)
    ids = tokenizer.encode("The quick brown fox")
    drafter = DraftModelDrafter(loaded[kind].draft, vocab_rows(target))
    pairs, n_accepted = dist.sample_pairs(target, drafter, ids, sampling, 2, 3)
    assert n_accepted > 0
    assert dist.chi2_pvalue(pairs, dist.exact_joint(target, ids, sampling)) > 0.01


def test_heads_chains_keep_a_hybrid_targets_distribution(folders, monkeypatch):
    """χ² at T=1 with top-p for heads' chains (deterministic drafts: each kept with the
    target's probability of it), on a peaked target they often guess."""
    monkeypatch.setattr(dist, "RUNS", 400)
    models = specmlx.load(str(folders["sharp"]), progress=False)
    drafter = MedusaDrafter(guessing_heads(models), tree_size=4, chains=True)
    sampling = SamplingConfig(temperature=1.0, top_p=0.9)
    ids = models.tokenizer.encode("The quick brown fox")
    pairs, n_accepted = dist.sample_pairs(models.target, drafter, ids, sampling, 2, 3)
    assert n_accepted > dist.RUNS / 8
    assert dist.chi2_pvalue(pairs, dist.exact_joint(models.target, ids, sampling)) > 0.01


@pytest.mark.parametrize("method", TREES)
def test_tree_methods_are_refused_on_a_hybrid(loaded, method):
    config = specmlx.GenerationConfig(method=method, k=3)
    with pytest.raises(UsageError) as error:
        specmlx.Session(loaded["qwen3_next"], config)
    message = str(error.value)
    assert "\n" not in message and f"--method {method}" in message
    assert all(name in message for name in CHAINS)


def test_cli_generates_on_a_released_layout(folders):
    runner = CliRunner()

    def ids(*args):
        base = ["generate", "hello", "--target", str(folders["qwen3_5"]), "--max-tokens", "12"]
        result = runner.invoke(app, [*base, "--json", *args])
        assert result.exit_code == 0, result.output
        return json.loads(result.output.splitlines()[-1])["token_ids"]

    plain = ids("--method", "none")
    assert ids("--method", "ngram") == plain  # k auto: calibrates on the hybrid first
    assert ids("--draft", str(folders["llama"]), "-k", "2") == plain
    tree = runner.invoke(
        app, ["generate", "hi", "--target", str(folders["qwen3_5"]), "--method", "lookahead"]
    )
    assert tree.exit_code != 0 and "Traceback" not in tree.output
    assert tree.output.strip().splitlines()[-1].startswith("error: --method lookahead")
