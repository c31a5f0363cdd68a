"""How each family stores its MTP layer, and the conversions that turn its tensors into the
module `specmlx.heads.mtp` builds.

A `Layout` names a family's parts (the checkpoint's name of each, and the module's), builds
the decoder block from mlx-lm's own class for the family, and says how its norms and its
concatenation run. The tensors are renamed, routed experts stacked as mlx-lm stacks the
backbone's (one tensor per expert, or Qwen3.5-MoE's fused gate_up_proj), and a family's own
conversion applied where its backbone needs one: DeepSeek-V3 splits MLA's kv_b_proj into
embed_q / unembed_out, and dequantizes FP8 blocks, as mlx-lm's `sanitize` does for layers
0..n-1 (it stops short of the next-n layer, index n, and drops it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specmlx.errors import SpecmlxError

_EXPERT = re.compile(r"layer\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
_FUSED = re.compile(r"layer\.mlp\.experts\.(gate_up_proj|down_proj)")
SCALE_INV = "_scale_inv"  # an FP8 weight's companion: its per-block inverse scales

# A family's own conversion, after the renaming: (layout, the target's args, the tensors by
# the module's names, the checkpoint name of each, the module's parameters, where) -> the
# converted tensors and their checkpoint names.
Convert = Callable[
    ["Layout", Any, dict[str, mx.array], dict[str, str], dict[str, mx.array], str],
    tuple[dict[str, mx.array], dict[str, str]],
]


def _qwen3_5_layer(args: Any) -> nn.Module:
    from mlx_lm.models.qwen3_5 import DecoderLayer

    # vLLM builds it with layer_type="full_attention"; its MLP is the variant's own (dense,
    # or the mixture of experts of qwen3_5_moe), which DecoderLayer picks from the args.
    return DecoderLayer(args, layer_idx=args.full_attention_interval - 1)


def _qwen3_next_layer(args: Any) -> nn.Module:
    from mlx_lm.models.qwen3_next import (
        Qwen3NextDecoderLayer,
        Qwen3NextMLP,
        Qwen3NextSparseMoeBlock,
    )

    layer = Qwen3NextDecoderLayer(args, layer_idx=args.full_attention_interval - 1)
    # Its MLP is chosen as for layer 0 (vLLM reads the index from "mtp.layers.0").
    moe = (
        0 not in args.mlp_only_layers and args.num_experts > 0 and 1 % args.decoder_sparse_step == 0
    )
    layer.mlp = (
        Qwen3NextSparseMoeBlock(args)
        if moe
        else Qwen3NextMLP(args.hidden_size, args.intermediate_size)
    )
    return layer


def _mimo_layer(args: Any) -> nn.Module:
    from mlx_lm.models.mimo import TransformerBlock

    return TransformerBlock(args)  # Qwen2's block, as the backbone's


def _deepseek_v3_layer(args: Any) -> nn.Module:
    from mlx_lm.models.deepseek_v3 import DeepseekV3DecoderLayer

    # vLLM builds it as the layer of index num_hidden_layers (its prefix): past
    # first_k_dense_replace, so a mixture of experts, as in V3.
    return DeepseekV3DecoderLayer(args, layer_idx=args.num_hidden_layers)


def _deepseek_v3_tensors(
    layout: Layout,
    args: Any,
    weights: dict[str, mx.array],
    origin: dict[str, str],
    expected: dict[str, mx.array],
    where: str,
) -> tuple[dict[str, mx.array], dict[str, str]]:
    """MLA's kv_b_proj (heads * (nope + v), kv_lora_rank) split into embed_q (heads,
    kv_lora_rank, nope) and unembed_out (heads, v, kv_lora_rank), as mlx-lm's deepseek_v3
    `sanitize` splits the backbone's, where the installed attention takes them so."""
    attn = "layer.self_attn."
    if attn + "embed_q.weight" not in expected:  # an mlx-lm that keeps kv_b_proj whole
        return weights, origin
    source = _checkpoint_name(layout, attn + "kv_b_proj.weight")
    if attn + "kv_b_proj.weight" not in weights:
        raise SpecmlxError(f"{where} lacks MTP tensor {source}")
    weights, origin = dict(weights), dict(origin)
    kv_b = weights.pop(attn + "kv_b_proj.weight")
    del origin[attn + "kv_b_proj.weight"]
    heads, nope, v = args.num_attention_heads, args.qk_nope_head_dim, args.v_head_dim
    wanted = (heads * (nope + v), args.kv_lora_rank)
    if tuple(kv_b.shape) != wanted:
        raise SpecmlxError(
            f"{where}: MTP tensor {source} has shape {tuple(kv_b.shape)}, the target's config "
            f"wants {wanted}"
        )
    kv_b = kv_b.reshape(heads, nope + v, -1)
    weights[attn + "embed_q.weight"] = mx.contiguous(kv_b[:, :nope, :].swapaxes(-1, -2))
    weights[attn + "unembed_out.weight"] = mx.contiguous(kv_b[:, nope:, :])
    for part in ("embed_q", "unembed_out"):
        origin[f"{attn}{part}.weight"] = f"{source} (split)"
    return weights, origin


