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
at position 0 is vLLM's own, not the reference's, and is not done here. DeepSeek-V3's
next-n layer is the model's layer num_hidden_layers (`model.layers.61.*` in V3): enorm,
hnorm, eh_proj over cat[embedding, hidden], an ordinary decoder layer (MLA attention, a
mixture of experts), shared_head.norm, plain norms; its own copies of the embedding and LM
head (embed_tokens, shared_head.head) are read where the checkpoint has them, FP8 blocks
dequantized as the backbone's. Each family's layout and conversions: `mtp_layouts`.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import replace
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
from specmlx.heads.mtp_layouts import (
    FAMILIES,
    OWN_PARTS,
    SCALE_INV,
    Layout,
    _checkpoint_name,
    _converted,
    _unshifted,
    dequantized,
)

# Where the target's hidden state is taken, and the MTP's own recycled: after the final norm
# (the authors' reference) or before it.
HIDDEN_STATES = ("post-norm", "pre-norm")
QUANTIZED = (".scales", ".biases")  # companions of a quantized tensor (not read)


class MtpHead(nn.Module):
    """The MTP module: its norms, fc and decoder layer are its own parameters; the target's
    embedding and LM head are borrowed (outside the parameters: never cast or saved), unless
    the checkpoint gives the layer its own (`own`: embed_tokens, lm_head; DeepSeek-V3)."""

    def __init__(
        self,
        layout: Layout,
        args: Any,
        size: int,
        embed: nn.Module,
        output: Any,
        own: frozenset[str] = frozenset(),
    ):
        super().__init__()
        eps = args.rms_norm_eps
        self.embed_norm = nn.RMSNorm(size, eps=eps)
        self.hidden_norm = nn.RMSNorm(size, eps=eps)
        self.fc = nn.Linear(2 * size, size, bias=False)
        self.layer = layout.make_layer(args)
        self.norm = nn.RMSNorm(size, eps=eps)
        if "embed_tokens" in own:
            self.embed_tokens = nn.Embedding(args.vocab_size, size)
        if "lm_head" in own:
            self.lm_head = nn.Linear(size, args.vocab_size, bias=False)
        self.hidden_first = layout.hidden_first
        self.array_mask = layout.array_mask
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
        embed = self["embed_tokens"] if "embed_tokens" in self else self._borrowed.embed
        embedded = self.embed_norm(embed(tokens).astype(hidden.dtype))
        hidden = self.hidden_norm(hidden)
        # Qwen and DeepSeek: cat([inputs_embeds, hidden]); MiMo the other way round.
        parts = [hidden, embedded] if self.hidden_first else [embedded, hidden]
        x = self.fc(mx.concatenate(parts, axis=-1))[None]
        c = cache[0] if cache is not None else None
        mask = create_attention_mask(x, c, return_array=self.array_mask)
        return self.layer(x, mask, c)[0]

    def logits(self, out: mx.array) -> mx.array:
        """The LM head (the layer's own, else the target's) over the normed output.
        # (n, vocab)"""
        return self["lm_head"](out) if "lm_head" in self else self._borrowed.output(out)


def target_features(target: nn.Module, hidden: str) -> FeatureSpec:
    """What the target keeps for the MTP: its final hidden state (post-norm), or the output
    of its last decoder layer, the same state before the final norm (pre-norm)."""
    if hidden not in HIDDEN_STATES:
        raise UsageError(f"mtp-hidden must be {' or '.join(HIDDEN_STATES)}, got {hidden!r}")
    return FeatureSpec(() if hidden == "post-norm" else (len(backbone(target).layers) - 1,))


def layout_of(target: nn.Module) -> Layout | None:
    """The MTP layout of the target's family, its prefix filled in; None: not one we read."""
    layout = FAMILIES.get(type(target).__module__.rsplit(".", 1)[-1])
    if layout is None:
        return None
    n_layers = getattr(text_args(target), "num_hidden_layers", 0)
    return replace(layout, prefix=layout.prefix.format(num_hidden_layers=n_layers))


