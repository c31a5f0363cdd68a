"""χ² test: speculative sampling keeps the target's distribution exactly.

For a short prompt, the first two generated tokens are drawn thousands of times with
speculation; their empirical joint distribution must match the target's exact one, computed
by enumeration. The same test must reject a deliberately broken acceptance rule, so it is
able to fail.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from scipy.stats import chisquare

from specmlx.drafters.draft_model import DraftModelDrafter
from specmlx.drafters.lookahead import LookaheadDrafter
from specmlx.drafters.ngram import NgramDrafter
from specmlx.engine import verify
from specmlx.engine.cache import Sequence
from specmlx.engine.decode import decode
from specmlx.engine.policy import FixedK
from specmlx.engine.sampling import SamplingConfig, warp

RUNS = 2500
PROMPT = "The quick brown fox"


class Sharpened(nn.Module):
    """A model whose logits are scaled: a peaked target (or a drafter close to it)."""

    def __init__(self, model: nn.Module, scale: float):
        super().__init__()
        self.inner = model
        self.scale = scale
        self.args = model.args

    @property
    def layers(self):
        return self.inner.layers

    def __call__(self, inputs, cache=None):
        return self.inner(inputs, cache=cache) * self.scale


@pytest.fixture(scope="module")
def models(tiny_dirs):
    target, tokenizer = mlx_lm.load(str(tiny_dirs["llama"]))
    other, _ = mlx_lm.load(str(tiny_dirs["llama-draft"]))
    return Sharpened(target, 3.0), Sharpened(target, 2.0), Sharpened(other, 3.0), tokenizer


def exact_joint(target, ids, sampling):
    """P(first two tokens) under the target, by enumerating the first. # (vocab, vocab)"""
    first = np.array(warp(target(mx.array(ids)[None])[0, -1], sampling))
    joint = np.zeros((first.size, first.size))
    for a in np.nonzero(first)[0]:
        second = warp(target(mx.array([*ids, int(a)])[None])[0, -1], sampling)
        joint[a] = first[a] * np.array(second)
    return joint


def chi2_pvalue(samples, joint):
    """Pearson χ² over the cells expected ≥ 5 times, the rest pooled into one cell."""
    counts = np.zeros_like(joint)
    for a, b in samples:
        counts[a, b] += 1
    expected = joint * len(samples)
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    assert observed.size > 10, "too few cells for a meaningful test"
    return chisquare(observed, expected * observed.sum() / expected.sum()).pvalue


def sample_pairs(target, drafter, ids, sampling, k, max_tokens):
    """The first two tokens of RUNS responses, and how many drafted tokens were kept in all
    (a test that never accepts a draft only exercises the rejection path)."""
    mx.random.seed(1234)
    sequence = Sequence(target)
    pairs, n_accepted = [], 0
    for _ in range(RUNS):
        out = []
        for step in decode(
            sequence, ids, drafter, policy=FixedK(k), max_tokens=max_tokens, sampling=sampling
        ):
            out.extend(step.tokens)
            n_accepted += step.n_accepted
        pairs.append((out[0], out[1]))
    return pairs, n_accepted


SAMPLINGS = [
    SamplingConfig(temperature=0.7),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_p=0.9),
    SamplingConfig(temperature=1.0, top_k=20, top_p=0.95),
]


@pytest.mark.parametrize(
    "sampling", SAMPLINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}"
)
def test_speculative_sampling_keeps_target_distribution(models, sampling):
    target, close_draft, _, tokenizer = models
    ids = tokenizer.encode(PROMPT)
    joint = exact_joint(target, ids, sampling)
    drafter = DraftModelDrafter(close_draft, target.args.vocab_size)
    # k=2 over three tokens: the first two come from drafts, residuals and bonus tokens.
    pairs, _ = sample_pairs(target, drafter, ids, sampling, k=2, max_tokens=3)
    assert chi2_pvalue(pairs, joint) > 0.01


def test_unrelated_draft_keeps_target_distribution(models):
    target, _, unrelated, tokenizer = models
    sampling = SamplingConfig(temperature=1.0)
    ids = tokenizer.encode(PROMPT)
    drafter = DraftModelDrafter(unrelated, target.args.vocab_size)
    pairs, _ = sample_pairs(target, drafter, ids, sampling, k=1, max_tokens=2)
    assert chi2_pvalue(pairs, exact_joint(target, ids, sampling)) > 0.01


@pytest.mark.parametrize("method", ["ngram", "lookahead"])
def test_draft_free_methods_keep_target_distribution(models, method):
    """Deterministic proposals (a chain, or a lookahead tree) through the same rule."""
    target, _, _, tokenizer = models
    sampling = SamplingConfig(temperature=1.0, top_p=0.95)
    # A repetitive prompt gives prompt lookup something to propose.
    ids = tokenizer.encode("fox fox fox The quick brown fox")
    joint = exact_joint(target, ids, sampling)
    if method == "ngram":
        pairs, _ = sample_pairs(target, NgramDrafter(1, 3), ids, sampling, k=2, max_tokens=3)
    else:
        pairs, _ = sample_pairs(target, LookaheadDrafter(3, 3, 3), ids, sampling, k=2, max_tokens=3)
    assert chi2_pvalue(pairs, joint) > 0.01


def test_broken_residual_is_detected(models, monkeypatch):
    """Drawing rejections from the target instead of the residual biases the output.
    (Trees have their own control: tests/test_heads_medusa.py breaks their fallback.)"""
    target, close_draft, _, tokenizer = models
    sampling = SamplingConfig(temperature=1.0)
    real = verify.rejection_verify

    def broken(draft_tokens, draft_probs, target_probs):
        n_accepted, _ = real(draft_tokens, draft_probs, target_probs)
        token = mx.random.categorical(mx.log(target_probs[n_accepted])).astype(mx.uint32)
        return n_accepted, token

    monkeypatch.setattr("specmlx.engine.decode.rejection_verify", broken)
    ids = tokenizer.encode(PROMPT)
    drafter = DraftModelDrafter(close_draft, target.args.vocab_size)
    pairs, _ = sample_pairs(target, drafter, ids, sampling, k=2, max_tokens=3)
    assert chi2_pvalue(pairs, exact_joint(target, ids, sampling)) < 0.01
