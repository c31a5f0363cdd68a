"""Multi-token prediction (MTP) heads from the target's own checkpoint.

Qwen3.5 / Qwen3.6 and Qwen3-Next are released with an MTP module trained with the model,
stored in the same safetensors files as top-level `mtp.*` tensors (MiMo: `model.mtp_layers.*`),
which mlx-lm's `sanitize` drops. `load_mtp` reads them from the target's folder and builds the
module the authors' reference (vLLM's `qwen3_next_mtp.py` / `qwen3_5_mtp.py`) runs for
position p:

    x   = fc(cat[pre_fc_norm_embedding(embed(t_{p+1})), pre_fc_norm_hidden(h_p)])
    y   = one decoder block of the model's own kind (full attention, RoPE position p)
    out = norm(y); logits = lm_head(out)

with the target's embedding and LM head, shared, and h_p the target's hidden state after its
final norm: the tensor the target's LM head scores, which vLLM, SGLang and Megatron's training
all hand the MTP layer. `out` is fed back as the hidden state of the next drafted position.
("pre-norm", switchable in the drafter, reads the target's hidden state before that norm and
recycles y, as mlx-lm#990's branch does.)

Every norm of the Qwen modules is zero-centred as stored (the model multiplies by 1 + w);
mlx's RMSNorm multiplies by w, so 1 is added at load. A conversion that already shifted some
of them exists (omlx#1507), so each norm is shifted only where its weights average near 0
(an unshifted norm averages near 1). Routed experts are stacked as mlx-lm stacks the
backbone's: one tensor per expert (Qwen3-Next, split releases) or a fused gate_up_proj
(Qwen3.5-MoE). MiMo's module is the same idea under its own names (`MiMoMTPLayers`): a
Qwen2 block, plain norms, fc over cat[hidden, embedding]; vLLM's zeroing of the embedding
at position 0 is vLLM's own, not the reference's, and is not done here.
DeepSeek-V3's layout (`model.layers.{num_hidden_layers}`: MLA attention, FP8) is not read.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask

from specmlx.engine.anatomy import hidden_size, text_args
from specmlx.engine.cache import SpecKVCache
from specmlx.engine.features import FeatureSpec, backbone
from specmlx.errors import SpecmlxError, UsageError
from specmlx.heads.base import TargetOutput

# Where the target's hidden state is taken, and the MTP's own recycled: after the final norm
# (the authors' reference) or before it.
HIDDEN_STATES = ("post-norm", "pre-norm")
QUANTIZED = (".scales", ".biases")  # companions of a quantized tensor (not read)
_EXPERT = re.compile(r"layer\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
_FUSED = re.compile(r"layer\.mlp\.experts\.(gate_up_proj|down_proj)")


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


@dataclass(frozen=True)
class Layout:
    """How a family stores its MTP layer, and how the layer runs."""

    prefix: str  # of every MTP tensor's name
    layer_index: str  # after the prefix, a pattern whose group 1 is an MTP layer's index
    # The checkpoint's name (after the prefix) of each part, and the module's: embed_norm,
    # hidden_norm, fc, layer (the decoder block), norm (the final one).
    parts: dict[str, str]
    make_layer: Callable[[Any], nn.Module]
    hidden_first: bool = False  # fc reads cat[hidden, embedding] (MiMo), else the reverse
    zero_centred: bool = True  # norms stored as w for a scale of 1 + w (the Qwen families)


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
}
PREFIXES = tuple({layout.prefix for layout in FAMILIES.values()})


class MtpHead(nn.Module):
    """The MTP module: its norms, fc and decoder layer are its own parameters; the target's
    embedding and LM head are borrowed (outside the parameters: never cast or saved)."""

    def __init__(self, layout: Layout, args: Any, size: int, embed: nn.Module, output: Any):
        super().__init__()
        eps = args.rms_norm_eps
        self.embed_norm = nn.RMSNorm(size, eps=eps)
        self.hidden_norm = nn.RMSNorm(size, eps=eps)
        self.fc = nn.Linear(2 * size, size, bias=False)
        self.layer = layout.make_layer(args)
        self.norm = nn.RMSNorm(size, eps=eps)
        self.hidden_first = layout.hidden_first
        self._borrowed = SimpleNamespace(embed=embed, output=output)

    def make_cache(self) -> list[SpecKVCache]:
        """The layer's own KV cache, trimmable."""
        return [SpecKVCache()]

    def __call__(
        self, hidden: mx.array, tokens: mx.array, cache: list[Any] | None = None
    ) -> mx.array:
        """The layer's output before the final norm, for rows (h_p, t_{p+1}) that follow
        the cache at positions offset.. # (n, H)

        hidden # (n, H) the target's hidden states (or the MTP's own, recycled)
        tokens # (n,) the tokens that follow them
        """
        embedded = self.embed_norm(self._borrowed.embed(tokens).astype(hidden.dtype))
        hidden = self.hidden_norm(hidden)
        # Qwen and DeepSeek: cat([inputs_embeds, hidden]); MiMo the other way round.
        parts = [hidden, embedded] if self.hidden_first else [embedded, hidden]
        x = self.fc(mx.concatenate(parts, axis=-1))[None]
        c = cache[0] if cache is not None else None
        return self.layer(x, create_attention_mask(x, c), c)[0]

    def logits(self, out: mx.array) -> mx.array:
        """The target's LM head over the normed output. # (n, vocab)"""
        return self._borrowed.output(out)


