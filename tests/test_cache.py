"""Exact rewind for every cache kind the loop meets."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import ArraysCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

from specmlx.drafters.draft_model import DraftModelDrafter
from specmlx.engine.cache import Sequence, SpecKVCache
from specmlx.engine.decode import decode
from specmlx.engine.policy import FixedK
from specmlx.engine.sampling import SamplingConfig
from tests.tiny import ARCHS, make_model_dir

GREEDY = SamplingConfig()
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 4  # far past a window of 8


def greedy(target, ids, drafter=None, k=0, n=24):
    policy = FixedK(k)
    steps = decode(Sequence(target), ids, drafter, policy=policy, max_tokens=n, sampling=GREEDY)
    return [t for s in steps for t in s.tokens]


def test_trim_rewinds_kv_cache_exactly(tiny_dirs):
    model, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    ids = tokenizer.encode(LONG_PROMPT)
    seq = Sequence(model)
    seq.sync(ids)
    seq.forward(mx.array([ids[-1], 5, 6, 7], mx.uint32))
    seq.settle([ids[-1], 5])  # keep two of four
    assert seq.tokens == ids[:-1] + [ids[-1], 5] and seq.cache[0].offset == len(ids) + 1
    fresh = Sequence(model)
    fresh.sync([*ids, 5, 9])
    a = seq.forward(mx.array([9], mx.uint32))
    b = fresh.forward(mx.array([9], mx.uint32))
    assert mx.allclose(a, b, atol=1e-5)


def test_windowed_cache_matches_rotating_past_the_window(tiny_dirs):
    """gemma3_text's sliding layers, with a prompt far longer than their window."""
    model, tokenizer = mlx_lm.load(str(tiny_dirs["gemma3_text"]))
    assert any(isinstance(c, RotatingKVCache) for c in make_prompt_cache(model))
    assert any(isinstance(c, SpecKVCache) and c.window for c in Sequence(model).cache)
    ids = tokenizer.encode(LONG_PROMPT)
    assert len(ids) > 3 * ARCHS["gemma3_text"]["sliding_window"]
    reference = [int(tok) for tok, _ in generate_step(mx.array(ids), model, max_tokens=24)]
    assert greedy(model, ids) == reference


def test_speculation_past_the_window_equals_plain(tiny_dirs):
    target, tokenizer = mlx_lm.load(str(tiny_dirs["gemma3_text"]))
    draft, _ = mlx_lm.load(str(tiny_dirs["gemma3_text-draft"]))
    ids = tokenizer.encode(LONG_PROMPT)
    plain = greedy(target, ids, n=30)
    for k in (2, 5):
        assert greedy(target, ids, DraftModelDrafter(draft, 320), k, 30) == plain


class QuantizedCacheModel(nn.Module):
    """The same model, caching keys and values quantized to 8 bits."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.args = model.args

    @property
    def layers(self):
        return self.inner.layers

    def make_cache(self):
        return [QuantizedKVCache(group_size=32, bits=8) for _ in self.layers]

    def __call__(self, inputs, cache=None):
        return self.inner(inputs, cache=cache)


def test_quantized_kv_cache_rewinds(tmp_path):
    # Heads of 32 dimensions: the smallest group MLX quantizes.
    wide = dict(hidden_size=128, intermediate_size=128)
    model, tokenizer = mlx_lm.load(str(make_model_dir(tmp_path / "t", "llama", 1, **wide)))
    draft, _ = mlx_lm.load(str(make_model_dir(tmp_path / "d", "llama", 2, **wide)))
    target = QuantizedCacheModel(model)
    assert isinstance(Sequence(target).cache[0], QuantizedKVCache)
    ids = tokenizer.encode(LONG_PROMPT)
    plain = greedy(target, ids)
    assert greedy(target, ids, DraftModelDrafter(QuantizedCacheModel(draft), 320), 4) == plain


@pytest.fixture(scope="module")
def mamba_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mamba")
    return make_model_dir(root / "t", "mamba", seed=1), make_model_dir(root / "d", "mamba", seed=2)


def test_recurrent_state_is_checkpointed_and_restored(mamba_dirs, tiny_dirs):
    """SSM caches can't be trimmed: the loop restores a checkpoint and replays what it kept."""
    target, tokenizer = mlx_lm.load(str(mamba_dirs[0]))
    draft, _ = mlx_lm.load(str(mamba_dirs[1]))
    seq = Sequence(target)
    assert isinstance(seq.cache[0], ArraysCache) and not seq.trimmable
    ids = tokenizer.encode("Once upon a time there was")
    plain = greedy(target, ids)
    for k in (1, 3):
        # The unrelated draft makes rejections, so restores and replays happen.
        assert greedy(target, ids, DraftModelDrafter(draft, 320), k) == plain
        assert greedy(target, ids, DraftModelDrafter(target, 320), k) == plain


def test_sync_reuses_the_common_prefix(tiny_dirs):
    model, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    ids = tokenizer.encode(LONG_PROMPT)
    seq = Sequence(model)
    seq.sync(ids)
    calls = []
    original = seq.model

    def counting(inputs, cache=None):
        calls.append(inputs.shape[1])
        return original(inputs, cache=cache)

    seq.model = counting
    seq.sync([*ids[:-3], 7, 8])  # diverges three tokens before the end
    assert calls == [1] and seq.tokens == [*ids[:-3], 7]


def test_interrupted_call_is_repaired_on_next_sync(tiny_dirs):
    model, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    ids = tokenizer.encode(LONG_PROMPT)
    seq = Sequence(model)
    seq.sync(ids)
    seq.forward(mx.array([ids[-1], 1, 2], mx.uint32))  # never settled, as after Ctrl-C
    seq.sync([*ids, 4])
    assert all(c.offset == len(ids) for c in seq.cache)
