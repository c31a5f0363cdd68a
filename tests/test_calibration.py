"""Medusa's tree scores corrected by depth against the target's tokens (`DepthCalibration`),
and cost-sized Medusa trees that shrink or grow with it."""

from __future__ import annotations

import mlx.core as mx
import pytest

from specmlx.drafters.calibration import DepthCalibration, node_depths
from specmlx.drafters.eagle import best_tree_size
from specmlx.drafters.medusa import MedusaDrafter
from specmlx.engine.cache import Sequence
from specmlx.engine.decode import decode
from specmlx.engine.policy import FixedK
from specmlx.engine.sampling import SamplingConfig
from specmlx.heads.medusa import MedusaHeads
from tests.test_heads_medusa import PROMPTS, medusa_config, randomized

GREEDY = SamplingConfig()
# A chain of three tokens, 7 8 9, its nodes scored 0.9, 0.8, 0.7.
CHAIN = ([0, 1, 2], [7, 8, 9], [0.9, 0.8, 0.7])


def test_node_depths_follow_parents():
    assert node_depths([0, 0, 1, 3, 2]) == [1, 1, 2, 3, 2]


def test_scores_stand_until_evidence_comes():
    calibration = DepthCalibration(3)
    assert calibration.ratios() == [1.0, 1.0, 1.0]
    # Capped at 1 and at the parent's score, nothing else changes.
    assert calibration.scaled([0, 1, 0], [0.5, 0.6, 1.2]) == [0.5, 0.5, 1.0]


def test_scaled_nodes_come_best_first_parents_before_children():
    """Deep levels cut more than shallow ones reorder the nodes: a prefix of the heads' own
    order would verify a deep node before a better sibling of its root."""
    calibration = DepthCalibration(3)
    calibration.ratios = lambda: [1.0, 0.3, 0.3]
    # a (0.6) -> b (0.6) -> c (0.5), then d (0.3) and e (0.25) under the root
    parents, tokens, scores = calibration.best_first(
        [0, 1, 2, 0, 0], [10, 11, 12, 13, 14], [0.6, 0.6, 0.5, 0.3, 0.25]
    )
    assert tokens == [10, 13, 14, 11, 12]  # a, d, e, b, c
    assert parents == [0, 0, 0, 1, 4]  # b under a (node 1), c under b (node 4)
    assert scores == pytest.approx([0.6, 0.3, 0.25, 0.18, 0.15])


def test_a_proposal_waits_for_the_tokens_that_settle_it():
    calibration = DepthCalibration(3)
    calibration.remember([1, 2], *CHAIN)
    calibration.observe([1, 2, 7, 8])  # along the chain, two levels of three: not settled
    assert calibration.predicted == [0.0, 0.0, 0.0]
    calibration.observe([1, 2, 7, 8, 9])  # the whole chain
    assert calibration.predicted == pytest.approx([0.9, 0.8, 0.7])
    assert calibration.reached == [1.0, 1.0, 1.0]
    calibration.remember([1, 2, 7, 8, 9], *CHAIN)
    calibration.observe([1, 2, 7, 8, 9, 7, 5])  # left the chain at its second level
    assert calibration.reached == pytest.approx([0.95 + 1, 0.95, 0.95])


def test_another_requests_context_is_no_evidence():
    calibration = DepthCalibration(3)
    calibration.remember([1, 2], *CHAIN)
    calibration.observe([3, 4, 7, 8, 9])  # another prompt, whose next tokens match the chain
    assert calibration.predicted == [0.0, 0.0, 0.0] and calibration.pending == 0


@pytest.mark.parametrize("kept", [0.0, 0.5, 1.0])
def test_the_ratio_comes_to_the_share_the_target_kept(kept):
    """Depth-1 guesses scored 0.9, kept a `kept` share of the time: the calibrated score
    comes to that share, whatever the heads said."""
    calibration = DepthCalibration(1)
    context = [1, 2]
    for step in range(200):
        calibration.observe(context)
        calibration.remember(context, [0], [7], [0.9])
        context.append(7 if (step * kept) % 1 + kept >= 1 else 5)
    calibration.observe(context)
    [score] = calibration.scaled([0], [0.9])
    assert score == pytest.approx(kept, abs=0.05)


def test_overconfident_trees_shrink_to_what_pays():
    """Sized by the heads' own scores, a chain pays for its verification; after twenty steps
    in which the target never took its first token, no node pays."""
    cost = lambda n: 1.0 + 0.3 * (n - 1)  # noqa: E731
    calibration = DepthCalibration(3)
    context = [1, 2]
    parents, tokens, scores = CHAIN
    first = best_tree_size(calibration.scaled(parents, scores), cost, 0.0)
    calibration.remember(context, *CHAIN)
    for _ in range(20):
        context.append(5)
        calibration.observe(context)
        last = best_tree_size(calibration.scaled(parents, scores), cost, 0.0)
        calibration.remember(context, *CHAIN)
    assert first == 3 and last == 0


# -- through the drafters --------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(loaded):
    model, tokenizer = loaded("llama")
    ids = tokenizer.encode(PROMPTS[3])
    steps = decode(Sequence(model), ids, None, policy=FixedK(0), max_tokens=48, sampling=GREEDY)
    plain = [t for s in steps for t in s.tokens]
    return model, tokenizer, ids, plain


def sizes_of(drafter, model, ids, plain):
    """Tree sizes per proposal at fixed k = 3; the output must be plain greedy's, and the
    proposals waiting to be settled never more than the heads' depth allows."""
    sizes = []
    propose = drafter.propose

    def recording(context, k, sampling, stop=None):
        draft = propose(context, k, sampling, stop)
        sizes.append(draft.size)
        assert drafter.calibration.pending <= drafter.heads.config.num_heads + 1
        return draft

    drafter.propose = recording
    steps = decode(Sequence(model), ids, drafter, policy=FixedK(3), max_tokens=48, sampling=GREEDY)
    assert [t for s in steps for t in s.tokens] == plain
    return sizes


def guesses(picks: list[int], prob: float) -> tuple[mx.array, mx.array]:
    """Each head's one candidate (`picks[i]`, width 1) at probability `prob`. # (K, 1)"""
    return mx.array(picks, mx.int32)[:, None], mx.full((len(picks), 1), prob)


@pytest.mark.parametrize("right", [False, True])
def test_medusa_trees_follow_what_the_target_kept(llama, right):
    """Heads that are confidently wrong stop drafting; heads that are always right but say
    0.5 draft deeper than their scores alone would pay for."""
    model, tokenizer, ids, plain = llama
    heads = randomized(MedusaHeads.create(medusa_config(model, tokenizer, num_heads=3), model))
    full = ids + plain
    cost = lambda n: 1.0 + 0.3 * (n - 1)  # noqa: E731
    drafter = MedusaDrafter(heads, 8, 1, verify_cost=cost)
    wrong = next(t for t in range(100) if t not in full)

    def top_candidates(row, width, n_heads):
        at = len(drafter._target.tokens) + 1  # the token after the context's last
        picks = [full[min(at + i, len(full) - 1)] if right else wrong for i in range(n_heads)]
        return guesses(picks, 0.95 if not right else 0.5)

    heads.top_candidates = top_candidates
    sizes = sizes_of(drafter, model, ids, plain)
    if right:
        # 0.5, 0.25, 0.125 pay for one node at this cost; kept every time, all three do.
        assert sizes[0] == 1 and max(sizes[-3:]) == 3
    else:
        assert sizes[0] == 3 and sizes[-3:] == [0, 0, 0]