@dataclass(frozen=True)
class Layout:
    """How a family stores its MTP layer, and how the layer runs."""

    prefix: str  # of every MTP tensor's name; {num_hidden_layers} is the target's
    # After the prefix, a pattern whose group 1 is an MTP layer's index; None: one layer
    # per prefix, as many as the config's num_nextn_predict_layers (DeepSeek-V3).
    layer_index: str | None
    # The checkpoint's name (after the prefix) of each part, and the module's: embed_norm,
    # hidden_norm, fc, layer (the decoder block; "" in the checkpoint: every other tensor),
    # norm (the final one), and the layer's own embedding and LM head where it has them.
    parts: dict[str, str]
    make_layer: Callable[[Any], nn.Module]
    hidden_first: bool = False  # fc reads cat[hidden, embedding] (MiMo), else the reverse
    zero_centred: bool = True  # norms stored as w for a scale of 1 + w (the Qwen families)
    array_mask: bool = False  # the attention takes its causal mask as an array (MLA)
    fp8: bool = False  # the target's sanitize dequantizes FP8 blocks (weight_scale_inv)
    convert: Convert | None = None  # the family's own conversion, after the renaming


QWEN_PARTS = {
    "pre_fc_norm_embedding": "embed_norm",
    "pre_fc_norm_hidden": "hidden_norm",
    "fc": "fc",
    "layers.0": "layer",
    "norm": "norm",
}
# MiMo (XiaomiMiMo/MiMo-7B `MiMoMTPLayers`): each MTP layer's parts under its own prefix,
# the decoder block's tensors beside them; norms as Qwen2's (x * w).
MIMO_PARTS = {
    "0.token_layernorm": "embed_norm",
    "0.hidden_layernorm": "hidden_norm",
    "0.input_proj": "fc",
    "0.final_layernorm": "norm",
    "0": "layer",
}
# DeepSeek-V3 (README_WEIGHTS.md, vLLM's `deepseek_mtp.py`): the next-n layer as the model's
# layer num_hidden_layers, an ordinary decoder layer's tensors beside its own parts; its
# embed_tokens and shared_head.head are copies of the target's, read where present.
DEEPSEEK_PARTS = {
    "enorm": "embed_norm",
    "hnorm": "hidden_norm",
    "eh_proj": "fc",
    "shared_head.norm": "norm",
    "shared_head.head": "lm_head",
    "embed_tokens": "embed_tokens",
    "": "layer",
}
OWN_PARTS = ("embed_tokens", "lm_head")  # a layer's own, else the target's, borrowed
# mlx-lm model modules whose MTP layout we read.
FAMILIES: dict[str, Layout] = {
    "qwen3_5": Layout("mtp.", r"layers\.(\d+)\.", QWEN_PARTS, _qwen3_5_layer),
    "qwen3_5_moe": Layout("mtp.", r"layers\.(\d+)\.", QWEN_PARTS, _qwen3_5_layer),
    "qwen3_next": Layout("mtp.", r"layers\.(\d+)\.", QWEN_PARTS, _qwen3_next_layer),
    "mimo": Layout(
        "model.mtp_layers.",
        r"(\d+)\.",
        MIMO_PARTS,
        _mimo_layer,
        hidden_first=True,
        zero_centred=False,
    ),
    "deepseek_v3": Layout(
        "model.layers.{num_hidden_layers}.",
        None,
        DEEPSEEK_PARTS,
        _deepseek_v3_layer,
        zero_centred=False,
        array_mask=True,
        fp8=True,
        convert=_deepseek_v3_tensors,
    ),
}


def _module_name(layout: Layout, name: str) -> str:
    """The module's name of a checkpoint tensor (unknown ones keep theirs)."""
    key = name[len(layout.prefix) :]
    for part in sorted(layout.parts, key=len, reverse=True):  # "0.input_proj" before "0"
        if not part or key.startswith(part + "."):
            return layout.parts[part] + (key[len(part) :] if part else "." + key)
    return key


