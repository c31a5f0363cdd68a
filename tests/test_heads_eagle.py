"""EAGLE heads and EAGLE-2 trees: exact trees, lossless decoding, a draft cache that rewinds."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten, tree_map

from specmlx.api.methods import METHODS, EagleOptions
from specmlx.api.models import Models
from specmlx.drafters.eagle import EagleDrafter, best_tree_size
from specmlx.engine.cache import Sequence
from specmlx.engine.decode import decode
from specmlx.engine.features import FeatureSpec
from specmlx.engine.policy import FixedK
from specmlx.engine.policy.base import Plan
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.step import Verdict
from specmlx.engine.tree import TreeBuilder
from specmlx.heads.base import HeadsConfig, target_vocab
from specmlx.heads.eagle import EagleHead
from tests.test_distribution import chi2_pvalue, exact_joint, sample_pairs

FAMILIES = ["llama", "qwen2", "gemma3_text"]
PROMPT = "def fibonacci(n):"
GREEDY = SamplingConfig()


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tiny_dirs):
    model, tokenizer = mlx_lm.load(str(tiny_dirs[request.param]))
    return request.param, model, tokenizer, tiny_dirs[request.param]


def make_head(model, folder, noise=0.0, seed=0, d2t=None) -> EagleHead:
    """A fresh head, or one with its weights perturbed (a head whose layer does something)."""
    vocab = target_vocab(model)
    config = HeadsConfig(
        kind="eagle",
        hidden_size=model.args.hidden_size,
        target_vocab=vocab,
        draft_vocab=vocab if d2t is None else d2t.shape[0],
        target_args=json.loads((folder / "config.json").read_text()),
    )
    head = EagleHead.create(config, model, d2t=d2t)
    if noise:
        mx.random.seed(seed)
        noisy = tree_map(
            lambda w: w + noise * mx.random.normal(w.shape), head.trainable_parameters()
        )
        head.update(noisy)
    return head


def log_softmax(logits: mx.array) -> mx.array:
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def generate(model, ids, drafter, policy, max_tokens=32, sampling=GREEDY):
    steps = list(
        decode(
            Sequence(model), ids, drafter, policy=policy, max_tokens=max_tokens, sampling=sampling
        )
    )
    return [t for s in steps for t in s.tokens], steps


# -- the head --------------------------------------------------------------------------------


def test_fresh_heads_train_only_their_own_weights(family):
    _, model, _, folder = family
    head = make_head(model, folder)
    names = {name.split(".")[0] for name, _ in tree_flatten(head.trainable_parameters())}
    assert names == {"fc", "layer"}  # the target's embedding and output rows are borrowed
    features = mx.random.normal((3, model.args.hidden_size))
    # A fresh head is the identity on the features: o_proj and down_proj start at zero.
    assert mx.allclose(head(features, mx.array([5, 6, 7]), head.make_cache()), features, atol=1e-5)


def test_a_tree_call_scores_every_path_as_a_sequence(family):
    """All nodes of a hand-built tree in one call (positions by depth, an ancestor mask)
    give each node what a plain causal call over its path gives."""
    _, model, _, folder = family
    head = make_head(model, folder, noise=0.3)
    d = model.args.hidden_size
    mx.random.seed(7)
    prefix_features, prefix_tokens = mx.random.normal((5, d)), mx.array([3, 1, 4, 1, 5])
    builder = TreeBuilder()
    for path in [[9, 2, 6], [9, 5], [8], [8, 7, 11, 12]]:
        builder.add_path(path)
    tree = builder.tree()
    tokens, n = [10, *builder.tokens], tree.size  # node 0 (the root) is a new entry too
    features = mx.random.normal((n, d))
    ancestors = tree.ancestor_mask()  # (n, n)
    cache = head.make_cache()
    head(prefix_features, prefix_tokens, cache)
    mask = mx.concatenate([mx.ones((n, 5), mx.bool_), ancestors], axis=1)
    positions = 5 + mx.array(tree.depths)
    tree_out = head(features, mx.array(tokens), cache, positions, mask)
    for node in range(n):
        path = [j for j in range(n) if ancestors[node, j].item()]
        plain = head.make_cache()
        head(prefix_features, prefix_tokens, plain)
        out = head(features[mx.array(path)], mx.array([tokens[j] for j in path]), plain)
        assert mx.allclose(tree_out[mx.array(path)], out, atol=1e-4), path


@pytest.mark.parametrize("temperatures", [(), (2.0, 0.5)], ids=["as-trained", "fitted"])
def test_every_grown_node_scores_its_path(family, temperatures):
    """The level-by-level growth (the frontier's ancestors in the draft cache, depths as
    positions) gives each candidate the log probability of feeding its path in sequence,
    each level's at its temperature (the last one serving deeper levels)."""
    _, model, tokenizer, folder = family
    head = make_head(model, folder, noise=0.3)
    head.config = dataclasses.replace(head.config, temperatures=temperatures)
    temperature = [1.0, 1.0, 1.0, 1.0] if not temperatures else [2.0, 0.5, 0.5, 0.5]
    ids = tokenizer.encode(PROMPT)
    target = Sequence(model)
    target.capture(FeatureSpec())
    target.sync(ids)
    drafter = EagleDrafter(head, tree_size=40, depth=4, width=3)
    drafter.prefill(ids, target)
    root = drafter._feed(ids, len(ids) - 1)[-1:]
    draft_ids, scores, parents = (a.tolist() for a in drafter._grow(root, 4))
    assert len(draft_ids) == 3 + 3 * 9
    for node in range(len(draft_ids)):
        path = [node]
        while parents[path[0]] != -1:
            path.insert(0, parents[path[0]])
        cache = head.make_cache()
        fed = head(target.feature_rows(0), mx.array(ids[1:]), cache)[-1:]
        logp = log_softmax(head.logits(fed)[0] / temperature[0])
        total = logp[draft_ids[path[0]]].item()
        for level, (parent, child) in enumerate(zip(path, path[1:], strict=False), start=1):
            fed = head(fed, mx.array([draft_ids[parent]]), cache)
            logits = head.logits(fed)[0] / temperature[level]
            total += log_softmax(logits)[draft_ids[child]].item()
        assert math.isclose(total, scores[node], abs_tol=1e-3), path