def mtp_tensors(path: Path | None, prefix: str) -> dict[str, Path]:
    """The MTP tensors of a checkpoint folder (those under `prefix`: `mtp.*`,
    `model.mtp_layers.*`, `model.layers.61.*`), by name, with the file that holds each, from
    the safetensors headers alone (nothing is loaded); {} for a file (a .gguf) or a folder
    without them."""
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
        where.update((name, file) for name in header if name.startswith(prefix))
    return where


def has_mtp(path: Path | None, target: nn.Module) -> bool:
    """Whether the checkpoint at `path` holds an MTP layer of the target's family that
    `load_mtp` reads (from the headers alone): what makes mtp the default method."""
    layout = layout_of(target)
    if layout is None:
        return False
    names = list(mtp_tensors(path, layout.prefix))
    return bool(names) and not any(n.endswith(QUANTIZED) for n in names)


def load_mtp(path: Path, target: nn.Module) -> MtpHead:
    """The MTP module in the checkpoint at `path`, for the loaded `target`; a one-line error
    naming the tensor that is missing, unexpected or of the wrong shape."""
    layout = layout_of(target)
    if layout is None:
        family = type(target).__module__.rsplit(".", 1)[-1]
        raise UsageError(
            f"--method mtp reads the MTP layers of {', '.join(FAMILIES)}; this target is {family}"
        )
    where = mtp_tensors(path, layout.prefix)
    if not where:
        raise UsageError(
            f"--method mtp needs the MTP tensors ({layout.prefix}*) of the target's checkpoint; "
            f"{path} has none (mlx-lm conversions drop them: point --target at the release)"
        )
    if any(name.endswith(QUANTIZED) for name in where):
        raise SpecmlxError(f"{path}: quantized MTP tensors are not supported; use the bf16 release")
    n_layers = _n_layers(layout, where, path)
    if n_layers > 1:
        raise SpecmlxError(
            f"{path} has {n_layers} MTP layers; specmlx reads checkpoints of one (as the "
            "released ones are)"
        )
    raw: dict[str, mx.array] = {}
    for file in sorted(set(where.values())):
        raw.update((n, a) for n, a in mx.load(str(file)).items() if n in where)
    if any(name.endswith(SCALE_INV) for name in raw):
        if not layout.fp8:
            fp8 = next(n for n in sorted(raw) if n.endswith(SCALE_INV))
            raise SpecmlxError(
                f"{path}: FP8 MTP tensors ({fp8}) are not supported here; use the bf16 release"
            )
        raw = dequantized(raw, target, str(path))
    args = text_args(target)
    n_experts = getattr(args, "num_experts", 0) or getattr(args, "n_routed_experts", 0) or 0
    weights, origin = _converted(layout, raw, n_experts, str(path))
    own = frozenset(p for p in OWN_PARTS if any(n.startswith(p + ".") for n in weights))
    head = MtpHead(
        layout,
        args,
        hidden_size(target),
        backbone(target).embed_tokens,
        TargetOutput(target, None),
        own,
    )
    expected = dict(tree_flatten(head.parameters()))
    if layout.convert is not None:
        weights, origin = layout.convert(layout, args, weights, origin, expected, str(path))
    _check(layout, expected, weights, origin, str(path))
    if layout.zero_centred:
        weights = _unshifted(weights)
    dtype = backbone(target).norm.weight.dtype
    head.load_weights([(n, w.astype(dtype)) for n, w in weights.items()])
    mx.eval(head.parameters())
    return head


def _n_layers(layout: Layout, where: dict[str, Path], path: Path) -> int:
    """How many MTP layers the checkpoint has: distinct indices under the prefix, or the
    config's num_nextn_predict_layers where each layer has a prefix of its own."""
    if layout.layer_index is None:
        config = json.loads((Path(path) / "config.json").read_text())
        return int(config.get("num_nextn_predict_layers", 1))
    index = re.compile(re.escape(layout.prefix) + layout.layer_index)
    return len({m.group(1) for n in where if (m := index.match(n))})


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
