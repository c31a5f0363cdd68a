"""Tiny random-weight models with a small real BPE tokenizer, built offline for tests.

The tokenizer is a byte-level BPE trained (deterministically) on a fixed corpus, with the
special tokens and chat template of a ChatML model. Model folders are real mlx-lm folders
(config.json, model.safetensors, tokenizer files) that `mlx_lm.load` reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from specmlx.testing import TINY_NEMOTRON_H

CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "def fibonacci(n):\n    if n <= 0:\n        return 0\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Speculative decoding lets a small model draft tokens that a large model verifies.",
    "for i in range(10):\n    print(i * i)\n",
    "Once upon a time there was a little fox who lived in the forest.",
    "import numpy as np\nx = np.zeros((3, 4))\n",
    "Hello, world! How are you today? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
] * 20

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

ARCHS: dict[str, dict] = {
    "llama": dict(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
    "qwen2": dict(
        model_type="qwen2",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    "gemma3_text": dict(
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        rms_norm_eps=1e-6,
        sliding_window=8,
        sliding_window_pattern=2,
        query_pre_attn_scalar=16,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
    ),
    "mamba": dict(
        model_type="mamba",
        hidden_size=32,
        intermediate_size=64,
        state_size=8,
        num_hidden_layers=2,
        conv_kernel=4,
        use_bias=False,
        use_conv_bias=True,
        time_step_rank=4,
    ),
    # Mamba-2 mixers, alone and beside attention and MLP blocks (Nemotron-H's "M*-M").
    "mamba2": dict(
        model_type="mamba2",
        hidden_size=32,
        intermediate_size=64,
        num_heads=4,
        head_dim=16,
        state_size=8,
        num_hidden_layers=2,
        layer_norm_epsilon=1e-5,
        conv_kernel=4,
        n_groups=2,
        use_bias=False,
        use_conv_bias=True,
        tie_word_embeddings=False,
        time_step_limit=[0.001, 100.0],
        time_step_rank="auto",
    ),
    "nemotron_h": dict(TINY_NEMOTRON_H),
    # Granite 4 hybrids: Mamba-2 layers around an attention layer.
    "granitemoehybrid": dict(
        model_type="granitemoehybrid",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        max_position_embeddings=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=False,
        embedding_multiplier=1.0,
        attention_multiplier=0.25,
        logits_scaling=1.0,
        residual_multiplier=1.0,
        layer_types=["mamba", "attention", "mamba"],
        rms_norm_eps=1e-5,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_proj_bias=False,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_n_groups=1,
        mamba_conv_bias=True,
        use_moe=False,
    ),
    # An SSM mixer and attention side by side in every layer, one cache list each.
    "falcon_h1": dict(
        model_type="falcon_h1",
        hidden_size=32,
        intermediate_size=64,
        head_dim=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        mamba_d_conv=4,
        mamba_d_head=8,
        mamba_d_ssm=32,
        mamba_d_state=8,
        mamba_n_groups=1,
        mamba_n_heads=4,
        mamba_chunk_size=8,
    ),
    "qwen2_moe": dict(
        model_type="qwen2_moe",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=False,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    ),
}


def write_tokenizer(folder: Path, vocab_size: int = 320) -> int:
    """Train the byte-level BPE into `folder`; return the number of tokens it holds."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 4096,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return tok.get_vocab_size()


def make_model_dir(
    folder: Path,
    arch: str = "llama",
    seed: int = 0,
    vocab_pad: int = 0,
    tokenizer_size: int = 320,
    **overrides,
) -> Path:
    """A random-weight fp32 mlx-lm model folder of architecture `arch`.

    `vocab_pad` adds rows to the embedding beyond the tokenizer (as Qwen pads its vocab).
    """
    from mlx_lm.utils import save_config, save_model

    n_tokens = write_tokenizer(folder, tokenizer_size)
    eos_id = SPECIALS.index("<|im_end|>")
    config = {**ARCHS[arch], "vocab_size": n_tokens + vocab_pad, "eos_token_id": eos_id}
    config.update(overrides)
    save_model(folder, random_model(config, seed))
    save_config(dict(config), folder / "config.json")
    return folder


def random_model(config: dict, seed: int = 0):
    """The seeded random fp32 mlx-lm model of a config (an ARCHS entry and a vocab_size)."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    # Scale weights up a little so the random model has peaked, varied distributions.
    model.update(tree_map(lambda w: w * 2.0 if w.ndim == 2 else w, model.parameters()))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model
