"""Tiny random MTP layers in the layouts their authors release, for tests.

Qwen3.5 and Qwen3-Next store the layer as top-level `mtp.*` tensors beside the backbone's
(zero-centred norms; routed experts one tensor each, or fused as Qwen3.5-MoE's backbone);
MiMo as `model.mtp_layers.{i}.*` (plain norms, a Qwen2 block). `tests.tiny_hybrid` writes
the Qwen targets, `tests.tiny` a MiMo one; these add the MTP tensors, and `damp` bends a
target toward what a `bigram` MTP layer predicts, so drafts are kept often, not always.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from tests.tiny import ARCHS, make_model_dir
from tests.tiny_hybrid import TEXT

MTP_PREFIXES = ("mtp.", "model.mtp_layers.")


def released_mtp(kind: str, seed: int = 0, fused: bool = False) -> dict[str, mx.array]:
    """Random MTP tensors of a `kind` target, named and shaped as a release stores them:
    norms zero-centred, routed experts one tensor each (or fused, as Qwen3.5-MoE)."""
    c = TEXT[kind]
    size, hd = c["hidden_size"], c["head_dim"]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    shapes = {
        "fc.weight": (size, 2 * size),
        "pre_fc_norm_embedding.weight": (size,),
        "pre_fc_norm_hidden.weight": (size,),
        "norm.weight": (size,),
        "layers.0.input_layernorm.weight": (size,),
        "layers.0.post_attention_layernorm.weight": (size,),
        "layers.0.self_attn.q_proj.weight": (2 * heads * hd, size),  # query and gate per head
        "layers.0.self_attn.k_proj.weight": (kv_heads * hd, size),
        "layers.0.self_attn.v_proj.weight": (kv_heads * hd, size),
        "layers.0.self_attn.o_proj.weight": (size, heads * hd),
        "layers.0.self_attn.q_norm.weight": (hd,),
        "layers.0.self_attn.k_norm.weight": (hd,),
    }
    mlp = "layers.0.mlp."
    if c.get("num_experts"):
        n, inner, shared = (
            c["num_experts"],
            c["moe_intermediate_size"],
            c["shared_expert_intermediate_size"],
        )
        shapes[mlp + "gate.weight"] = (n, size)
        if fused:
            shapes[mlp + "experts.gate_up_proj"] = (n, 2 * inner, size)
            shapes[mlp + "experts.down_proj"] = (n, size, inner)
        for e in range(0 if fused else n):
            shapes[mlp + f"experts.{e}.gate_proj.weight"] = (inner, size)
            shapes[mlp + f"experts.{e}.up_proj.weight"] = (inner, size)
            shapes[mlp + f"experts.{e}.down_proj.weight"] = (size, inner)
        shapes[mlp + "shared_expert.gate_proj.weight"] = (shared, size)
        shapes[mlp + "shared_expert.up_proj.weight"] = (shared, size)
        shapes[mlp + "shared_expert.down_proj.weight"] = (size, shared)
        shapes[mlp + "shared_expert_gate.weight"] = (1, size)
    else:
        inner = c["intermediate_size"]
        shapes[mlp + "gate_proj.weight"] = (inner, size)
        shapes[mlp + "up_proj.weight"] = (inner, size)
        shapes[mlp + "down_proj.weight"] = (size, inner)
    keys = mx.random.split(mx.random.key(seed), len(shapes))
    return {
        f"mtp.{name}": mx.random.normal(shape, key=key) * (0.1 if len(shape) == 1 else 0.3)
        for (name, shape), key in zip(shapes.items(), keys, strict=True)
    }


def bigram_mtp(kind: str, seed: int = 0) -> dict[str, mx.array]:
    """An MTP layer that predicts what a target without residual branches would: fc passes
    the normed embedding of t_{p+1}, the block adds nothing, so the logits are the target's
    LM head over norm(embed(t_{p+1})). On a target whose branches are damped (`damp`) its
    drafts are often, not always, right: both sides of verification run."""
    tensors = released_mtp(kind, seed)
    size = TEXT[kind]["hidden_size"]
    tensors["mtp.fc.weight"] = mx.concatenate([mx.eye(size), mx.zeros((size, size))], axis=1)
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")) or name.endswith("norm.weight"):
            tensors[name] = mx.zeros_like(tensors[name])  # no branch; norms of scale 1
    return tensors


def damp(folder: Path, factor: float, head: float = 1.0) -> Path:
    """Scale the target's residual branches (the outputs of attention, linear attention and
    MLPs) by `factor`: a target that leans on its current token; and its LM head by `head`
    (the MTP layer's too: it is shared)."""
    path = folder / "model.safetensors"
    weights = mx.load(str(path))
    ends = ("o_proj.weight", "out_proj.weight", "down_proj.weight")
    weights = {
        n: w * factor if n.endswith(ends) and not n.startswith(MTP_PREFIXES) else w
        for n, w in weights.items()
    }
    weights["lm_head.weight"] = weights["lm_head.weight"] * head
    mx.save_safetensors(str(path), weights, metadata={"format": "pt"})
    return folder


# MiMo (XiaomiMiMo/MiMo-7B): a Qwen2-style target whose MTP layers sit under
# `model.mtp_layers.{i}`; its config as mlx-lm's mimo reads it.
MIMO = dict(
    model_type="mimo",
    tie_word_embeddings=False,
    num_nextn_predict_layers=1,
    head_dim=16,
    partial_rotary_factor=1.0,
)


def released_mimo_mtp(seed: int = 0, bigram: bool = False) -> dict[str, mx.array]:
    """MiMo's MTP layer as released (`MiMoMTPLayers`): plain norms, input_proj over
    cat[hidden, embedding], a Qwen2 block (q/k/v with biases). `bigram`: as `bigram_mtp`."""
    size, inner, hd = ARCHS["qwen2"]["hidden_size"], ARCHS["qwen2"]["intermediate_size"], 16
    heads, kv_heads = ARCHS["qwen2"]["num_attention_heads"], ARCHS["qwen2"]["num_key_value_heads"]
    shapes = {
        "token_layernorm.weight": (size,),
        "hidden_layernorm.weight": (size,),
        "input_proj.weight": (size, 2 * size),
        "final_layernorm.weight": (size,),
        "input_layernorm.weight": (size,),
        "post_attention_layernorm.weight": (size,),
        "self_attn.q_proj.weight": (heads * hd, size),
        "self_attn.q_proj.bias": (heads * hd,),
        "self_attn.k_proj.weight": (kv_heads * hd, size),
        "self_attn.k_proj.bias": (kv_heads * hd,),
        "self_attn.v_proj.weight": (kv_heads * hd, size),
        "self_attn.v_proj.bias": (kv_heads * hd,),
        "self_attn.o_proj.weight": (size, heads * hd),
        "mlp.gate_proj.weight": (inner, size),
        "mlp.up_proj.weight": (inner, size),
        "mlp.down_proj.weight": (size, inner),
    }
    keys = mx.random.split(mx.random.key(seed), len(shapes))
    tensors = {}
    for (name, shape), key in zip(shapes.items(), keys, strict=True):
        value = mx.random.normal(shape, key=key) * (0.1 if len(shape) == 1 else 0.3)
        tensors[name] = value + 1.0 if name.endswith("norm.weight") else value
    if bigram:
        tensors["input_proj.weight"] = mx.concatenate([mx.zeros((size, size)), mx.eye(size)], 1)
        for name in tensors:
            if name.endswith("norm.weight"):
                tensors[name] = mx.ones_like(tensors[name])
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                tensors[name] = mx.zeros_like(tensors[name])
    return {f"model.mtp_layers.0.{name}": value for name, value in tensors.items()}


def make_mimo_dir(folder: Path, tensors: dict[str, mx.array]) -> Path:
    make_model_dir(folder, "qwen2", seed=1, **MIMO)
    path = folder / "model.safetensors"
    weights = {**mx.load(str(path)), **tensors}
    mx.save_safetensors(str(path), weights, metadata={"format": "pt"})
    return folder