# -- decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("noise", [0.0, 0.05], ids=["fresh", "perturbed"])
def test_greedy_speculation_equals_plain_decoding(family, noise):
    _, model, tokenizer, folder = family
    ids = tokenizer.encode(PROMPT)
    plain, _ = generate(model, ids, None, FixedK(0))
    drafter = EagleDrafter(make_head(model, folder, noise), tree_size=24, depth=4, width=6)
    spec, steps = generate(model, ids, drafter, FixedK(4))
    assert spec == plain
    assert all(s.draft_depth <= 4 and s.n_drafted <= 23 for s in steps)
    # Each proposal is timed apart from its verify call (the bench's `draft c`).
    drafted = [s for s in steps if s.n_drafted]
    assert drafted and all(0 < s.draft_seconds < s.seconds for s in drafted)


def test_a_right_head_gets_whole_paths_accepted(tiny_dirs):
    """A fresh head repeats the target's last prediction; the tiny qwen2 soon repeats its
    tokens, so there the head is right and paths of several tokens are kept."""
    model, tokenizer = mlx_lm.load(str(tiny_dirs["qwen2"]))
    ids = tokenizer.encode(PROMPT)
    drafter = EagleDrafter(make_head(model, tiny_dirs["qwen2"]), tree_size=24, depth=4, width=6)
    spec, steps = generate(model, ids, drafter, FixedK(4))
    assert spec == generate(model, ids, None, FixedK(0))[0]
    assert max(s.n_accepted for s in steps) >= 3


