"""One host sync per step: counted at every point where the host waits for MLX."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest

from specmlx.bench.syncs import counting_syncs
from specmlx.drafters.draft_model import DraftModelDrafter
from specmlx.drafters.lookahead import LookaheadDrafter
from specmlx.drafters.ngram import NgramDrafter
from specmlx.engine.cache import Sequence
from specmlx.engine.costs import CostProfile
from specmlx.engine.decode import decode
from specmlx.engine.policy import AdaptiveK, FixedK
from specmlx.engine.sampling import SamplingConfig
from tests.test_decode import PROMPTS

GREEDY = SamplingConfig()
SAMPLED = SamplingConfig(temperature=1.0, top_p=0.9)


@pytest.fixture(scope="module")
def llama(tiny_dirs):
    target, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    draft, _ = mlx_lm.load(str(tiny_dirs["llama-draft"]))
    return target, tokenizer, draft


def syncs_per_step(target, ids, drafter, policy, sampling, n=20):
    """The host syncs of each step after the first (which prefills the drafter)."""
    steps = decode(Sequence(target), ids, drafter, policy=policy, max_tokens=n, sampling=sampling)
    counts, drafted = [], []
    next(steps)
    while True:
        with counting_syncs() as syncs:
            step = next(steps, None)
        if step is None:
            return counts, drafted
        counts.append(syncs.count)
        drafted.append(step.n_drafted)


def test_the_counter_sees_every_kind_of_sync():
    a = mx.array([1, 2, 3]) * 2
    with counting_syncs() as syncs:
        a.tolist()
        int(a[0])
        float(a[1])
        bool(a[2] > 0)
        a[0].item()
        mx.eval(a)
        mx.async_eval(a)  # starts work, does not wait
    assert syncs.count == 6


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("method", ["none", "draft", "ngram", "lookahead"])
def test_one_sync_per_step_at_a_fixed_k(llama, method, sampling):
    target, tokenizer, draft = llama
    drafter = {
        "none": lambda: None,
        "draft": lambda: DraftModelDrafter(draft, 320),
        "ngram": lambda: NgramDrafter(1, 3),
        "lookahead": lambda: LookaheadDrafter(3, 3, 3),
    }[method]()
    # Every token id twice: whatever a step samples, the n-gram drafter finds it before.
    ids = list(range(tokenizer.vocab_size)) * 2
    mx.random.seed(0)
    counts, drafted = syncs_per_step(
        target, ids, drafter, FixedK(0 if method == "none" else 4), sampling
    )
    assert counts and all(count == 1 for count in counts), counts
    if method != "none":
        assert any(drafted)


def test_the_confidence_stop_rule_syncs_at_most_once_per_drafted_token(llama):
    target, tokenizer, draft = llama
    profile = CostProfile(1.0, 0.001, {k: 1.0 for k in range(1, 17)})
    drafter = DraftModelDrafter(draft, 320)
    policy = AdaptiveK(profile, drafter.traits)
    counts, drafted = syncs_per_step(target, tokenizer.encode(PROMPTS[1]), drafter, policy, GREEDY)
    assert any(drafted)
    for count, n in zip(counts, drafted, strict=True):
        # One per drafted token (its confidence), one for the draft's timing, one verify.
        assert count <= n + 2, (counts, drafted)


def test_p_min_at_a_fixed_k_reads_one_confidence_per_drafted_token(llama):
    target, tokenizer, draft = llama
    drafter = DraftModelDrafter(draft, 320)
    counts, drafted = syncs_per_step(
        target, tokenizer.encode(PROMPTS[1]), drafter, FixedK(4, p_min=0.5), GREEDY
    )
    assert any(drafted)
    assert all(count == n + 1 for count, n in zip(counts, drafted, strict=True) if n)


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_heads_sync_once_to_read_their_tree_and_once_to_verify(llama, method):
    from specmlx.drafters.eagle import EagleDrafter
    from specmlx.drafters.medusa import MedusaDrafter
    from specmlx.testing import tiny_heads

    target, tokenizer, _ = llama
    heads = tiny_heads(target, seed=3)[method]
    drafter = MedusaDrafter(heads, 16) if method == "medusa" else EagleDrafter(heads, 16)
    ids = tokenizer.encode(PROMPTS[1])
    counts, drafted = syncs_per_step(target, ids, drafter, FixedK(4), GREEDY)
    assert any(drafted)
    assert counts and all(count <= 2 for count in counts), counts