def target_features(target: nn.Module, hidden: str) -> FeatureSpec:
    """What the target keeps for the MTP: its final hidden state (post-norm), or the output
    of its last decoder layer, the same state before the final norm (pre-norm)."""
    if hidden not in HIDDEN_STATES:
        raise UsageError(f"mtp-hidden must be {' or '.join(HIDDEN_STATES)}, got {hidden!r}")
    return FeatureSpec(() if hidden == "post-norm" else (len(backbone(target).layers) - 1,))


def mtp_tensors(path: Path | None) -> dict[str, Path]:
    """The MTP tensors of a checkpoint folder (`mtp.*`, `model.mtp_layers.*`), by name,
    with the file that holds each, from the safetensors headers alone (nothing is loaded);
    {} for a file (a .gguf) or a folder without them."""
    if path is None or not Path(path).is_dir():
        return {}
    where: dict[str, Path] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        try:
            with file.open("rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error):
            raise SpecmlxError(f"{file} is not a readable safetensors file") from None
        where.update((name, file) for name in header if name.startswith(PREFIXES))
    return where


def has_mtp(path: Path | None, target: nn.Module) -> bool:
    """Whether the checkpoint at `path` holds an MTP layer of the target's family that
    `load_mtp` reads (from the headers alone): what makes mtp the default method."""
    layout = FAMILIES.get(type(target).__module__.rsplit(".", 1)[-1])
    if layout is None:
        return False
    names = [n for n in mtp_tensors(path) if n.startswith(layout.prefix)]
    return bool(names) and not any(n.endswith(QUANTIZED) for n in names)


def load_mtp(path: Path, target: nn.Module) -> MtpHead:
    """The MTP module in the checkpoint at `path`, for the loaded `target`; a one-line error
    naming the tensor that is missing, unexpected or of the wrong shape."""
    family = type(target).__module__.rsplit(".", 1)[-1]
    if family not in FAMILIES:
        raise UsageError(
            f"--method mtp reads the MTP layers of {', '.join(FAMILIES)}; this target is {family}"
        )
    layout = FAMILIES[family]
    where = {n: f for n, f in mtp_tensors(path).items() if n.startswith(layout.prefix)}
    if not where:
        raise UsageError(
            f"--method mtp needs the MTP tensors ({layout.prefix}*) of the target's checkpoint; "
            f"{path} has none (mlx-lm conversions drop them: point --target at the release)"
        )
    if any(name.endswith(QUANTIZED) for name in where):
        raise SpecmlxError(f"{path}: quantized MTP tensors are not supported; use the bf16 release")
    index = re.compile(re.escape(layout.prefix) + layout.layer_index)
    n_layers = len({m.group(1) for n in where if (m := index.match(n))})
    if n_layers > 1:
        raise SpecmlxError(
            f"{path} has {n_layers} MTP layers; specmlx reads checkpoints of one (as the "
            "released ones are)"
        )
    raw: dict[str, mx.array] = {}
    for file in sorted(set(where.values())):
        raw.update((n, a) for n, a in mx.load(str(file)).items() if n in where)
    args = text_args(target)
    head = MtpHead(
        layout, args, hidden_size(target), backbone(target).embed_tokens, TargetOutput(target, None)
    )
    weights, origin = _converted(layout, raw, getattr(args, "num_experts", 0), str(path))
    _check(layout, dict(tree_flatten(head.parameters())), weights, origin, str(path))
    if layout.zero_centred:
        weights = _unshifted(weights)
    dtype = backbone(target).norm.weight.dtype
    head.load_weights([(n, w.astype(dtype)) for n, w in weights.items()])
    mx.eval(head.parameters())
    return head


def _module_name(layout: Layout, name: str) -> str:
    """The module's name of a checkpoint tensor (unknown ones keep theirs)."""
    key = name[len(layout.prefix) :]
    for part in sorted(layout.parts, key=len, reverse=True):  # "0.input_proj" before "0"
        if key.startswith(part + "."):
            return layout.parts[part] + key[len(part) :]
    return key


def _checkpoint_name(layout: Layout, name: str) -> str:
    """The checkpoint's name of a module parameter."""
    for part, ours in layout.parts.items():
        if name.startswith(ours + "."):
            return layout.prefix + part + name[len(ours) :]
    return layout.prefix + name


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
        key = f"layer.mlp.switch_mlp.{proj}.weight"
        weights[key] = mx.stack([by_index[e] for e in sorted(by_index)])
        origin[key] = _checkpoint_name(layout, f"layer.mlp.experts.*.{proj}.weight") + " (stacked)"
    return weights, origin


def _check(
    layout: Layout,
    expected: dict[str, mx.array],
    weights: dict[str, mx.array],
    origin: dict[str, str],
    where: str,
) -> None:
    for name in sorted(expected.keys() - weights.keys()):
        if ".switch_mlp." in name:
            experts = _checkpoint_name(layout, "layer.mlp.experts.*")
            raise SpecmlxError(f"{where} lacks the MTP layer's routed experts ({experts})")
        raise SpecmlxError(f"{where} lacks MTP tensor {_checkpoint_name(layout, name)}")
    for name in sorted(weights.keys() - expected.keys()):
        raise SpecmlxError(
            f"{where} has an MTP tensor the target's config does not expect: {origin[name]}"
        )
    for name, value in weights.items():
        if value.shape != expected[name].shape:
            raise SpecmlxError(
                f"{where}: MTP tensor {origin[name]} has shape {tuple(value.shape)}, the "
                f"target's config wants {tuple(expected[name].shape)}"
            )


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
