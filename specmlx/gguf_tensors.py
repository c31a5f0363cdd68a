"""Reading a GGUF file: its metadata, and its tensors as mlx-lm weights.

GGUF stores every tensor under llama.cpp's names, in ggml's dimension order (fastest first,
the reverse of numpy's), often quantized in blocks, and sometimes rearranged for llama.cpp's
kernels. This module undoes all of that, one tensor at a time: `open_gguf` checks the file,
`read_metadata` turns its key/value section into plain Python values, and `weights` yields
`(mlx-lm name, float32 numpy array)` pairs in the layout the HF checkpoint had. gguf-py's
numpy dequantization is both the implementation and the reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField, ReaderTensor
from gguf.quants import dequantize

from specmlx.errors import SpecmlxError

Q = GGMLQuantizationType
# Every type gguf-py dequantizes exactly in numpy and llama.cpp uses for plain models; the
# ternary and importance-matrix (IQ*) types are left out on purpose.
SUPPORTED_TYPES = (
    Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
    Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
)  # fmt: skip


@dataclass(frozen=True)
class ArchSpec:
    """How one llama.cpp architecture maps onto an mlx-lm model."""

    model_type: str  # mlx-lm's name for it
    ffn_norm: str  # where `ffn_norm` goes: the norm before the MLP
    permute_qk: bool  # llama.cpp interleaved q/k rows for its rotary kernel (LlamaModel.permute)
    norm_shift: float  # llama.cpp baked `1 + w` into the RMSNorm weights (Gemma's norm_shift)


ARCHS = {
    "llama": ArchSpec("llama", "post_attention_layernorm", permute_qk=True, norm_shift=0.0),
    "qwen2": ArchSpec("qwen2", "post_attention_layernorm", permute_qk=False, norm_shift=0.0),
    "gemma3": ArchSpec(
        "gemma3_text", "pre_feedforward_layernorm", permute_qk=False, norm_shift=1.0
    ),
}

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def open_gguf(path: Path) -> GGUFReader:
    """A reader over `path`, or a one-line SpecmlxError saying what is wrong with the file."""
    if not path.exists():
        raise SpecmlxError(f"{path}: no such file")
    if not path.is_file():
        raise SpecmlxError(f"{path} is not a file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise SpecmlxError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF')")
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # gguf-py raises whatever numpy hits first on a damaged file
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise SpecmlxError(f"{path} is a truncated or corrupt GGUF file ({reason})") from None
    size = path.stat().st_size
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise SpecmlxError(
                f"{path} is truncated: tensor {tensor.name} ends at byte {end}, the file has {size}"
            )
    return reader


def _field_value(field: ReaderField) -> object:
    """One metadata value as plain Python: str, int, float, bool, or a list of them."""
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        if field.types[-1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        if field.types[-1] == GGUFValueType.ARRAY or not field.data:
            return []
        return np.concatenate([field.parts[i] for i in field.data]).tolist()
    if kind == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return field.parts[field.data[0]].tolist()[0]


def read_metadata(reader: GGUFReader) -> dict[str, object]:
    """The key/value section, without gguf-py's own `GGUF.*` bookkeeping entries."""
    return {k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def architecture(meta: dict[str, object], path: Path) -> ArchSpec:
    """The spec for the file's `general.architecture`, or an error naming it."""
    arch = meta.get("general.architecture")
    if arch is None:
        raise SpecmlxError(f"{path} has no general.architecture in its metadata")
    if arch not in ARCHS:
        raise SpecmlxError(
            f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHS)})"
        )
    return ARCHS[str(arch)]


def mlx_name(gguf_name: str, spec: ArchSpec) -> str | None:
    """The mlx-lm parameter name for a GGUF tensor name, or None if it has no place there."""
    stem, _, kind = gguf_name.rpartition(".")  # kind: weight or bias
    if kind not in ("weight", "bias"):
        return None
    if stem in _TOP:
        return f"{_TOP[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    role = spec.ffn_norm if parts[2] == "ffn_norm" else _BLOCK.get(parts[2])
    return f"model.layers.{parts[1]}.{role}.{kind}" if role else None


def check_tensors(reader: GGUFReader, spec: ArchSpec, path: Path) -> None:
    """Fail before any work on a tensor we could not convert: unknown name or type."""
    for tensor in reader.tensors:
        if mlx_name(tensor.name, spec) is None:
            raise SpecmlxError(
                f"{path}: tensor {tensor.name} has no counterpart in an mlx-lm {spec.model_type} model"
            )
        if tensor.tensor_type not in SUPPORTED_TYPES:
            names = ", ".join(t.name for t in SUPPORTED_TYPES)
            raise SpecmlxError(
                f"{path}: tensor {tensor.name} has type {tensor.tensor_type.name}, "
                f"which specmlx cannot convert (supported: {names})"
            )


def dequantized(tensor: ReaderTensor) -> np.ndarray:
    """The tensor as float32, in numpy dimension order (ggml's `ne` reversed)."""
    shape = tuple(int(n) for n in reversed(tensor.shape))
    if tensor.tensor_type == Q.F32:
        values = np.asarray(tensor.data, dtype=np.float32)
    else:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
    return values.reshape(shape)


def unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's `LlamaModel.permute` on q/k rows (weight or bias).

    llama.cpp regroups each head's rows from HF's two halves `[x0..x(d/2-1) | y0..]` into
    interleaved pairs `(x0, y0), (x1, y1), ...` for its GPT-J style rotary kernel; mlx-lm's llama
    rotates halves (rope_traditional=False), so we put the halves back.
    """
    head_dim = rows.shape[0] // n_head
    tail = rows.shape[1:]
    return rows.reshape(n_head, head_dim // 2, 2, *tail).swapaxes(1, 2).reshape(rows.shape)


def to_hf_layout(
    name: str, values: np.ndarray, spec: ArchSpec, n_head: int, n_kv_head: int
) -> np.ndarray:
    """Undo what llama.cpp's converter did to this tensor for its own kernels."""
    if spec.permute_qk and ".self_attn.q_proj." in name:
        return unpermute(values, n_head)
    if spec.permute_qk and ".self_attn.k_proj." in name:
        return unpermute(values, n_kv_head)
    if spec.norm_shift and name.endswith("norm.weight"):
        return values - np.float32(spec.norm_shift)
    return values


def weights(
    reader: GGUFReader, spec: ArchSpec, n_head: int, n_kv_head: int
) -> Iterator[tuple[str, np.ndarray]]:
    """`(mlx-lm name, float32 array)` for every tensor, one at a time, in file order."""
    for tensor in reader.tensors:
        name = mlx_name(tensor.name, spec)
        assert name is not None  # check_tensors ran first
        yield name, to_hf_layout(name, dequantized(tensor), spec, n_head, n_kv_head)
