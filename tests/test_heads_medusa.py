"""Medusa heads: their files, the target they fit, and lossless drafting from them."""

from __future__ import annotations

import itertools
import json
import math

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten

from specmlx.api.methods import METHODS, MedusaOptions
from specmlx.api.models import Models
from specmlx.drafters.medusa import MedusaDrafter
from specmlx.engine import verify
from specmlx.engine.cache import Sequence
from specmlx.engine.decode import decode
from specmlx.engine.features import FeatureSpec, backbone
from specmlx.engine.policy import FixedK
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.step import Plan, Step
from specmlx.errors import SpecmlxError
from specmlx.heads import HeadsConfig, load_heads, save_heads
from specmlx.heads import store as heads_store
from specmlx.heads.base import fingerprint, target_vocab
from specmlx.heads.medusa import MedusaHeads
from tests.test_distribution import chi2_pvalue, exact_joint, sample_pairs

GREEDY = SamplingConfig()
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "Hello, world!",
    "lazy lazy lazy lazy",
]


def medusa_config(model, tokenizer, **fields) -> HeadsConfig:
    fields.setdefault("draft_vocab", target_vocab(model))
    return HeadsConfig(
        kind="medusa",
        hidden_size=model.args.hidden_size,
        target_vocab=target_vocab(model),
        fingerprint=fingerprint(model, tokenizer),
        **fields,
    )


def randomized(heads: MedusaHeads, seed: int = 0, scale: float = 0.3) -> MedusaHeads:
    """The same heads with random non-zero blocks: their guesses are not the target's."""
    mx.random.seed(seed)
    heads.update(
        {
            "heads": [
                [
                    {
                        "linear": {
                            k: mx.random.normal(v.shape) * scale for k, v in b["linear"].items()
                        }
                    }
                    for b in head
                ]
                for head in heads.trainable_parameters()["heads"]
            ]
        }
    )
    mx.eval(heads.parameters())
    return heads


def synced_heads(loaded, seed: int = 4) -> tuple[MedusaHeads, list[int], Sequence]:
    """Random Medusa heads on the tiny llama, a prompt, and the target holding it."""
    model, tokenizer = loaded("llama")
    heads = randomized(MedusaHeads.create(medusa_config(model, tokenizer), model), seed=seed)
    ids = tokenizer.encode(PROMPTS[3])
    target = Sequence(model)
    target.capture(FeatureSpec(heads.config.feature_layers))
    target.sync(ids)
    return heads, ids, target


def features_of(model, ids: list[int]) -> mx.array:
    return backbone(model)(mx.array(ids)[None])[0]  # (n, hidden)


def run(target, ids, drafter, policy, max_tokens=20, sampling=GREEDY):
    steps = list(
        decode(
            Sequence(target), ids, drafter, policy=policy, max_tokens=max_tokens, sampling=sampling
        )
    )
    return [t for s in steps for t in s.tokens], steps


# --- the heads ----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # an lm_head, and tied embeddings
def test_fresh_heads_are_the_targets_next_token_head(loaded, arch):
    model, tokenizer = loaded(arch)
    heads = MedusaHeads.create(medusa_config(model, tokenizer), model)
    ids = tokenizer.encode(PROMPTS[0])
    logits = heads(features_of(model, ids))  # (K, n, vocab)
    assert logits.shape == (4, len(ids), target_vocab(model))
    for head_logits in logits:
        assert mx.allclose(head_logits, model(mx.array(ids)[None])[0], atol=1e-4)


def test_trainable_parameters_are_the_blocks_only(loaded):
    model, tokenizer = loaded("llama")
    even = mx.arange(0, 320, 2, dtype=mx.int32)  # a draft vocabulary of 160 tokens
    for config, d2t in [
        (medusa_config(model, tokenizer, num_layers=2), None),
        (medusa_config(model, tokenizer, draft_vocab=160, num_heads=3), even),
    ]:
        heads = MedusaHeads.create(config, model, d2t)
        names = [name for name, _ in tree_flatten(heads.trainable_parameters())]
        blocks = config.num_heads * config.num_layers
        assert len(names) == 2 * blocks
        assert all(name.startswith("heads.") and ".linear." in name for name in names)
        assert names == [name for name, _ in tree_flatten(heads.parameters())]


