"""Rewinding hybrid targets: Gated DeltaNet layers set to their state at the last kept token
from the verify call's own trace, with no second call; trees refused."""

from __future__ import annotations

import mlx.core as mx
import pytest

from specmlx.engine.cache import Sequence
from specmlx.errors import SpecmlxError
from specmlx.testing import tiny_hybrid


def held(seq: Sequence) -> list[mx.array]:
    """What the cache holds for the confirmed tokens: every recurrent entry, every KV row."""
    out = []
    for c in seq.cache:
        if hasattr(c, "cache"):
            out += list(c.cache)
        else:
            out += [c.keys[..., : c.offset, :], c.values[..., : c.offset, :]]
    return out


@pytest.fixture(scope="module")
def model():
    return tiny_hybrid(vocab_size=128)


def test_hybrid_layers_rewind_from_their_trace(model):
    seq = Sequence(model)
    assert not seq.trimmable and seq.recurrent == [0, 2]  # the Gated DeltaNet layers


@pytest.mark.parametrize("kept", [0, 1, 2, 4])
def test_after_any_rewind_the_state_is_a_fresh_prefill_s(model, kept):
    context = [(5 * i + 3) % 128 for i in range(20)]
    seq = Sequence(model)
    seq.sync(context)
    calls = []
    original = type(model).__call__
    type(model).__call__ = lambda self, *a, **kw: calls.append(1) or original(self, *a, **kw)
    try:
        # Two verify calls before one settle (as a draft model feeds its drafts), then
        # a second round that keeps everything.
        seq.forward(mx.array([context[-1], 7, 9], mx.uint32))
        seq.forward(mx.array([11, 13], mx.uint32))
        seq.settle([context[-1], 7, 9, 11, 13][:kept])
        assert len(calls) == 2  # no replay
        seq.forward(mx.array([17, 19], mx.uint32))
        seq.settle([17, 19])
    finally:
        type(model).__call__ = original
    fresh = Sequence(model)
    fresh.sync([*seq.tokens, 0])
    assert seq.tokens == [*context[:-1], *[context[-1], 7, 9, 11, 13][:kept], 17, 19]
    for ours, theirs in zip(held(seq), held(fresh), strict=True):
        assert ours.shape == theirs.shape
        # Bit for bit on the reference BLAS; OpenBLAS rounds a 3-token call and a prefill of
        # 23 differently (~1e-6), in the attention layers as much as in the recurrent ones.
        assert mx.allclose(ours, theirs, rtol=1e-4, atol=1e-5).item()


def test_replay_still_rewinds_when_asked_to(model, monkeypatch):
    monkeypatch.setattr(Sequence, "trace_recurrent", False)
    context = [(3 * i + 1) % 128 for i in range(12)]
    seq = Sequence(model)
    assert seq.recurrent is None
    seq.sync(context)
    seq.forward(mx.array([context[-1], 5, 6], mx.uint32))
    seq.settle([context[-1]])
    fresh = Sequence(model)
    fresh.sync([*seq.tokens, 0])
    for ours, theirs in zip(held(seq), held(fresh), strict=True):
        assert mx.allclose(ours, theirs, atol=1e-5).item()


def test_a_tree_on_a_recurrent_target_is_refused(model):
    from specmlx.engine.tree import Tree

    seq = Sequence(model)
    seq.sync([1, 2, 3])
    with pytest.raises(SpecmlxError, match="cannot verify a token tree"):
        seq.forward(mx.array([3, 4, 5], mx.uint32), Tree((0, 0)))


def test_the_overhead_bench_shows_one_call_per_step_where_replay_needs_two():
    from specmlx.bench.overhead import measure_rewind

    trace, replay = measure_rewind(draws=1, max_tokens=12)
    assert trace.rewind == "trace" and replay.rewind == "replay"
    assert trace.tokens_per_step == replay.tokens_per_step  # the same greedy steps
    assert trace.calls_per_step == 1.0 and replay.calls_per_step > 1.5
