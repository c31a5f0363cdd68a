"""Rewinding recurrent targets: Gated DeltaNet and Mamba-2 layers set to their state at the
last kept token from the verify call's own trace, with no second call; trees refused."""

from __future__ import annotations

import mlx.core as mx
import pytest

from specmlx.engine.cache import Sequence
from specmlx.errors import SpecmlxError
from specmlx.testing import tiny_hybrid
from tests.tiny import ARCHS, random_model


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


@pytest.fixture(scope="module")
def models(model):
    """Gated DeltaNet beside attention; Mamba-2 alone; Mamba-2 beside attention and MLP
    blocks that hold no cache (Nemotron-H)."""
    out = {"qwen3_next": model}
    for arch in ("mamba2", "nemotron_h", "granitemoehybrid", "falcon_h1"):
        out[arch] = random_model({**ARCHS[arch], "vocab_size": 128}, seed=1)
    return out


@pytest.mark.parametrize(
    "arch, traced",
    [
        ("qwen3_next", [0, 2]),
        ("mamba2", [0, 1]),
        ("nemotron_h", [0, 2]),
        ("granitemoehybrid", [0, 2]),
    ],
)
def test_recurrent_layers_rewind_from_their_trace(models, arch, traced):
    seq = Sequence(models[arch])
    assert not seq.trimmable and list(seq.recurrent) == traced  # by cache index


@pytest.mark.parametrize("arch", ["mamba", "falcon_h1"])
def test_other_recurrent_layers_rewind_by_replay(arch):
    """Mamba-1; Falcon-H1, whose layers keep an SSM and an attention cache in one list."""
    seq = Sequence(random_model({**ARCHS[arch], "vocab_size": 128}))
    assert not seq.trimmable and seq.recurrent is None


@pytest.mark.parametrize("arch", ["qwen3_next", "mamba2", "nemotron_h", "granitemoehybrid"])
@pytest.mark.parametrize("kept", [0, 1, 2, 4])
def test_after_any_rewind_the_state_is_a_fresh_prefill_s(models, arch, kept):
    model = models[arch]
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

    rows = measure_rewind(draws=1, max_tokens=12)
    assert [(r.target, r.rewind) for r in rows] == [
        ("qwen3_next", "trace"),
        ("qwen3_next", "replay"),
        ("nemotron_h", "trace"),
        ("nemotron_h", "replay"),
    ]
    for trace, replay in (rows[:2], rows[2:]):
        assert trace.tokens_per_step == replay.tokens_per_step  # the same greedy steps
        assert trace.calls_per_step == 1.0 and replay.calls_per_step > 1.5


@pytest.mark.parametrize("arch", ["mamba2", "nemotron_h", "granitemoehybrid", "falcon_h1"])
def test_speculation_on_mamba2_layers_is_greedy_exact(models, arch):
    """A draft of its own kind (rejections rewound on both sides) and the target as its own
    draft (everything kept): the target's greedy output, token for token."""
    from specmlx.drafters.draft_model import DraftModelDrafter
    from specmlx.engine.decode import decode
    from specmlx.engine.policy import FixedK
    from specmlx.engine.sampling import SamplingConfig

    target = models[arch]
    other = random_model({**ARCHS[arch], "vocab_size": 128}, seed=2)
    ids = [(7 * i + 2) % 128 for i in range(16)]

    def run(drafter, k):
        sequence, greedy = Sequence(target), SamplingConfig()
        steps = list(
            decode(sequence, ids, drafter, policy=FixedK(k), max_tokens=24, sampling=greedy)
        )
        return [t for s in steps for t in s.tokens], sum(s.n_accepted for s in steps)

    plain, _ = run(None, 0)
    for draft in (other, target):
        out, kept = run(DraftModelDrafter(draft, 128), 3)
        assert out == plain
        assert kept > 0 or draft is other
