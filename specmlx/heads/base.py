"""What every kind of draft heads shares: their config and the target they fit.

Heads (Medusa, EAGLE) are trained on one target's hidden states and are worthless on any
other, so a saved folder records a `fingerprint` of its target and `load_heads` refuses a
target that differs, in one line naming what differs. The probe of input embeddings in the
fingerprint is compared by direction, so a quantized copy of the same target still fits.

A heads module (MedusaHeads, EagleHead) has `config: HeadsConfig`, `d2t` (the target ids of
its draft vocabulary, None for the full one) and `create(config, target_model, d2t=None)`;
only its trainable parameters are its own weights: whatever it borrows from the target (the
output rows, the embeddings) is kept out of them and never saved.

Their files are written and read by `specmlx.heads.store`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specmlx.engine.anatomy import hidden_size, output_layer
from specmlx.engine.features import backbone
from specmlx.errors import SpecmlxError
from specmlx.heads.kinds import head_kind

# The files of a heads folder of ours (`specmlx.heads.store`); published ones name their own.
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

# The probe: input embeddings of PROBE_IDS ids spread over the vocabulary, first PROBE_DIMS
# dimensions each (512 floats): enough to tell two models apart, small enough for config.json.
PROBE_IDS = 16
PROBE_DIMS = 32
PROBE_MIN_COSINE = 0.9  # a 4-bit copy of the same target scores ~0.99, another model ~0

# MedusaHeads or EagleHead: an nn.Module with `config` and `d2t`.
Heads = nn.Module


@dataclass(frozen=True)
class HeadsConfig:
    """Draft heads: their kind, their shapes, and the target they were trained for."""

    kind: str  # a name in specmlx.heads.kinds.KINDS
    hidden_size: int  # the target's
    target_vocab: int  # the target's output rows
    draft_vocab: int  # V_d: the target tokens the heads score (== target_vocab: all of them)
    feature_layers: tuple[int, ...] = ()  # FeatureSpec layers; (): the final hidden state
    num_heads: int = 4  # medusa: tokens ahead
    num_layers: int = 1  # medusa: residual blocks per head
    # True: the checkpoint has its own lm_head rows (published ones do). False: the heads
    # score through the target's output rows of the draft vocabulary, frozen, never saved.
    own_lm_head: bool = False
    # eagle: the layer normalizes its input (EAGLE-1 checkpoints have no input norm: False).
    input_norm: bool = True
    target_args: dict = field(default_factory=dict)  # eagle: the target's config.json
    fingerprint: dict = field(default_factory=dict)  # the target it was trained on
    training: dict = field(default_factory=dict)  # data, steps, seed, final losses
    # The softmax temperature of each head (medusa) or level (eagle: the last one serves
    # deeper levels) drafting applies, written by `eval-heads --fit-temperatures`
    # (`specmlx.training.temperature`; training only records its fit); (): 1 everywhere.
    temperatures: tuple[float, ...] = ()
    source_format: str = "specmlx"  # "specmlx", or the kind whose published layout it was

    def __post_init__(self) -> None:
        head_kind(self.kind)  # one line naming the known kinds, if it is none of them
        if not all(math.isfinite(t) and t > 0 for t in self.temperatures):
            raise SpecmlxError(f"heads temperatures must be positive: {list(self.temperatures)}")
        if not 0 < self.draft_vocab <= self.target_vocab:
            raise SpecmlxError(
                f"draft vocabulary of {self.draft_vocab} tokens for a target of "
                f"{self.target_vocab}: it must be between 1 and the target's"
            )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["feature_layers"] = list(self.feature_layers)
        out["temperatures"] = list(self.temperatures)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadsConfig:
        """Unknown keys are ignored (a newer specmlx may add some)."""
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls) if _required(f) and f.name not in data]
        if missing:
            raise SpecmlxError(f"heads config lacks {', '.join(missing)}")
        values = {k: v for k, v in data.items() if k in names}
        values["feature_layers"] = tuple(values.get("feature_layers", ()))
        temperatures = values.get("temperatures", [])
        numbers = isinstance(temperatures, (list, tuple)) and all(
            isinstance(t, (int, float)) and not isinstance(t, bool) for t in temperatures
        )
        if not numbers:
            raise SpecmlxError(f"heads temperatures must be a list of numbers: {temperatures!r}")
        values["temperatures"] = tuple(float(t) for t in temperatures)
        return cls(**values)

    def temperature(self, i: int) -> float:
        """Head (or level) i's temperature: 1 where none was fitted, the last one past them."""
        return self.temperatures[min(i, len(self.temperatures) - 1)] if self.temperatures else 1.0


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


# --- the target -------------------------------------------------------------------------


def target_vocab(model: nn.Module) -> int:
    """The target's output rows (its vocabulary, padding included)."""
    return output_layer(model).weight.shape[0]  # rows, also when quantized (packed columns)


def output_rows(model: nn.Module, d2t: mx.array | None) -> mx.array:
    """The target's output rows for the draft vocabulary, dequantized. # (V_d, hidden)"""
    layer = output_layer(model)
    if isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        # Pick the quantized rows first: only V_d rows are ever dequantized.
        pick = (lambda a: a) if d2t is None else (lambda a: a[d2t])
        biases = layer.get("biases")
        return mx.dequantize(
            pick(layer.weight),
            pick(layer.scales),
            None if biases is None else pick(biases),
            group_size=layer.group_size,
            bits=layer.bits,
            mode=layer.mode,
        )
    if not isinstance(layer, (nn.Linear, nn.Embedding)):
        raise SpecmlxError(f"heads cannot read the output rows of a {type(layer).__name__}")
    return layer.weight if d2t is None else layer.weight[d2t]


