"""A tiny random DeepSeek-V3 target with its next-n (MTP) layer, in the layout a release
uses, for tests.

DeepSeek-V3 stores the MTP layer as the model's layer num_hidden_layers (here
`model.layers.2.*`: two layers, the first dense, the second a mixture of four routed experts
and a shared one, MLA attention with small ranks). The backbone is written as mlx-lm's
deepseek_v3 `sanitize` reads a release: one tensor per expert, MLA's kv_b_proj whole (mlx-lm
splits it into embed_q / unembed_out). That `sanitize` drops the next-n layer by V3's own
index, 61, alone; `mtp_layers_dropped` makes it drop the one of any depth while tests load
these targets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from tests.tiny import SPECIALS, write_tokenizer
from tests.tiny_hybrid import random_model

DEEPSEEK: dict[str, Any] = dict(
    model_type="deepseek_v3",
    architectures=["DeepseekV3ForCausalLM"],
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=4,
    routed_scaling_factor=2.5,
    kv_lora_rank=32,
    q_lora_rank=48,
    qk_rope_head_dim=8,
    v_head_dim=16,
    qk_nope_head_dim=16,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    moe_layer_freq=1,
    first_k_dense_replace=1,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    rope_scaling=None,
    attention_bias=False,
    num_nextn_predict_layers=1,
    tie_word_embeddings=False,
    torch_dtype="float32",
)
MTP = f"model.layers.{DEEPSEEK['num_hidden_layers']}."  # the next-n layer's prefix


def released(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """mlx-lm deepseek_v3 tensors under the names and shapes a release uses: what its
    `sanitize` turns back into `weights`."""
    out = {}
    for name, value in weights.items():
        if ".switch_mlp." in name:
            for e, expert in enumerate(value):  # (experts, out, in): one tensor each
                out[name.replace(".switch_mlp.", f".experts.{e}.")] = mx.contiguous(expert)
        elif name.endswith("embed_q.weight"):  # (heads, kv_lora_rank, nope), with unembed_out
            unembed = weights[name.replace("embed_q", "unembed_out")]  # (heads, v, kv_lora_rank)
            kv_b = mx.concatenate([value.swapaxes(-1, -2), unembed], axis=1)  # (heads, nope + v, r)
            out[name.replace("embed_q", "kv_b_proj")] = kv_b.reshape(-1, kv_b.shape[-1])
        elif not name.endswith("unembed_out.weight"):
            out[name] = value
    return out


def make_deepseek_dir(
    folder: Path, seed: int = 0, extra_tensors: dict[str, mx.array] | None = None, **overrides
) -> Path:
    """A random-weight fp32 DeepSeek-V3 checkpoint in the released layout; `extra_tensors`
    (the next-n layer's) are written as they are, `overrides` go into the config."""
    n_tokens = write_tokenizer(folder)
    eos = SPECIALS.index("<|im_end|>")
    config = {**DEEPSEEK, "vocab_size": n_tokens, "eos_token_id": eos, **overrides}
    model = random_model(config, seed)
    for layer in model.model.layers:  # the routers start at zero: give them a preference
        if "gate" in layer.mlp:
            layer.mlp.gate.weight = mx.random.normal(layer.mlp.gate.weight.shape) * 0.5
    weights = released(dict(tree_flatten(model.parameters())))
    weights.update(extra_tensors or {})
    mx.eval(weights)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def released_mtp(
    seed: int = 0, own: bool = True, bigram: bool = False, vocab: int = 320
) -> dict[str, mx.array]:
    """A random next-n layer as a release stores it: enorm, hnorm, eh_proj [H, 2H],
    shared_head.norm, an ordinary MoE decoder layer; with `own`, its own embed_tokens and
    shared_head.head (random here, unlike the release's copies: a test tells them apart).
    `bigram`: eh_proj passes the embedding, the block adds nothing, norms of scale 1."""
    from mlx_lm.models.deepseek_v3 import DeepseekV3DecoderLayer, ModelArgs

    size = DEEPSEEK["hidden_size"]
    layer = DeepseekV3DecoderLayer(ModelArgs.from_dict(DEEPSEEK), DEEPSEEK["num_hidden_layers"])
    shapes = {n: v.shape for n, v in released(dict(tree_flatten(layer.parameters()))).items()}
    shapes.update(
        {
            "enorm.weight": (size,),
            "hnorm.weight": (size,),
            "eh_proj.weight": (size, 2 * size),
            "shared_head.norm.weight": (size,),
        }
    )
    if own:
        shapes["embed_tokens.weight"] = (vocab, size)
        shapes["shared_head.head.weight"] = (vocab, size)
    keys = mx.random.split(mx.random.key(seed), len(shapes))
    tensors = {}
    for (name, shape), key in zip(sorted(shapes.items()), keys, strict=True):
        value = mx.random.normal(shape, key=key) * (0.1 if len(shape) == 1 else 0.3)
        tensors[name] = value + 1.0 if name.endswith("norm.weight") else value
    if bigram:
        tensors["eh_proj.weight"] = mx.concatenate([mx.eye(size), mx.zeros((size, size))], 1)
        for name in tensors:
            if name.endswith("norm.weight"):
                tensors[name] = mx.ones_like(tensors[name])
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                tensors[name] = mx.zeros_like(tensors[name])
    return {MTP + name: value for name, value in tensors.items()}


def _past(name: str, n_layers: int) -> bool:
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return m is not None and int(m.group(1)) >= n_layers


@contextmanager
def mtp_layers_dropped() -> Iterator[None]:
    """While in this block, mlx-lm's deepseek_v3 `sanitize` drops the layers past
    num_hidden_layers (the next-n ones) of any config, not only V3's `model.layers.61`."""
    from mlx_lm.models import deepseek_v3

    original = deepseek_v3.Model.sanitize

    def sanitize(self: Any, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        n = self.args.num_hidden_layers
        return original(self, {k: v for k, v in weights.items() if not _past(k, n)})

    deepseek_v3.Model.sanitize = sanitize
    try:
        yield
    finally:
        deepseek_v3.Model.sanitize = original
