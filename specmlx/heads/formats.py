"""Medusa, EAGLE and EAGLE-3 heads as their authors publish them, read without conversion.

`read_published(folder, model, tokenizer)` tries the readers the kinds table names
(`specmlx.heads.kinds`): each recognises its layout by the tensor names (read from the
safetensors headers; `model.` and `medusa_head.` prefixes allowed), builds our module for it
and fills it. Only safetensors are read: a pickled PyTorch file is refused in one line
saying how to convert it. The layouts (dims: d hidden, V vocab):

Medusa (FasterDecoding/Medusa medusa/model/medusa_model.py; train_legacy.py saves
`medusa_lm_head.safetensors`, older repos `medusa_lm_head.pt`; Medusa-2 / axolotl models
keep them in model*.safetensors under `medusa_head.`). Head i is
Sequential(ResBlock x medusa_num_layers, Linear(d, V, bias=False)), ResBlock being
x + SiLU(linear(x)); keys `{i}.{j}.linear.weight` (d, d), `{i}.{j}.linear.bias` (d,),
`{i}.{L}.weight` (V, d), its own full-vocab lm_head. config.json: medusa_num_heads,
medusa_num_layers, base_model_name_or_path (the heads count comes from the keys: Medusa's
own loader notes uploaded configs that undercount them). Head i on the hidden state at t
predicts token t+2+i, which is our head i.

EAGLE-1 / EAGLE-2 (SafeAILab/EAGLE eagle/model/cnets1.py, ea_model.py): `fc.weight`
(d, 2d) and `fc.bias` (config "bias", default true) over cat([embedding, feature]), then
`layers.0.*` of a LlamaDecoderLayer WITHOUT input_layernorm (only index 0 lacks it):
self_attn.{q,k,v,o}_proj (q/k/v bias with config qkv_bias, Qwen2), mlp.{gate,up,down}_proj,
post_attention_layernorm; `embed_tokens.weight` (the target's, frozen), no final norm, no
lm_head (the target's scores the output). config.json: a one-layer LlamaConfig (heads,
kv heads, rms_norm_eps, rope_theta, rope_scaling).

EAGLE-3 (SafeAILab/EAGLE eagle/model/cnets.py; sgl-project/SpecForge
specforge/modeling/draft/llama3_eagle.py `LlamaForCausalLMEagle3`): `fc.weight` (d, 3d,
no bias) over the three target layers; `midlayer.{input_layernorm, hidden_norm,
post_attention_layernorm}.weight`, `midlayer.self_attn.{q,k,v}_proj.weight` over the 2d
input [input_layernorm(emb), hidden_norm(h)], `o_proj` (d out), `midlayer.mlp.*`;
`norm.weight`, `lm_head.weight` (V_d, d); `d2t` (V_d,) int64 offsets: target id = i +
d2t[i]; `t2d` (V,) bool; optional `fc_norm.{0,1,2}.weight` (config fc_norm), config
norm_output (default true). config.json: draft_vocab_size, vocab_size (the target's),
eagle_config.eagle_aux_hidden_state_layer_ids: the 0-based layers whose OUTPUTS are read
(sglang captures the input of layer id+1). Without them the reference reads the inputs of
layers 2, L//2, L-3, i.e. the outputs of 1, L//2-1, L-4 (SpecForge's default). A draft of
another hidden size than its target's (config target_hidden_size) is not supported.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from specmlx.engine.anatomy import hidden_size
from specmlx.engine.features import backbone
from specmlx.errors import SpecmlxError
from specmlx.heads.base import (
    CONFIG_FILE,
    Heads,
    HeadsConfig,
    TargetOutput,
    check_weights,
    target_vocab,
)
from specmlx.heads.kinds import KINDS

TensorFiles = dict[str, Path]  # tensor name -> the safetensors file holding it

_MEDUSA_KEY = re.compile(r"(?:medusa_head\.)?(\d+)\.(\d+)\.(?:linear\.)?(weight|bias)")
_PICKLES = ("*.bin", "*.pt", "*.pth")
# Tensors a checkpoint may carry that the heads do not use (never loaded): the target's
# embedding, which the heads borrow from the target itself, and old rotary buffers.
_UNUSED = re.compile(r"embed_tokens\.weight|.*rotary_emb\.inv_freq")


def read_published(folder: Path, model: nn.Module, tokenizer: Any | None) -> Heads | None:
    """The Medusa / EAGLE / EAGLE-3 heads in `folder` for target `model`; None when the
    folder holds none of those layouts.

    Published heads record no fingerprint of their target: only their shapes are checked
    against it (hidden size, vocabulary), so `tokenizer` goes unused.
    """
    folder = Path(folder)
    config = _config(folder)
    where = _tensor_files(folder)  # tensor name -> the file holding it
    if not where:
        pickles = sorted(p.name for pattern in _PICKLES for p in folder.glob(pattern))
        if pickles:
            raise SpecmlxError(_convert_advice(folder, pickles[0]))
        if _looks_published(config):
            raise SpecmlxError(
                f"{folder} has a Medusa/EAGLE config but no safetensors weights (published "
                "heads often ship only a .bin/.pt): convert them to safetensors"
            )
        return None
    for kind in KINDS.values():
        for read in kind.published_readers():
            heads = read(folder, config, where, model)
            if heads is not None:
                return heads
    return None


# --- Medusa -----------------------------------------------------------------------------


def read_medusa(folder: Path, config: dict, where: TensorFiles, model: nn.Module) -> Heads | None:
    """Medusa heads, if the tensors in `where` are a Medusa layout."""
    from specmlx.heads.medusa import MedusaHeads

    names = {n for n in where if _MEDUSA_KEY.fullmatch(n)}
    if not names:
        return None
    tensors = _load(where, names)
    # Our parameter names are Medusa's own under `heads.`: the keys map one to one, and
    # `_fill` names any block a head lacks or has beyond head 0's.
    weights = {"heads." + n.removeprefix("medusa_head."): a for n, a in tensors.items()}
    index = [_MEDUSA_KEY.fullmatch(n).groups()[:2] for n in tensors]
    if not any(i == "0" for i, _ in index):
        raise SpecmlxError(f"{folder}: a Medusa checkpoint without head 0")
    n_heads = 1 + max(int(i) for i, _ in index)
    n_layers = max(int(j) for i, j in index if i == "0")  # a head's last module: its lm_head
    rows, hidden = _take(weights, f"heads.0.{n_layers}.weight", folder).shape
    _check_dims(folder, "Medusa", hidden, rows, model)
    heads_config = HeadsConfig(
        kind="medusa",
        hidden_size=hidden,
        target_vocab=target_vocab(model),
        draft_vocab=rows,
        num_heads=n_heads,
        num_layers=n_layers,
        own_lm_head=True,
        training=_record(folder, config),
        source_format="medusa",
    )
    heads = MedusaHeads(heads_config, None, _leading_ids(rows, model))
    return _fill(heads, weights, folder, model)


# --- EAGLE-1 ----------------------------------------------------------------------------


def read_eagle(folder: Path, config: dict, where: TensorFiles, model: nn.Module) -> Heads | None:
    """An EAGLE-1 head, if the tensors in `where` are its layout (fc, then `layers.0`)."""
    from specmlx.heads.eagle import EagleHead

    tensors = _fc_layout(where, "layers.0.self_attn.q_proj.weight")
    if tensors is None:
        return None
    if any(n.startswith("layers.1.") for n in tensors):
        raise SpecmlxError(f"{folder}: EAGLE heads of more than one layer are not supported")
    hidden = tensors["fc.weight"].shape[0]
    if tensors["fc.weight"].shape[1] != 2 * hidden:
        raise SpecmlxError(f"{folder}: EAGLE fc is {tensors['fc.weight'].shape}, not (d, 2d)")
    own_rows = tensors.get("lm_head.weight")
    _check_dims(folder, "EAGLE", hidden, own_rows.shape[0] if own_rows is not None else None, model)
    vocab = target_vocab(model)
    if own_rows is not None and own_rows.shape[0] != vocab:
        raise SpecmlxError(f"{folder}: an EAGLE lm_head of {own_rows.shape[0]} rows, not {vocab}")
    heads_config = HeadsConfig(
        kind="eagle",
        hidden_size=hidden,
        target_vocab=vocab,
        draft_vocab=vocab,
        own_lm_head=own_rows is not None,
        input_norm="layers.0.input_layernorm.weight" in tensors,  # EAGLE-1's layer 0 has none
        target_args=_eagle_layer_args(folder, config, tensors, vocab),
        training=_record(folder, config),
        source_format="eagle",
    )
    output = None if own_rows is not None else TargetOutput(model, None)
    head = EagleHead(heads_config, backbone(model).embed_tokens, output, None)
    weights = {"fc.weight": tensors.pop("fc.weight")}
    weights["fc.bias"] = tensors.pop("fc.bias", mx.zeros((hidden,), weights["fc.weight"].dtype))
    for name in [n for n in tensors if n.startswith("layers.0.")]:
        weights["layer." + name[len("layers.0.") :]] = tensors.pop(name)
    if own_rows is not None:
        weights["lm_head.weight"] = tensors.pop("lm_head.weight")
    _unexpected(tensors, folder)
    return _fill(head, weights, folder, model)


def _eagle_layer_args(folder: Path, config: dict, tensors: dict[str, mx.array], vocab: int) -> dict:
    """mlx-lm arguments of EAGLE-1's llama layer: llama, or qwen2 for q/k/v biases alone."""
    if "num_attention_heads" not in config:
        raise SpecmlxError(f"{folder}: an EAGLE checkpoint needs its config.json (attention heads)")
    biases = {p for p in "qkvo" if f"layers.0.self_attn.{p}_proj.bias" in tensors}
    if biases not in (set(), {"q", "k", "v"}, {"q", "k", "v", "o"}):
        raise SpecmlxError(f"{folder}: EAGLE attention with biases on {sorted(biases)} only")
    heads = config["num_attention_heads"]
    return {
        "model_type": "qwen2" if biases == {"q", "k", "v"} else "llama",
        "attention_bias": len(biases) == 4,
        "hidden_size": _take(tensors, "fc.weight", folder).shape[0],
        "num_hidden_layers": 1,
        "intermediate_size": _take(tensors, "layers.0.mlp.gate_proj.weight", folder).shape[0],
        "num_attention_heads": heads,
        "num_key_value_heads": config.get("num_key_value_heads") or heads,
        "rms_norm_eps": config.get("rms_norm_eps", 1e-6),
        "rope_theta": config.get("rope_theta", 10000.0),  # EAGLE's own default
        "rope_scaling": config.get("rope_scaling"),
        "max_position_embeddings": config.get("max_position_embeddings", 2048),
        "vocab_size": vocab,
        "tie_word_embeddings": False,
    }


