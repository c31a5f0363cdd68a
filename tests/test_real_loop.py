"""The loop on the real models from `make models` (skipped when they are absent)."""

from __future__ import annotations

import pytest

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import generate
from specmlx.engine.sampling import SamplingConfig
from specmlx.io.registry import local_model_present

pytestmark = pytest.mark.real

PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
CODE = [
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that merges two sorted lists.",
]


def need(*aliases):
    missing = [a for a in aliases if not local_model_present(a)]
    if missing:
        pytest.skip(f"run `make models` first (missing {', '.join(missing)})")


@pytest.fixture(scope="module")
def qwen_pair():
    need(*PAIR)
    import specmlx

    return specmlx.load(*PAIR, progress=False)


@pytest.fixture(scope="module")
def smollm():
    need("smollm2-135m")
    import specmlx

    return specmlx.load("smollm2-135m", progress=False)


def test_qwen_pair_greedy_is_the_targets_output(qwen_pair):
    drafted = accepted = 0
    for prompt in CODE:
        plain = generate(qwen_pair, prompt, GenerationConfig(method="none", max_tokens=32))
        spec = generate(qwen_pair, prompt, GenerationConfig(method="draft", k=4, max_tokens=32))
        assert spec.token_ids == plain.token_ids
        drafted += spec.stats.drafted
        accepted += spec.stats.accepted
    # A real pair that shares its training: most drafts survive on code.
    assert accepted / drafted > 0.5


def test_qwen_pair_sampling_runs_and_reports(qwen_pair):
    config = GenerationConfig(k=4, max_tokens=24, sampling=SamplingConfig(temperature=1.0), seed=0)
    result = generate(qwen_pair, CODE[0], config)
    assert result.stats.tokens == len(result.token_ids) > 0
    assert 0 < result.stats.acceptance_rate <= 1


@pytest.mark.parametrize("method", ["ngram", "lookahead"])
def test_draft_free_methods_on_a_real_model(smollm, method):
    prompt = "Repeat this sentence twice: the cat sat on the mat and looked at the door."
    plain = generate(smollm, prompt, GenerationConfig(method="none", max_tokens=40))
    spec = generate(smollm, prompt, GenerationConfig(method=method, k=4, max_tokens=40))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.target_calls < plain.stats.target_calls