def test_save_and_load_round_trip(loaded, tmp_path):
    model, tokenizer = loaded("llama")
    features = features_of(model, tokenizer.encode(PROMPTS[1]))
    d2t = mx.array(list(range(319, 100, -3)), mx.int32)
    cases = [
        (medusa_config(model, tokenizer, num_heads=3, num_layers=2), None),
        (medusa_config(model, tokenizer, draft_vocab=d2t.size, training={"steps": 7}), d2t),
    ]
    for i, (config, d2t) in enumerate(cases):
        heads = randomized(MedusaHeads.create(config, model, d2t), seed=i)
        out = save_heads(heads, tmp_path / f"heads{i}")
        assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
        again = load_heads(out, model, tokenizer)
        assert again.config == config
        assert HeadsConfig.from_dict(json.loads((out / "config.json").read_text())) == config
        assert (again.d2t is None) == (d2t is None)
        if d2t is not None:
            assert mx.array_equal(again.d2t, d2t)
        assert mx.array_equal(again(features), heads(features))
    # Saving again over heads replaces them; a folder that is not heads is refused.
    save_heads(MedusaHeads.create(cases[0][0], model), tmp_path / "heads1")
    assert load_heads(tmp_path / "heads1", model, tokenizer).d2t is None
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(SpecmlxError, match="not a heads folder"):
        save_heads(heads, tmp_path / "other")


