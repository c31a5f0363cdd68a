"""Tiny random-weight models built in-process, for the tests and for `specmlx bench
--overhead`: a llama small enough that its calls cost next to nothing, a second one as its
draft model, and random Medusa and EAGLE heads for it. No tokenizer, no files.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from specmlx.api.models import Models


def tiny_llama(vocab_size: int = 512, seed: int = 0) -> nn.Module:
    """A random-weight llama small enough that its calls cost next to nothing."""
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=vocab_size,
        tie_word_embeddings=False,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def tiny_models(vocab_size: int = 512, seed: int = 0) -> Models:
    """A tiny target, a tiny draft model of the same vocabulary and random heads for the
    target; no tokenizer."""
    target = tiny_llama(vocab_size, seed)
    return Models(
        target=target,
        tokenizer=None,
        draft=tiny_llama(vocab_size, seed + 1),
        heads=tiny_heads(target, seed + 2),
    )


def tiny_heads(target: nn.Module, seed: int) -> dict[str, nn.Module]:
    """Medusa heads and an EAGLE head for `target`, with small random trained weights."""
    from dataclasses import asdict

    from mlx.utils import tree_flatten, tree_map

    from specmlx.heads import HeadsConfig
    from specmlx.heads.eagle import EagleHead
    from specmlx.heads.medusa import MedusaHeads

    sizes = dict(
        hidden_size=target.args.hidden_size,
        target_vocab=target.args.vocab_size,
        draft_vocab=target.args.vocab_size,
    )
    medusa = MedusaHeads.create(HeadsConfig(kind="medusa", **sizes), target)
    eagle = EagleHead.create(
        HeadsConfig(kind="eagle", target_args=asdict(target.args), **sizes), target
    )
    mx.random.seed(seed)
    for heads in (medusa, eagle):
        weights = heads.trainable_parameters()
        heads.update(tree_map(lambda w: 0.05 * mx.random.normal(w.shape), weights))
        mx.eval(tree_flatten(heads.trainable_parameters()))
    return {"medusa": medusa, "eagle": eagle}
