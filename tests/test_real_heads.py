"""The committed SmolLM2-135M heads on the real model (skipped until `make models`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specmlx.api.config import GenerationConfig
from specmlx.api.generate import generate
from specmlx.api.methods import EagleOptions, MedusaOptions
from tests.test_real_loop import CODE, need

pytestmark = pytest.mark.real

HEADS = Path(__file__).parent.parent / "models" / "heads"


@pytest.fixture(scope="module")
def smollm_with_heads():
    need("smollm2-135m")
    import specmlx

    heads = [str(HEADS / "smollm2-135m-medusa"), str(HEADS / "smollm2-135m-eagle")]
    return specmlx.load("smollm2-135m", heads=heads, progress=False)


@pytest.mark.parametrize(
    "options", [MedusaOptions(tree_size=16), EagleOptions(tree_size=16)], ids=["medusa", "eagle"]
)
def test_committed_heads_are_lossless_and_draft_tokens_that_are_kept(smollm_with_heads, options):
    plain = GenerationConfig(method="none", max_tokens=32)
    spec = GenerationConfig(options=options, k=4, max_tokens=32)
    for prompt in CODE:
        expected = generate(smollm_with_heads, prompt, plain)
        result = generate(smollm_with_heads, prompt, spec)
        assert result.token_ids == expected.token_ids
        # Trained heads: the first drafted position is kept far more often than chance.
        assert result.stats.acceptance_by_position[0] > 0.3, result.stats.acceptance_by_position


def test_committed_eagle3_heads_are_lossless_and_draft_tokens_that_are_kept():
    need("smollm2-135m")
    import specmlx

    heads = str(HEADS / "smollm2-135m-eagle3")
    models = specmlx.load("smollm2-135m", heads=[heads], progress=False)
    assert models.heads["eagle"].config.kind == "eagle3"
    plain = GenerationConfig(method="none", max_tokens=32)
    spec = GenerationConfig(options=EagleOptions(tree_size=16), k=4, max_tokens=32)
    for prompt in CODE:
        expected = generate(models, prompt, plain)
        result = generate(models, prompt, spec)
        assert result.token_ids == expected.token_ids
        assert result.stats.acceptance_by_position[0] > 0.3, result.stats.acceptance_by_position