def test_a_draft_vocabulary_subset_maps_back_to_target_ids(family):
    _, model, tokenizer, folder = family
    ids = tokenizer.encode(PROMPT)
    d2t = mx.array(random.Random(0).sample(range(target_vocab(model)), 64), mx.int32)
    drafter = EagleDrafter(make_head(model, folder, 0.05, d2t=d2t), tree_size=16, depth=3, width=4)
    target = Sequence(model)
    target.capture(drafter.traits.features)
    target.sync(ids)
    drafter.prefill(ids, target)
    draft = drafter.propose(ids, 3, SamplingConfig())
    assert set(draft.tokens.tolist()) <= set(d2t.tolist()) and draft.size == 15
    assert generate(model, ids, drafter, FixedK(3))[0] == generate(model, ids, None, FixedK(0))[0]


def test_sampling_keeps_the_target_distribution(tiny_dirs):
    """The first two tokens, drafted by a perturbed head's trees, are drawn as the target's."""
    model, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    sampling = SamplingConfig(temperature=1.0, top_p=0.9, top_k=20)
    ids = tokenizer.encode("The quick brown fox")
    drafter = EagleDrafter(
        make_head(model, tiny_dirs["llama"], 0.05), tree_size=12, depth=2, width=4
    )
    pairs, n_accepted = sample_pairs(model, drafter, ids, sampling, k=2, max_tokens=3)
    # Drafts were kept (about 450 in the 2500 responses): the tree's accept path is
    # exercised, not only its fallback.
    assert n_accepted > 100
    assert chi2_pvalue(pairs, exact_joint(model, ids, sampling)) > 0.01


# -- the draft cache -----------------------------------------------------------------------


class Scripted:
    """Plans k from a script (0: a plain step, which the drafter is not told of)."""

    def __init__(self, ks: list[int]):
        self.ks = iter(ks)

    def start(self) -> None:
        pass

    def choose(self) -> Plan:
        return Plan(next(self.ks, 3))

    def observe(self, outcome) -> None:
        pass


def test_the_draft_cache_holds_exactly_the_confirmed_positions(family):
    _, model, tokenizer, folder = family
    ids = tokenizer.encode(PROMPT)
    head = make_head(model, folder, noise=0.05)
    drafter = EagleDrafter(head, tree_size=16, depth=3, width=4)
    script = [3, 3, 0, 0, 3, 0, 3, 3, 3]  # plain steps in between are caught up
    context, proposed_at = list(ids), None
    for step in decode(
        Sequence(model), ids, drafter, policy=Scripted(script), max_tokens=24, sampling=GREEDY
    ):
        if step.n_drafted:  # a proposal (step.k stays planned where max_tokens cut it)
            proposed_at = list(context)
            # Every tree entry is gone: the cache holds the positions of context[:-1].
            assert drafter.cache[0].offset == drafter.n_consumed == len(proposed_at) - 1
        context.extend(step.tokens)
    assert context == ids + generate(model, ids, None, FixedK(0), max_tokens=24)[0]
    # A fresh drafter fed the same context in one go holds the same entries.
    target = Sequence(model)
    target.capture(drafter.traits.features)
    target.sync(proposed_at)
    fresh = EagleDrafter(head, tree_size=16, depth=3, width=4)
    fresh.prefill(proposed_at, target)
    fresh.propose(proposed_at, 3, SamplingConfig())
    fresh.commit(Verdict([]))
    n = len(proposed_at) - 1
    assert fresh.cache[0].offset == n
    ours, theirs = drafter.cache[0], fresh.cache[0]
    assert mx.allclose(ours.keys[..., :n, :], theirs.keys[..., :n, :], atol=1e-4)
    assert mx.allclose(ours.values[..., :n, :], theirs.values[..., :n, :], atol=1e-4)


def test_a_new_response_reuses_the_shared_prefix(family):
    _, model, tokenizer, folder = family
    ids = tokenizer.encode(PROMPT)
    drafter = EagleDrafter(make_head(model, folder, noise=0.05), tree_size=16, depth=3, width=4)
    first, _ = generate(model, ids, drafter, FixedK(3), max_tokens=12)
    other = ids + first[:4] + [7, 8]
    target = Sequence(model)
    target.capture(drafter.traits.features)
    target.sync(other)
    drafter.prefill(other, target)
    assert drafter.n_consumed == len(other) - 2 and drafter.cache[0].offset == len(other) - 2
    assert (
        generate(model, other, drafter, FixedK(3), 12)[0]
        == generate(model, other, None, FixedK(0), 12)[0]
    )


