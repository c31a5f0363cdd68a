"""Tiny random hybrid models (Gated DeltaNet layers mixed with full attention), written in
the layout their authors release, for tests.

Qwen3.5 (`qwen3_5`) and Qwen3-Next (`qwen3_next`) checkpoints are read by mlx-lm through
`sanitize`, which renames and reshapes the Hugging Face tensors: `model.language_model.`
prefixes, conv1d weights as (channels, 1, kernel), zero-centred RMSNorm weights (the model
multiplies by 1 + weight), one tensor per MoE expert. A folder here is made by building a
seeded random mlx-lm model and undoing those steps, so `mlx_lm.load` goes through the same
conversion as on a released checkpoint and gets the random model back. The tokenizer is
`tests.tiny`'s, shared with its tiny llama, so one of those can draft for these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.tiny import SPECIALS, write_tokenizer

# The RMSNorms whose weights a release stores zero-centred (the linear attention's gated
# norm is stored as it is used).
NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)

TEXT: dict[str, dict[str, Any]] = {
    # Qwen3.5's text config (transformers' Qwen3_5TextConfig): dense MLP, gated attention.
    "qwen3_5": dict(
        model_type="qwen3_5_text",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        attention_bias=False,
        attn_output_gate=True,
        rms_norm_eps=1e-6,
        full_attention_interval=2,
        layer_types=["linear_attention", "full_attention"] * 2,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [1, 1, 0],
            "mrope_interleaved": True,
        },
        tie_word_embeddings=False,
        mtp_num_hidden_layers=1,
        dtype="float32",
    ),
    # Qwen3-Next (flat config): every layer's MLP a mixture of experts with a shared one,
    # as in the released checkpoints (mlx-lm converts only checkpoints with experts).
    "qwen3_next": dict(
        model_type="qwen3_next",
        architectures=["Qwen3NextForCausalLM"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        attention_bias=False,
        rms_norm_eps=1e-6,
        full_attention_interval=2,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        norm_topk_prob=True,
        max_position_embeddings=4096,
        partial_rotary_factor=0.25,
        rope_theta=10000000,
        rope_scaling=None,
        tie_word_embeddings=False,
        torch_dtype="float32",
    ),
}


def hybrid_config(kind: str, vocab_size: int, eos_id: int, **overrides: Any) -> dict[str, Any]:
    """config.json as released: Qwen3.5 nests its text sizes under `text_config`."""
    text = {**TEXT[kind], "vocab_size": vocab_size, "eos_token_id": eos_id, **overrides}
    if kind == "qwen3_next":
        return text
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32},
        "image_token_id": vocab_size + 6,
        "video_token_id": vocab_size + 7,
        "vision_start_token_id": vocab_size + 3,
        "vision_end_token_id": vocab_size + 4,
        "tie_word_embeddings": text["tie_word_embeddings"],
    }


def released_weights(kind: str, weights: dict[str, Any]) -> dict[str, Any]:
    """The tensors of an mlx-lm model of `kind` under the names and shapes a release uses:
    what that family's `sanitize` turns back into `weights`."""
    import mlx.core as mx

    out = {}
    for name, value in weights.items():
        if "conv1d.weight" in name:
            value = value.moveaxis(1, 2)  # (channels, kernel, 1) -> (channels, 1, kernel)
        elif value.ndim == 1 and name.endswith(NORMS) and "linear_attn" not in name:
            value = value - 1.0
        if kind == "qwen3_5":
            if name.startswith("language_model.model."):
                name = "model.language_model." + name[len("language_model.model.") :]
            else:
                name = name[len("language_model.") :]  # lm_head.weight
        if ".switch_mlp." in name:
            for e, expert in enumerate(value):  # (experts, out, in): one tensor each
                out[name.replace(".switch_mlp.", f".experts.{e}.")] = mx.contiguous(expert)
            continue
        out[name] = value
    return out


def random_model(config: dict[str, Any], seed: int) -> Any:
    """The seeded random fp32 mlx-lm model of a config.json (what its folder loads back to)."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    # Scale weights up a little so the random model has peaked, varied distributions.
    model.update(tree_map(lambda w: w * 2.0 if w.ndim >= 2 else w, model.parameters()))
    model.set_dtype(mx.float32)
    return model


def make_hybrid_dir(
    folder: Path,
    kind: str,
    seed: int = 0,
    extra_tensors: dict[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    """A random-weight fp32 checkpoint of `kind` ("qwen3_5" or "qwen3_next") in the
    released Hugging Face layout; `extra_tensors` are written as they are (e.g. `mtp.*`),
    `overrides` go into the text config."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    n_tokens = write_tokenizer(folder)
    config = hybrid_config(kind, n_tokens, SPECIALS.index("<|im_end|>"), **overrides)
    model = random_model(config, seed)
    weights = released_weights(kind, dict(tree_flatten(model.parameters())))
    weights.update(extra_tensors or {})
    mx.eval(weights)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