def _checkpoint_name(layout: Layout, name: str) -> str:
    """The checkpoint's name of a module parameter."""
    for part, ours in layout.parts.items():
        if name.startswith(ours + "."):
            rest = name[len(ours) + 1 :]
            return layout.prefix + (f"{part}.{rest}" if part else rest)
    return layout.prefix + name


def dequantized(raw: dict[str, mx.array], target: nn.Module, where: str) -> dict[str, mx.array]:
    """The FP8 weights of `raw` (each with its `weight_scale_inv`) dequantized by the target's
    own `sanitize`, as it dequantizes the backbone's (mlx-lm's deepseek_v3: 128 x 128 blocks,
    to bf16). Each pair goes in under a neutral name, so that nothing else of it applies."""
    scaled = [n[: -len(SCALE_INV)] for n in raw if n.endswith(SCALE_INV)]
    for name in scaled:
        if name not in raw:
            raise SpecmlxError(f"{where} lacks MTP tensor {name} (its {SCALE_INV} is there)")
    pairs = {}
    for i, name in enumerate(scaled):
        pairs[f"fp8.{i}.weight"] = raw[name]
        pairs[f"fp8.{i}.weight{SCALE_INV}"] = raw[name + SCALE_INV]
    plain = target.sanitize(pairs)
    out = {n: v for n, v in raw.items() if not n.endswith(SCALE_INV)}
    out.update((name, plain[f"fp8.{i}.weight"]) for i, name in enumerate(scaled))
    return out


def _converted(
    layout: Layout, raw: dict[str, mx.array], n_experts: int, where: str
) -> tuple[dict[str, mx.array], dict[str, str]]:
    """The tensors under the module's names (routed experts stacked), and the checkpoint
    name each came from."""
    weights: dict[str, mx.array] = {}
    origin: dict[str, str] = {}
    experts: dict[str, dict[int, mx.array]] = {}
    for name, value in raw.items():
        key = _module_name(layout, name)
        if m := _EXPERT.fullmatch(key):
            experts.setdefault(m.group(2), {})[int(m.group(1))] = value
            continue
        parts = {key: value}
        if m := _FUSED.fullmatch(key):
            parts = {"layer.mlp.switch_mlp.down_proj.weight": value}
            if m.group(1) == "gate_up_proj":  # (experts, 2 * intermediate, hidden): gate, up
                mid = value.shape[-2] // 2
                parts = {
                    "layer.mlp.switch_mlp.gate_proj.weight": value[..., :mid, :],
                    "layer.mlp.switch_mlp.up_proj.weight": value[..., mid:, :],
                }
        weights.update(parts)
        origin.update((key, name) for key in parts)
    for proj, by_index in experts.items():
        for e in range(n_experts):
            if e not in by_index:
                name = _checkpoint_name(layout, f"layer.mlp.experts.{e}.{proj}.weight")
                raise SpecmlxError(f"{where} lacks MTP tensor {name}")
        shapes = {e: tuple(w.shape) for e, w in sorted(by_index.items())}
        common = max(set(shapes.values()), key=list(shapes.values()).count)
        for e, shape in shapes.items():  # one misshaped expert: named, not a failed stack
            if shape != common:
                name = _checkpoint_name(layout, f"layer.mlp.experts.{e}.{proj}.weight")
                raise SpecmlxError(
                    f"{where}: MTP tensor {name} has shape {shape}, the other experts' {common}"
                )
        key = f"layer.mlp.switch_mlp.{proj}.weight"
        weights[key] = mx.stack([by_index[e] for e in sorted(by_index)])
        origin[key] = _checkpoint_name(layout, f"layer.mlp.experts.*.{proj}.weight") + " (stacked)"
    return weights, origin


def _unshifted(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """The zero-centred norms as mlx's RMSNorm uses them (1 + w); a norm whose weights
    already average near 1 was shifted by its converter and is kept."""
    # embed_norm, hidden_norm, norm, and the layer's input_layernorm,
    # post_attention_layernorm, q_norm and k_norm: every norm of the module.
    norms = [n for n, w in weights.items() if w.ndim == 1 and "norm" in n.split(".")[-2]]
    if not norms:
        return weights
    means = mx.stack([weights[n].astype(mx.float32).mean() for n in norms]).tolist()
    out = dict(weights)
    for name, mean in zip(norms, means, strict=True):
        if abs(mean) < 0.5:
            out[name] = weights[name].astype(mx.float32) + 1.0
    return out
