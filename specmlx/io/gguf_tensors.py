"""Reading a GGUF file: its metadata, and its tensors as mlx-lm weights.

GGUF stores every tensor under llama.cpp's names, in ggml's dimension order (fastest first,
the reverse of numpy's), often quantized in blocks, and sometimes rearranged for llama.cpp's
kernels. This module undoes all of that, one tensor at a time: `open_gguf` checks and parses the
file (metadata as plain Python values, tensor table), and `weights` yields
`(mlx-lm name, float32 numpy array)` pairs in the layout the HF checkpoint had.

The header is parsed here, not by gguf-py's GGUFReader, which makes numpy views for each string
of an array: slow in proportion to the vocabulary, and vocabularies reach 262k tokens. Tensor
data is dequantized by gguf-py's numpy code, which is also the test reference.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize

from specmlx.errors import SpecmlxError

Q = GGMLQuantizationType
V = GGUFValueType
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


class _Corrupt(Exception):
    """The header does not parse; the message says where."""


# The fixed-size GGUF metadata value types, as little-endian numpy dtypes (all but STRING and
# ARRAY). The keys are IntEnum members, so a raw type id read from the file looks them up.
_VALUE_DTYPES = {
    V.UINT8: "<u1", V.INT8: "<i1", V.UINT16: "<u2", V.INT16: "<i2", V.UINT32: "<u4",
    V.INT32: "<i4", V.FLOAT32: "<f4", V.BOOL: "?", V.UINT64: "<u8", V.INT64: "<i8",
    V.FLOAT64: "<f8",
}  # fmt: skip


class _Cursor:
    """Reads the header sequentially, refusing to run past the end of the file."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.pos = buffer, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buffer):
            raise _Corrupt(f"the header runs past the end of the file at byte {self.pos}")
        self.pos += n
        return self.buffer[self.pos - n : self.pos]

    def number(self, kind: int) -> int | float | bool:
        dtype = np.dtype(_VALUE_DTYPES[kind])
        return np.frombuffer(self.take(dtype.itemsize), dtype)[0].item()

    def string(self) -> str:
        return self.take(int(self.number(V.UINT64))).decode("utf-8", errors="replace")

    def value(self, kind: int) -> object:
        if kind == V.STRING:
            return self.string()
        if kind == V.ARRAY:
            inner, count = int(self.number(V.UINT32)), int(self.number(V.UINT64))
            if inner in _VALUE_DTYPES:
                dtype = np.dtype(_VALUE_DTYPES[inner])
                return np.frombuffer(self.take(count * dtype.itemsize), dtype).tolist()
            return [self.value(inner) for _ in range(count)]
        if kind in _VALUE_DTYPES:
            return self.number(kind)
        raise _Corrupt(f"unknown metadata value type {kind} at byte {self.pos}")


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in the file."""

    name: str
    type_id: int  # a GGMLQuantizationType value, or an id gguf-py does not know
    shape: tuple[int, ...]  # numpy order: ggml's ne reversed
    offset: int  # from the start of the file
    nbytes: int  # -1 for a type gguf-py does not know

    @property
    def quant_type(self) -> GGMLQuantizationType | None:
        """The ggml type, or None for an id gguf-py does not know."""
        try:
            return Q(self.type_id)
        except ValueError:
            return None

    @property
    def type_name(self) -> str:
        quant = self.quant_type
        return quant.name if quant is not None else f"unknown type {self.type_id}"


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF header over the memory-mapped file; tensor data is read on demand."""

    path: Path
    meta: dict[str, object]
    tensors: list[TensorInfo]
    buffer: mmap.mmap


