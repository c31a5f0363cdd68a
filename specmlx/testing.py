"""Tiny random-weight models built in-process, for the tests and for `specmlx bench
--overhead`: a llama small enough that its calls cost next to nothing, a second one as its
draft model, and random Medusa and EAGLE heads for it; a Qwen3-Next-shaped hybrid (Gated
DeltaNet and attention layers). No tokenizer, no files.
"""

from __future__ import annotations

from typing import Any

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


def tiny_hybrid(vocab_size: int = 512, seed: int = 0) -> nn.Module:
    """A random-weight Qwen3-Next: Gated DeltaNet layers (recurrent state, a convolution
    window) between full-attention ones, tiny MoE MLPs."""
    from mlx_lm.models import qwen3_next

    args = qwen3_next.ModelArgs(
        model_type="qwen3_next",
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=64,
        mlp_only_layers=[],
        moe_intermediate_size=32,
        rms_norm_eps=1e-6,
        vocab_size=vocab_size,
        rope_theta=10000.0,
        partial_rotary_factor=0.25,
        max_position_embeddings=4096,
        full_attention_interval=2,
    )
    mx.random.seed(seed)
    model = qwen3_next.Model(args)
    mx.eval(model.parameters())
    return model


# A tiny Nemotron-H's config (all but vocab_size): Mamba-2 mixers around an attention layer
# and an MLP block, "M*-M".
TINY_NEMOTRON_H: dict[str, Any] = dict(
    model_type="nemotron_h",
    hidden_size=64,
    intermediate_size=128,
    max_position_embeddings=4096,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    attention_bias=False,
    mamba_num_heads=4,
    mamba_head_dim=16,
    mamba_proj_bias=False,
    ssm_state_size=16,
    conv_kernel=4,
    n_groups=2,
    mlp_bias=False,
    layer_norm_epsilon=1e-5,
    use_bias=False,
    use_conv_bias=True,
    hybrid_override_pattern=["M", "*", "-", "M"],
    time_step_limit=(0.001, 100.0),
)


def tiny_ssm_hybrid(vocab_size: int = 512, seed: int = 0) -> nn.Module:
    """A random-weight Nemotron-H (`TINY_NEMOTRON_H`): Mamba-2 mixers (an SSM state, a
    convolution window), an attention layer and an MLP block."""
    from mlx_lm.models import nemotron_h

    args = nemotron_h.ModelArgs(**TINY_NEMOTRON_H, vocab_size=vocab_size)
    mx.random.seed(seed)
    model = nemotron_h.Model(args)
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