class TargetOutput:
    """Logits over the draft vocabulary through the target's own output layer, frozen.

    A plain object, not an nn.Module: held by heads, it is none of their parameters, so it
    is never trained, saved, cast or frozen with them. The full vocabulary of a quantized
    target goes through its quantized layer (no dequantized copy of the whole matrix); a
    subset is gathered once, dequantized.
    """

    def __init__(self, model: nn.Module, d2t: mx.array | None):
        layer = output_layer(model)
        quantized = isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding))
        self._layer = layer if quantized and d2t is None else None
        self.rows = None if self._layer is not None else output_rows(model, d2t)  # (V_d, d)
        if self.rows is not None:
            mx.eval(self.rows)  # gathered once, not again in every call
        # The hidden states take the rows' dtype: a float32 head output would otherwise
        # promote the whole (V_d, d) matrix to float32 in every call.
        self.dtype = layer.scales.dtype if self._layer is not None else self.rows.dtype

    def __call__(self, hidden: mx.array) -> mx.array:
        """# (..., hidden) -> (..., V_d)"""
        hidden = hidden.astype(self.dtype)
        if self._layer is None:
            return hidden @ self.rows.T
        if isinstance(self._layer, nn.QuantizedEmbedding):
            return self._layer.as_linear(hidden)
        return self._layer(hidden)


def check_fits(
    config: HeadsConfig, target_model: nn.Module, d2t: mx.array | None, what: str
) -> None:
    """Heads of `config` can sit on `target_model`: its hidden size and vocabulary, and d2t
    ids exactly when the draft vocabulary is smaller. `what` names them in the error."""
    if config.hidden_size != hidden_size(target_model):
        raise SpecmlxError(
            f"{what} of hidden size {config.hidden_size} on a target of {hidden_size(target_model)}"
        )
    if config.target_vocab != target_vocab(target_model):
        raise SpecmlxError(
            f"{what} over {config.target_vocab} target tokens on a target of "
            f"{target_vocab(target_model)}"
        )
    if (d2t is None) != (config.draft_vocab == config.target_vocab):
        raise SpecmlxError("a draft vocabulary smaller than the target's needs its d2t ids")


def check_weights(expected: dict[str, mx.array], weights: dict[str, mx.array], where: str) -> None:
    """`weights` hold exactly the `expected` names, in their shapes; else a one-line error
    naming the first that does not (`where`: the file or checkpoint, as the user knows it)."""
    for name in sorted(set(expected) ^ set(weights)):
        why = "lacks" if name in expected else "has an unexpected"
        raise SpecmlxError(f"{where} {why} weight {name}")
    for name, value in weights.items():
        if value.shape != expected[name].shape:
            raise SpecmlxError(
                f"{where} has weight {name} of shape {tuple(value.shape)}, the heads want "
                f"{tuple(expected[name].shape)}"
            )


def fingerprint(model: nn.Module, tokenizer: Any | None) -> dict[str, Any]:
    """What identifies a target: its shapes, its tokenizer, and a probe of its embeddings."""
    inner = backbone(model)
    vocab_size = target_vocab(model)
    ids = mx.array([(2 * i + 1) * vocab_size // (2 * PROBE_IDS) for i in range(PROBE_IDS)])
    probe = inner.embed_tokens(ids)[:, :PROBE_DIMS].astype(mx.float32)  # (16, 32)
    return {
        "model_type": getattr(model, "model_type", None) or model.args.model_type,
        "hidden_size": hidden_size(model),
        "num_layers": len(inner.layers),
        "vocab_size": vocab_size,
        "tokenizer_sha256": None if tokenizer is None else tokenizer_sha256(tokenizer),
        "embedding_probe": [round(v, 6) for v in probe.reshape(-1).tolist()],
    }


def tokenizer_sha256(tokenizer: Any) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id])
    text = json.dumps({"vocab": vocab, "eos": eos}, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def check_target(saved: dict[str, Any], model: nn.Module, tokenizer: Any | None) -> None:
    """Raise a one-line SpecmlxError unless `model` is the target `saved` describes.

    Only what `saved` records is compared (published heads record nothing); a tokenizer
    hash is compared when both sides have one.
    """
    if not saved:
        return
    here = fingerprint(model, tokenizer)
    for key in ("model_type", "hidden_size", "num_layers", "vocab_size", "tokenizer_sha256"):
        if saved.get(key) is not None and here[key] is not None and saved[key] != here[key]:
            if key == "tokenizer_sha256":
                raise SpecmlxError("these heads were trained for a target with another tokenizer")
            raise SpecmlxError(
                f"these heads were trained for another target: its {key} was {saved[key]}, "
                f"this target's is {here[key]}"
            )
    if saved.get("embedding_probe"):
        cosine = _cosine(saved["embedding_probe"], here["embedding_probe"])
        if cosine < PROBE_MIN_COSINE:
            raise SpecmlxError(
                "these heads were trained for another target: its embeddings differ from "
                f"this one's (cosine {cosine:.2f}, same shapes: another seed or checkpoint?)"
            )


def _cosine(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return 0.0
    norms = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norms if norms else 0.0


def method_of_heads(heads: Heads) -> str:
    """The `--method` that drafts with these heads (their kind's, in the kinds table)."""
    return head_kind(heads.config.kind).method
