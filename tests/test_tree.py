"""Tree calls: every path scored as a sequence, and the model left exactly as it was."""

from __future__ import annotations

import gc

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest
from mlx_lm.models.cache import make_prompt_cache

from specmlx.engine import tree as tree_module
from specmlx.engine.cache import Sequence, make_cache
from specmlx.engine.tree import PositionedRoPE, Tree, TreeBuilder, tree_call
from specmlx.errors import SpecmlxError

PROMPT = "The quick brown fox jumps over the lazy dog. " * 2
PATHS = [[5, 6, 7], [5, 9], [8], [8, 10, 11, 12]]


def chain_tree(length: int) -> Tree:
    """A tree that is one path: node i + 1 under node i."""
    return Tree(tuple(range(length)))


def module_graph(model: nn.Module) -> list[tuple[str, int]]:
    """Every module by path and identity: equal lists mean the same object graph."""
    return [(name, id(module)) for name, module in model.named_modules()]


def ropes(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m.rope for name, m in model.named_modules() if hasattr(m, "rope")}


def no_positioned_ropes(model: nn.Module) -> bool:
    return not any(isinstance(m, PositionedRoPE) for _, m in model.named_modules())


def tree_of(paths: list[list[int]]) -> TreeBuilder:
    builder = TreeBuilder()
    for path in paths:
        builder.add_path(path)
    return builder


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_tree_call_scores_every_path_as_a_sequence(tiny_dirs, arch):
    target, tokenizer = mlx_lm.load(str(tiny_dirs[arch]))
    ids = tokenizer.encode(PROMPT)
    builder = tree_of(PATHS)
    seq = Sequence(target)
    seq.sync(ids)
    logits = seq.forward(mx.array([ids[-1], *builder.tokens], mx.uint32), tree=builder.tree())
    for path in PATHS:
        nodes = builder.add_path(path)  # existing nodes: returns their indices
        plain = Sequence(target)
        plain.sync(ids)
        reference = plain.forward(mx.array([ids[-1], *path], mx.uint32))
        assert mx.allclose(logits[mx.array(nodes)], reference[1:], atol=1e-4), path


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_the_model_is_unchanged_after_a_tree_call(tiny_dirs, arch):
    model, tokenizer = mlx_lm.load(str(tiny_dirs[arch]))
    ids = tokenizer.encode(PROMPT)
    graph, original_ropes = module_graph(model), ropes(model)
    assert original_ropes  # the test means something: there are ropes to wrap
    plain_before = model(mx.array(ids)[None])
    builder = tree_of(PATHS)
    seq = Sequence(model)
    seq.sync(ids)
    mx.eval(seq.forward(mx.array([ids[-1], *builder.tokens], mx.uint32), tree=builder.tree()))
    assert no_positioned_ropes(model)
    assert module_graph(model) == graph
    assert all(ropes(model)[name] is rope for name, rope in original_ropes.items())
    assert all(c.tree_mask is None and c.tree_depths is None for c in seq.cache)
    # A plain mlx-lm forward, with and without a cache, is the one from before the tree call.
    assert mx.array_equal(model(mx.array(ids)[None]), plain_before)
    cache = make_prompt_cache(model)
    assert mx.array_equal(model(mx.array(ids)[None], cache=cache), plain_before)


def test_the_model_is_unchanged_after_a_tree_call_that_raises(tiny_dirs):
    model, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    ids = tokenizer.encode(PROMPT)
    graph, original_ropes = module_graph(model), ropes(model)
    seq = Sequence(model)
    seq.sync(ids)
    with pytest.raises(ValueError):  # three inputs for a tree of four nodes: shapes clash
        seq.forward(mx.array([ids[-1], 5, 6], mx.uint32), tree=chain_tree(3))
    cache = make_cache(model)
    with pytest.raises(KeyboardInterrupt), tree_call(model, cache, chain_tree(2)):
        assert not no_positioned_ropes(model)  # inside, the ropes are wrapped
        raise KeyboardInterrupt
    assert no_positioned_ropes(model)
    assert module_graph(model) == graph
    assert all(ropes(model)[name] is rope for name, rope in original_ropes.items())
    assert all(c.tree_mask is None for c in [*seq.cache, *cache])


def test_caches_without_a_tree_mask_are_refused_untouched(tiny_dirs):
    model, _ = mlx_lm.load(str(tiny_dirs["llama"]))
    graph = module_graph(model)
    with pytest.raises(SpecmlxError, match="tree drafting needs attention KV caches"):
        with tree_call(model, make_prompt_cache(model), chain_tree(2)):
            pytest.fail("the block must not run")
    assert module_graph(model) == graph


def test_rope_holders_are_found_once_per_model(tiny_dirs, monkeypatch):
    model, _ = mlx_lm.load(str(tiny_dirs["llama"]))
    walks = []
    walk = nn.Module.named_modules

    def counting(self):
        walks.append(id(self))
        return walk(self)

    monkeypatch.setattr(nn.Module, "named_modules", counting)
    cache = make_cache(model)
    for _ in range(3):
        with tree_call(model, cache, chain_tree(2)):
            pass
    assert walks == [id(model)]
    monkeypatch.undo()
    key = id(model)
    assert key in tree_module._ROPE_HOLDERS
    del model, cache
    gc.collect()
    assert key not in tree_module._ROPE_HOLDERS  # the entry goes with the model