def _parse(path: Path, buffer: mmap.mmap) -> GGUFFile:
    cursor = _Cursor(buffer)
    cursor.take(4)  # magic, checked by the caller
    version = cursor.number(V.UINT32)
    if version not in (2, 3):
        raise _Corrupt(f"GGUF version {version} is not 2 or 3")
    n_tensors, n_meta = cursor.number(V.UINT64), cursor.number(V.UINT64)
    meta = {}
    for _ in range(int(n_meta)):
        key = cursor.string()
        meta[key] = cursor.value(int(cursor.number(V.UINT32)))
    entries = []
    for _ in range(int(n_tensors)):
        name = cursor.string()
        dims = [int(cursor.number(V.UINT64)) for _ in range(int(cursor.number(V.UINT32)))]
        type_id, offset = int(cursor.number(V.UINT32)), cursor.number(V.UINT64)
        entries.append((name, type_id, tuple(reversed(dims)), offset))
    align = int(meta.get("general.alignment", 32))  # type: ignore[call-overload]
    data_start = -(-cursor.pos // align) * align
    tensors = []
    for name, type_id, shape, offset in entries:
        nbytes = -1
        if type_id in GGML_QUANT_SIZES:  # IntEnum keys: the raw id looks them up
            block, size = GGML_QUANT_SIZES[Q(type_id)]
            nbytes = math.prod(shape) // block * size
        tensors.append(TensorInfo(name, type_id, shape, data_start + int(offset), nbytes))
    return GGUFFile(path, meta, tensors, buffer)


def open_gguf(path: Path) -> GGUFFile:
    """The parsed header of `path`, or a one-line SpecmlxError saying what is wrong with it."""
    if not path.exists():
        raise SpecmlxError(f"{path}: no such file")
    if not path.is_file():
        raise SpecmlxError(f"{path} is not a file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise SpecmlxError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        gguf = _parse(path, buffer)
    except (_Corrupt, ValueError, OverflowError, MemoryError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise SpecmlxError(f"{path} is a truncated or corrupt GGUF file ({reason})") from None
    for tensor in gguf.tensors:
        end = tensor.offset + max(tensor.nbytes, 0)
        if end > len(buffer):
            raise SpecmlxError(
                f"{path} is truncated: tensor {tensor.name} ends at byte {end}, "
                f"the file has {len(buffer)}"
            )
    return gguf


def architecture(gguf: GGUFFile) -> ArchSpec:
    """The spec for the file's `general.architecture`, or an error naming it."""
    arch = gguf.meta.get("general.architecture")
    if arch is None:
        raise SpecmlxError(f"{gguf.path} has no general.architecture in its metadata")
    if arch not in ARCHS:
        supported = ", ".join(ARCHS)
        raise SpecmlxError(
            f"{gguf.path}: architecture {arch!r} is not supported (supported: {supported}); "
            "load other models, hybrids included, from their Hugging Face or mlx-lm folder"
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


def check_tensors(gguf: GGUFFile, spec: ArchSpec) -> None:
    """Fail before any work on a tensor we could not convert: unknown name or type."""
    for tensor in gguf.tensors:
        if mlx_name(tensor.name, spec) is None:
            raise SpecmlxError(
                f"{gguf.path}: tensor {tensor.name} has no counterpart in an mlx-lm "
                f"{spec.model_type} model"
            )
        if tensor.quant_type not in SUPPORTED_TYPES:
            names = ", ".join(t.name for t in SUPPORTED_TYPES)
            raise SpecmlxError(
                f"{gguf.path}: tensor {tensor.name} has type {tensor.type_name}, "
                f"which specmlx cannot convert (supported: {names})"
            )


def dequantized(gguf: GGUFFile, tensor: TensorInfo) -> np.ndarray:
    """The tensor as float32, in numpy dimension order."""
    raw = np.frombuffer(gguf.buffer, np.uint8, tensor.nbytes, tensor.offset)
    rows = raw.reshape(-1, tensor.nbytes // max(math.prod(tensor.shape[:-1]), 1))
    values = dequantize(rows, tensor.quant_type).astype(np.float32, copy=False)
    return values.reshape(tensor.shape)


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
    gguf: GGUFFile, spec: ArchSpec, n_head: int, n_kv_head: int
) -> Iterator[tuple[str, np.ndarray]]:
    """`(mlx-lm name, float32 array)` for every tensor, one at a time, in file order."""
    for tensor in gguf.tensors:
        name = mlx_name(tensor.name, spec)
        assert name is not None  # check_tensors ran first
        yield name, to_hf_layout(name, dequantized(gguf, tensor), spec, n_head, n_kv_head)