# --- EAGLE-3 ----------------------------------------------------------------------------


def read_eagle3(folder: Path, config: dict, where: TensorFiles, model: nn.Module) -> Heads | None:
    """An EAGLE-3 head, if the tensors in `where` are its layout (fc, then `midlayer`)."""
    from specmlx.heads.eagle3 import Eagle3Head, aux_layers, draft_ids

    tensors = _fc_layout(where, "midlayer.self_attn.q_proj.weight")
    if tensors is None:
        return None
    if "num_attention_heads" not in config:
        raise SpecmlxError(
            f"{folder}: an EAGLE-3 checkpoint needs its config.json (attention heads)"
        )
    hidden = tensors["fc.weight"].shape[0]
    rows = tensors["lm_head.weight"].shape[0] if "lm_head.weight" in tensors else None
    if rows is None or "norm.weight" not in tensors:
        raise SpecmlxError(f"{folder}: an EAGLE-3 checkpoint without its norm and lm_head")
    _check_dims(folder, "EAGLE-3", hidden, rows, model)
    if config.get("target_hidden_size", hidden) != hidden:
        raise SpecmlxError(f"{folder}: EAGLE-3 drafts narrower than their target are not supported")
    layers = aux_layers(config, len(backbone(model).layers))
    if tensors["fc.weight"].shape[1] != len(layers) * hidden:
        width = tensors["fc.weight"].shape[1]
        raise SpecmlxError(
            f"{folder}: EAGLE-3 fc reads {width} features, not {len(layers)}x{hidden}"
        )
    ffn = _take(tensors, "midlayer.mlp.gate_proj.weight", folder).shape[0]
    offsets, in_target = tensors.pop("d2t", None), tensors.pop("t2d", None)
    # The reference ignores d2t when the draft vocabulary is the whole one.
    d2t = (
        None if rows == target_vocab(model) else draft_ids(offsets, in_target, target_vocab(model))
    )
    heads_config = HeadsConfig(
        kind="eagle3",
        hidden_size=hidden,
        target_vocab=target_vocab(model),
        draft_vocab=rows,
        feature_layers=layers,
        own_lm_head=True,
        target_args={**config, "hidden_size": hidden, "intermediate_size": ffn},
        training=_record(folder, config),
        source_format="eagle3",
    )
    head = Eagle3Head(heads_config, backbone(model).embed_tokens, d2t)
    own = {n for n, _ in tree_flatten(head.parameters())}
    weights = {n: tensors.pop(n) for n in list(tensors) if n in own}
    _unexpected(tensors, folder)
    return _fill(head, weights, folder, model)


