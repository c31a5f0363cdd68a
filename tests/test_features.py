"""The target's hidden states come from its own calls, unchanged, for every family."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest

from specmlx.engine.cache import Sequence
from specmlx.engine.features import FeatureSpec, backbone, capturing
from specmlx.engine.tree import Tree

FAMILIES = ["llama", "qwen2", "gemma3_text"]


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tiny_dirs):
    return mlx_lm.load(str(tiny_dirs[request.param]))[0]


def layer_outputs(model, inputs):
    """Every decoder layer's output and the final norm's, by running the stack by hand."""
    seen = []
    with capturing(model, FeatureSpec(tuple(range(len(backbone(model).layers))))) as capture:
        model(inputs[None])
        seen = [taps[-1][0] for taps in capture.taps]
    return seen


def test_the_final_hidden_state_is_the_backbones_output_and_logits_do_not_change(model):
    inputs = mx.array([5, 17, 42, 99, 7], mx.uint32)
    plain_logits = model(inputs[None])
    with capturing(model, FeatureSpec()) as capture:
        logits = model(inputs[None])
    assert mx.array_equal(logits, plain_logits)
    assert mx.allclose(capture.latest(), backbone(model)(inputs[None]), atol=1e-5)
    # The model is as it was: its norm and layers are its own modules again.
    assert type(backbone(model).norm).__name__ != "_Tap"
    assert all(type(layer).__name__ != "_Tap" for layer in backbone(model).layers)


def test_named_layers_are_concatenated_in_order(model):
    inputs = mx.array([3, 1, 4, 1, 5], mx.uint32)
    every = layer_outputs(model, inputs)
    n = len(every)
    spec = FeatureSpec((n - 1, 0))
    with capturing(model, spec) as capture:
        model(inputs[None])
    joined = capture.latest()[0]
    assert joined.shape[-1] == spec.width(every[0].shape[-1])
    assert mx.array_equal(joined, mx.concatenate([every[n - 1], every[0]], axis=-1))


def test_an_exception_inside_leaves_the_model_unwrapped(model):
    with pytest.raises(RuntimeError), capturing(model, FeatureSpec((0,))):
        raise RuntimeError("boom")
    assert all(type(layer).__name__ != "_Tap" for layer in backbone(model).layers)


def test_a_sequence_keeps_one_row_per_confirmed_token(model):
    """Rows kept through prefill, a chain call, a tree call and a rewind equal those of one
    plain call over the same tokens."""
    tokens = [11, 23, 35, 47, 59, 61, 73, 85, 97]
    whole = Sequence(model)
    whole.capture(FeatureSpec())
    whole.sync(tokens + [0])
    expected = whole.feature_rows()
    assert expected.shape[0] == len(tokens)

    seq = Sequence(model, prefill_step=2)
    seq.capture(FeatureSpec())
    seq.sync(tokens[:4] + [0])  # prefill in chunks: 11 23 35 47
    seq.forward(mx.array(tokens[4:6] + [1, 2], mx.uint32))  # a chain: keep 59 61
    seq.settle(tokens[4:6])
    # A tree: root 73, children 85 (kept) and 3 (dropped); 85's child 97 (kept).
    seq.forward(mx.array([73, 3, 85, 97], mx.uint32), tree=Tree((0, 0, 2)))
    seq.settle([73, 85, 97], path=[0, 2, 3])
    assert seq.tokens == tokens
    assert mx.allclose(seq.feature_rows(), expected, atol=1e-4)
    assert mx.allclose(seq.feature_rows(5), expected[5:], atol=1e-4)
    # A rewind to a shorter context keeps the rows of the common prefix.
    seq.sync(tokens[:3] + [0])
    assert mx.allclose(seq.feature_rows(), expected[:3], atol=1e-4)