def test_a_folder_with_wrong_weights_is_refused_in_one_line(loaded, tmp_path):
    model, tokenizer = loaded("llama")
    folder = save_heads(MedusaHeads.create(medusa_config(model, tokenizer), model), tmp_path / "h")
    weights = mx.load(str(folder / "model.safetensors"))
    name = sorted(weights)[0]
    for broken, what in [
        ({k: v for k, v in weights.items() if k != name}, f"lacks weight {name}"),
        (weights | {"extra.weight": mx.zeros((2,))}, "has an unexpected weight extra.weight"),
        (weights | {name: mx.zeros((3, 3))}, f"has weight {name} of shape \\(3, 3\\)"),
    ]:
        mx.save_safetensors(str(folder / "model.safetensors"), broken)
        with pytest.raises(SpecmlxError, match=what) as error:
            load_heads(folder, model, tokenizer)
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("interrupt", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_save_leaves_nothing_half_written(loaded, tmp_path, monkeypatch, interrupt):
    model, tokenizer = loaded("llama")
    config = medusa_config(model, tokenizer)
    save_heads(MedusaHeads.create(config, model), tmp_path / "old")
    before = {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()}

    def failing_writer(path, arrays, metadata=None):
        with open(path, "wb") as f:
            f.write(b"half a file")
        raise interrupt

    monkeypatch.setattr(heads_store.mx, "save_safetensors", failing_writer)
    heads = randomized(MedusaHeads.create(config, model))
    for name in ("new", "old"):
        with pytest.raises(type(interrupt)):
            save_heads(heads, tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # no staging folder left
    assert {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()} == before


def test_heads_refuse_another_target_in_one_line(loaded, tmp_path):
    llama, tokenizer = loaded("llama")
    folder = save_heads(MedusaHeads.create(medusa_config(llama, tokenizer), llama), tmp_path / "h")
    for other, what in [("qwen2", "model_type"), ("llama-draft", "embeddings")]:
        model, other_tokenizer = loaded(other)
        with pytest.raises(SpecmlxError, match=what) as error:
            load_heads(folder, model, other_tokenizer)
        assert "\n" not in str(error.value)
    with pytest.raises(SpecmlxError, match="no heads folder"):
        load_heads(tmp_path / "missing", llama, tokenizer)
    with pytest.raises(SpecmlxError, match="Hugging Face Hub") as error:  # HF_HUB_OFFLINE=1
        load_heads("specmlx-test/no-such-heads", llama, tokenizer)
    assert "\n" not in str(error.value)


def test_the_same_target_quantized_still_fits(loaded, tiny_dirs, tmp_path):
    model, tokenizer = loaded("llama")
    heads = randomized(MedusaHeads.create(medusa_config(model, tokenizer), model))
    folder = save_heads(heads, tmp_path / "h")
    quantized, _ = mlx_lm.load(str(tiny_dirs["llama"]))  # a copy: the shared one stays fp32
    nn.quantize(quantized, group_size=32, bits=8)
    again = load_heads(folder, quantized, tokenizer)
    features = features_of(model, tokenizer.encode(PROMPTS[2]))
    assert mx.allclose(again(features), heads(features), atol=0.05)


# --- drafting -----------------------------------------------------------------------------


def test_the_tree_holds_the_most_probable_paths():
    heads = type("Stub", (), {"config": HeadsConfig("medusa", 8, 50, 50, num_heads=3)})()
    drafter = MedusaDrafter(heads, tree_size=12, width=3)
    rng = np.random.default_rng(0)
    probs = [sorted(rng.dirichlet(np.ones(50))[:3], reverse=True) for _ in range(3)]
    ids = [[10 * head + rank for rank in range(3)] for head in range(3)]
    builder, scores = drafter._best_paths(ids, [[float(p) for p in row] for row in probs])
    assert len(builder.tokens) == 11 and scores == sorted(scores, reverse=True)
    # Every path of up to 3 heads, ranked by its product: the tree is the best 11.
    scored = [
        (math.prod(probs[h][r] for h, r in enumerate(ranks)), ranks)
        for n in (1, 2, 3)
        for ranks in itertools.product(range(3), repeat=n)
    ]
    best = sorted(scored, reverse=True)[:11]
    tree = builder.tree()
    paths = set()
    for node in range(1, tree.size):
        path = []
        while node:
            path.append(builder.tokens[node - 1] % 10)
            node = tree.parents[node - 1]
        paths.add(tuple(reversed(path)))
    assert paths == {ranks for _, ranks in best}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3_text"])
def test_greedy_medusa_equals_plain_decoding(loaded, arch):
    model, tokenizer = loaded(arch)
    config = medusa_config(model, tokenizer, num_heads=3)
    fresh = MedusaHeads.create(config, model)
    noisy = randomized(MedusaHeads.create(config, model), seed=1)
    drafted = 0
    # A one-token prompt: no feature row yet, the first step is plain.
    for ids in [*(tokenizer.encode(p) for p in PROMPTS[:3]), [7]]:
        plain, _ = run(model, ids, None, FixedK(0))
        for heads, k in [(fresh, 2), (noisy, 1), (noisy, 3), (noisy, 5)]:
            drafter = MedusaDrafter(heads, tree_size=10, width=4)
            out, steps = run(model, ids, drafter, FixedK(k))
            assert out == plain, (arch, ids, k)
            assert all(s.draft_depth <= min(k, 3) and s.n_drafted <= 9 for s in steps)
            drafted += sum(s.n_drafted for s in steps)
    assert drafted > 0


class Alternating:
    """Speculate, then a plain step, and so on: the drafter is not told of the plain ones."""

    def __init__(self, k: int):
        self.plans = itertools.cycle([Plan(k), Plan(0)])

    def start(self) -> None:
        pass

    def choose(self) -> Plan:
        return next(self.plans)

    def observe(self, step: Step) -> None:
        pass


def test_the_drafter_reads_the_features_of_plain_steps_too(loaded):
    model, tokenizer = loaded("gemma3_text")
    heads = randomized(MedusaHeads.create(medusa_config(model, tokenizer), model), seed=2)
    drafter = MedusaDrafter(heads, tree_size=8, width=3)
    seen = []  # (context, the feature row the heads read)
    top_candidates = heads.top_candidates

    def spy(row, width, n_heads=None):
        seen.append(row)
        return top_candidates(row, width, n_heads)

    propose = drafter.propose
    contexts = []

    def recording(context, k, sampling, stop=None):
        contexts.append(list(context))
        return propose(context, k, sampling, stop)

    heads.top_candidates, drafter.propose = spy, recording
    ids = tokenizer.encode(PROMPTS[3])
    plain, _ = run(model, ids, None, FixedK(0))
    out, steps = run(model, ids, drafter, Alternating(3))
    assert out == plain
    assert [s.k for s in steps[:4]] == [3, 0, 3, 0]
    assert len(contexts) == len(seen) >= 5
    for context, row in zip(contexts, seen, strict=True):
        # The newest row: the target's hidden state at the token before the last one.
        assert mx.allclose(row, features_of(model, context[:-1])[-1], atol=1e-4)


def sharpened(tiny_dirs, scale: float):
    """The tiny llama with its logits scaled: peaked distributions the heads can guess."""
    model, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    model.lm_head.weight = model.lm_head.weight * scale
    return model, tokenizer


def sampled_medusa(tiny_dirs):
    """A peaked target and heads close enough to it that many drafts are kept."""
    target, tokenizer = sharpened(tiny_dirs, 3.0)
    ids = tokenizer.encode("The quick brown fox")
    heads = randomized(MedusaHeads.create(medusa_config(target, tokenizer), target), 3, 0.1)
    return target, ids, MedusaDrafter(heads, tree_size=16, width=6)


def test_sampled_medusa_keeps_the_target_distribution(tiny_dirs):
    target, ids, drafter = sampled_medusa(tiny_dirs)
    sampling = SamplingConfig(temperature=1.0, top_p=0.9, top_k=20)
    pairs, n_accepted = sample_pairs(target, drafter, ids, sampling, k=2, max_tokens=3)
    assert n_accepted > 100  # drafted tokens were kept: the tree's accept path is exercised
    assert chi2_pvalue(pairs, exact_joint(target, ids, sampling)) > 0.01


def test_a_broken_tree_fallback_is_detected(tiny_dirs, monkeypatch):
    """The tree counterpart of tests/test_distribution.py's broken residual: where every
    child of a node is rejected, drawing from the target itself (the rejected children left
    in) instead of from the target without them biases the output, and the χ² test sees it."""
    real = verify.tree_sampling_arrays

    def broken(tree, tokens, target_probs):
        arrays = real(tree, tokens, target_probs)
        # "bonus" is a draw from the target itself at each node; a walk reads a node's
        # bonus only where it stops at its length limit, never together with its fallback.
        return {**arrays, "fallback": arrays["bonus"]}

    monkeypatch.setattr("specmlx.engine.decode.tree_sampling_arrays", broken)
    target, ids, drafter = sampled_medusa(tiny_dirs)
    root_children = []  # per proposal: how many first tokens the tree offers
    propose = drafter.propose

    def recording(context, k, sampling, stop=None):
        draft = propose(context, k, sampling, stop)
        root_children.append(len(draft.tree.children[0]))
        return draft

    drafter.propose = recording
    sampling = SamplingConfig(temperature=1.0)
    pairs, n_accepted = sample_pairs(target, drafter, ids, sampling, k=2, max_tokens=3)
    assert n_accepted > 100 and min(root_children) > 1  # kept drafts, siblings rejected
    assert chi2_pvalue(pairs, exact_joint(target, ids, sampling)) < 0.01


def test_a_tree_sized_from_costs_keeps_the_best_nodes_that_pay(loaded):
    """Through `propose`: with free verification every node pays, so the tree holds all it
    may; with dear verification none does and the step is plain; in between, the nodes kept
    are the best-first prefix `best_tree_size` picks from the paths' scores."""
    from specmlx.drafters.eagle import best_tree_size

    heads, ids, target = synced_heads(loaded)

    def proposal(verify_cost):
        drafter = MedusaDrafter(heads, 12, 3, verify_cost=verify_cost)
        drafter.prefill(ids, target)
        return drafter, drafter.propose(ids, 3, GREEDY)

    full_drafter, free = proposal(lambda n: 1.0)
    _, dear = proposal(lambda n: float(n))
    assert free.size == 11 and dear.size == 0  # tree_size 12, root included
    slope = lambda n: 1.0 + 0.15 * (n - 1)  # noqa: E731
    _, some = proposal(slope)
    newest = target.feature_rows(len(ids) - 2)[0]
    top_ids, top_probs = heads.top_candidates(newest, 3, 3)
    _, scores = full_drafter._best_paths(top_ids.tolist(), top_probs.tolist())
    assert 0 < some.size < free.size and some.size == best_tree_size(scores, slope, 0.0)
    assert some.tokens.tolist() == free.tokens.tolist()[: some.size]
    assert some.tree.parents == free.tree.parents[: some.size]


def test_a_cost_sized_medusa_measures_its_proposals(loaded):
    """Timed when the drafter is built: what a proposal of every head costs, the price of
    any proposal whatever its depth (a per-head cost, which the drafter takes, is 0)."""
    model, tokenizer = loaded("llama")
    heads = MedusaHeads.create(medusa_config(model, tokenizer), model)
    drafter = METHODS["medusa"].build(
        Models(model, tokenizer, heads={"medusa": heads}), MedusaOptions()
    )
    assert drafter.verify_cost is not None and drafter.traits.proposal(1) > 0
    assert drafter.traits.proposal_cost == drafter.step_cost >= 0
    assert drafter.traits.level_cost == drafter.level_cost >= 0
    depth = heads.config.num_heads
    assert drafter.traits.proposal(depth) == drafter.traits.proposal(1)