# -- sizing the tree from costs ---------------------------------------------------------------


def brute_force(probs, verify_cost, step_cost):
    rates = [(1 + sum(probs[:n])) / (verify_cost(n + 1) + step_cost) for n in range(len(probs) + 1)]
    return rates.index(max(rates))


def test_best_tree_size_maximizes_tokens_per_time():
    rng = random.Random(0)
    for _ in range(200):
        probs = sorted((rng.random() ** 2 for _ in range(rng.randint(0, 40))), reverse=True)
        slope, curve = rng.uniform(0, 0.2), rng.uniform(0, 0.01)
        cost = lambda m, s=slope, c=curve: 1 + s * (m - 1) + c * (m - 1) ** 2  # noqa: E731
        step = rng.uniform(0, 2)
        assert best_tree_size(probs, cost, step) == brute_force(probs, cost, step)
        # A larger fixed cost per step makes a bigger tree pay: never a smaller one.
        assert best_tree_size(probs, cost, step + 1) >= best_tree_size(probs, cost, step)


def test_best_tree_size_edges():
    assert best_tree_size([], lambda m: 1.0, 0.0) == 0
    assert best_tree_size([0.9, 0.5, 0.1], lambda m: 1.0, 0.0) == 3  # free verification: all
    assert best_tree_size([0.9, 0.5], lambda m: float(m) ** 3, 0.0) == 0  # too dear: none


def test_a_drafter_with_costs_sizes_its_trees(family):
    _, model, tokenizer, folder = family
    ids = tokenizer.encode(PROMPT)
    head = make_head(model, folder, noise=0.05)
    sizes = {}
    for name, cost in {"free": lambda m: 1.0, "dear": lambda m: float(m) ** 3}.items():
        drafter = EagleDrafter(head, tree_size=16, depth=3, width=4, verify_cost=cost)
        target = Sequence(model)
        target.capture(drafter.traits.features)
        target.sync(ids)
        drafter.prefill(ids, target)
        sizes[name] = drafter.propose(ids, 3, SamplingConfig()).size
        drafter.commit(Verdict([]))
    assert sizes == {"free": 15, "dear": 0}


def test_a_dearer_proposal_makes_bigger_trees_pay(family):
    """The drafting's own cost is paid once per step however big the tree: the dearer it
    is, the more nodes pay for their verification (never fewer)."""
    _, model, tokenizer, folder = family
    ids = tokenizer.encode(PROMPT)
    head = make_head(model, folder, noise=0.05)
    sizes = []
    slope = lambda m: 1 + 0.15 * (m - 1)  # noqa: E731
    for step_cost in [0.0, 0.4, 1.0, 2.0]:
        drafter = EagleDrafter(head, 16, 3, 4, verify_cost=slope, step_cost=step_cost)
        target = Sequence(model)
        target.capture(drafter.traits.features)
        target.sync(ids)
        drafter.prefill(ids, target)
        sizes.append(drafter.propose(ids, 3, SamplingConfig()).size)
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] <= 15


def test_a_cost_sized_method_measures_its_proposals(tiny_dirs):
    """`--method eagle` without a tree size prices its trees with the target's calibrated
    v(n) and the proposal's own cost in target calls, timed when the drafter is built."""
    model, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    models = Models(model, tokenizer, heads={"eagle": make_head(model, tiny_dirs["llama"])})
    drafter = METHODS["eagle"].build(models, EagleOptions())
    assert drafter.verify_cost is not None and drafter.traits.proposal(drafter.depth) > 0
    # What any proposal costs, and what each of its levels adds (the head runs once a level).
    assert drafter.traits.proposal_cost == drafter.step_cost >= 0
    assert drafter.traits.level_cost == drafter.level_cost >= 0
    # Never more nodes than the largest call the calibration timed: past it v(n) is a guess.
    assert drafter.tree_size == 16
    assert METHODS["eagle"].build(models, EagleOptions(tree_size=8)).verify_cost is None