# --- files ------------------------------------------------------------------------------


def _config(folder: Path) -> dict:
    path = folder / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise SpecmlxError(f"{path} is not valid JSON: {e}") from None
    return data if isinstance(data, dict) else {}


def _tensor_files(folder: Path) -> TensorFiles:
    """Every tensor name in the folder's safetensors files, from their headers alone."""
    where = {}
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with path.open("rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error):
            raise SpecmlxError(f"{path} is not a readable safetensors file") from None
        where.update((name, path) for name in header if name != "__metadata__")
    return where


def _fc_layout(where: TensorFiles, layer_key: str) -> dict[str, mx.array] | None:
    """The tensors of an EAGLE-style checkpoint (`fc.weight` and `layer_key`), a `model.`
    prefix dropped and the unused ones never loaded; None when `where` is no such layout."""
    prefix = "model." if "model.fc.weight" in where else ""
    if prefix + "fc.weight" not in where or prefix + layer_key not in where:
        return None
    wanted = {n for n in where if not _UNUSED.fullmatch(n.removeprefix(prefix))}
    return {n.removeprefix(prefix): a for n, a in _load(where, wanted).items()}


def _load(where: TensorFiles, names: set[str]) -> dict[str, mx.array]:
    out = {}
    for path in sorted({where[n] for n in names}):
        out.update((n, a) for n, a in mx.load(str(path)).items() if n in names)
    return out


def _looks_published(config: dict) -> bool:
    return any(k in config for k in ("medusa_num_heads", "draft_vocab_size", "eagle_config")) or (
        config.get("num_hidden_layers") == 1
    )


def _convert_advice(folder: Path, name: str) -> str:
    out = "medusa_lm_head.safetensors" if name.startswith("medusa") else "model.safetensors"
    return (
        f"{folder / name} is a pickled PyTorch file, which specmlx never loads; convert it "
        f'to safetensors: python -c "import torch; from safetensors.torch import save_file; '
        f"save_file({{k: v.contiguous().clone() for k, v in torch.load('{name}', "
        f"map_location='cpu', weights_only=True).items()}}, '{out}')\" (in {folder})"
    )


# --- checks and filling -----------------------------------------------------------------


def _check_dims(folder: Path, kind: str, hidden: int, rows: int | None, model: nn.Module) -> None:
    if hidden != hidden_size(model):
        raise SpecmlxError(
            f"{folder}: {kind} heads of hidden size {hidden}, the target's is "
            f"{hidden_size(model)}: they were trained for another model"
        )
    if rows is not None and rows > target_vocab(model):
        raise SpecmlxError(
            f"{folder}: {kind} heads score {rows} tokens, the target has {target_vocab(model)}"
        )


def _leading_ids(rows: int, model: nn.Module) -> mx.array | None:
    """A head over the first `rows` target tokens (the target pads its vocabulary)."""
    return None if rows == target_vocab(model) else mx.arange(rows, dtype=mx.int32)


def _record(folder: Path, config: dict) -> dict:
    base = config.get("base_model_name_or_path") or config.get("_name_or_path")
    return {"published": str(folder), **({"base_model": base} if base else {})}


def _take(tensors: dict[str, mx.array], name: str, folder: Path) -> mx.array:
    if name not in tensors:
        raise SpecmlxError(f"{folder}: the checkpoint lacks {name}")
    return tensors[name]


def _unexpected(tensors: dict[str, mx.array], folder: Path) -> None:
    if tensors:
        raise SpecmlxError(f"{folder}: unexpected weight {min(tensors)} for this layout")


def _fill(heads: Heads, weights: dict[str, mx.array], folder: Path, model: nn.Module) -> Heads:
    """Load `weights` (exactly the heads' parameters) in the target's float dtype."""
    check_weights(dict(tree_flatten(heads.parameters())), weights, f"{folder}: the checkpoint")
    dtype = _float_dtype(model)
    heads.load_weights([(n, a.astype(dtype)) for n, a in weights.items()])
    mx.eval(heads.parameters())
    return heads


def _float_dtype(model: nn.Module) -> mx.Dtype:
    """The target's compute dtype: its embeddings' (their scales', when quantized)."""
    embed = backbone(model).embed_tokens
    return embed.scales.dtype if isinstance(embed, nn.QuantizedEmbedding) else embed.weight.dtype
