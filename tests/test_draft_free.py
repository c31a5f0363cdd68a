"""Prompt lookup and Lookahead: lossless, and their parts checked against plain references."""

from __future__ import annotations

import random

import mlx.core as mx
import mlx_lm
import pytest

from specmlx.drafters.lookahead import LookaheadDrafter
from specmlx.drafters.ngram import NgramDrafter, NgramIndex
from specmlx.engine.cache import Sequence
from specmlx.engine.decode import decode
from specmlx.engine.policy import FixedK
from specmlx.engine.sampling import SamplingConfig
from specmlx.engine.tree import Tree, TreeBuilder
from tests.test_decode import PROMPTS

GREEDY = SamplingConfig()
REPEATING = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add("
DRAFTERS = {
    "ngram": lambda: NgramDrafter(1, 4),
    "lookahead": lambda: LookaheadDrafter(window=4, ngram=3, guesses=4),
}


def chain_tree(length: int) -> Tree:
    """A tree that is one path: node i + 1 under node i."""
    return Tree(tuple(range(length)))


def run(target, ids, drafter, k=4, n=24, sampling=GREEDY):
    steps = list(
        decode(Sequence(target), ids, drafter, policy=FixedK(k), max_tokens=n, sampling=sampling)
    )
    return [t for s in steps for t in s.tokens], steps


@pytest.mark.parametrize("method", DRAFTERS)
@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_greedy_equals_plain(tiny_dirs, method, arch):
    target, tokenizer = mlx_lm.load(str(tiny_dirs[arch]))
    prompts = [REPEATING, *PROMPTS] if arch == "llama" else [REPEATING, *PROMPTS[:4]]
    accepted = 0
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        plain, _ = run(target, ids, None, k=0)
        for k in (2, 5):
            spec, steps = run(target, ids, DRAFTERS[method](), k=k)
            assert spec == plain, (prompt, k)
            accepted += sum(s.n_accepted for s in steps)
    assert accepted > 0  # the drafts were not all rejected: the accept path ran too


def test_ngram_hits_on_repetition(tiny_dirs):
    """A repeating target output is drafted from its own history."""
    target, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    ids = tokenizer.encode("lazy lazy lazy lazy")
    _, steps = run(target, ids, NgramDrafter(1, 3), k=4, n=40)
    _, plain_steps = run(target, ids, None, k=0, n=40)
    assert len(steps) < len(plain_steps)


def brute_force(tokens, min_n, max_n, k):
    """The most recent earlier occurrence of the longest suffix, by scanning."""
    end = len(tokens)
    for n in range(min(max_n, end), min_n - 1, -1):
        suffix = tokens[end - n :]
        for start in range(end - 1, n - 1, -1):  # continuation start, most recent first
            if tokens[start - n : start] == suffix:
                return tokens[start : start + k]
    return []


def test_ngram_index_matches_brute_force():
    rng = random.Random(0)
    for trial in range(300):
        vocab = rng.choice([2, 3, 5, 20])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        min_n, max_n = sorted(rng.sample(range(1, 6), 2)) if trial % 3 else (1, 1)
        index = NgramIndex(min_n, max_n)
        cut = rng.randrange(len(tokens) + 1)
        index.extend(tokens[:cut])  # incrementally, in two pieces
        index.extend(tokens[cut:])
        for k in (1, 3, 8):
            assert index.lookup(k) == brute_force(tokens, min_n, max_n, k), (tokens, min_n, max_n)


def test_lookahead_tree_mask_is_the_hand_built_one():
    """W=3, N=3, one candidate (c1, c2): nodes and who sees whom, written out by hand."""
    drafter = LookaheadDrafter(window=3, ngram=3, guesses=2)
    drafter.levels = [[0, 11, 12], [20, 21, 22]]  # level 0 (its [0] becomes last), level 1
    drafter.pool = {7: {(30, 31): None}}
    draft = drafter.propose([5, 7], 4, SamplingConfig())
    # Nodes: 0 last=7 | 1 c1=30 | 2 c2=31 | 3 L0_1=11 | 4 L0_2=12 | 5 L1_0=20 | 6 L1_1=21
    # | 7 L1_2=22. Column i is [last, L0_1..L0_i, L1_i].
    assert draft.tokens.tolist() == [30, 31, 11, 12, 20, 21, 22]
    expected = [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 0, 0, 1, 0, 0, 0, 0],
        [1, 0, 0, 1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0, 1, 0, 0],
        [1, 0, 0, 1, 0, 0, 1, 0],
        [1, 0, 0, 1, 1, 0, 0, 1],
    ]
    assert draft.tree.ancestor_mask().astype(mx.int32).tolist() == expected
    assert draft.tree.depths == (0, 1, 2, 1, 2, 1, 2, 3)
    assert drafter._last_level_nodes == [5, 6, 7]


def test_tree_call_scores_every_path_as_a_sequence(tiny_dirs):
    """Each node's logits in one tree call equal a plain call over its root-to-node path."""
    for arch in ("llama", "gemma3_text", "qwen2"):
        target, tokenizer = mlx_lm.load(str(tiny_dirs[arch]))
        ids = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 2)
        builder = TreeBuilder()
        paths = [[5, 6, 7], [5, 9], [8], [8, 10, 11, 12]]
        for path in paths:
            builder.add_path(path)
        seq = Sequence(target)
        seq.sync(ids)
        logits = seq.forward(mx.array([ids[-1], *builder.tokens], mx.uint32), tree=builder.tree())
        for path in paths:
            nodes = builder.add_path(path)  # existing nodes: returns their indices
            plain = Sequence(target)
            plain.sync(ids)
            reference = plain.forward(mx.array([ids[-1], *path], mx.uint32))
            assert mx.allclose(logits[mx.array(nodes)], reference[1:], atol=1e-4), (arch, path)
        # Keeping one path compacts the cache: the next call matches a fresh sequence.
        path_nodes = builder.add_path(paths[3])
        seq.settle([ids[-1], *paths[3]], path=[0, *path_nodes])
        fresh = Sequence(target)
        fresh.sync([*ids, *paths[3], 3])
        a = seq.forward(mx.array([3], mx.uint32))
        assert mx.allclose(a, fresh.forward(mx.array([3], mx.uint32)), atol=1e-4), arch


def test_tree_chain_is_a_chain():
    tree = chain_tree(3)
    assert tree.depths == (0, 1, 2, 3)
    assert tree.children == ((1,), (2,), (3,), ())
