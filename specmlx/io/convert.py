"""GGUF file -> mlx-lm model folder (config.json, safetensors weights, tokenizer files).

`convert_gguf` reads the file once, tensor by tensor: each is dequantized to float32 (gguf-py),
put back in the layout of the HF checkpoint llama.cpp converted from (`gguf_tensors`), and cast
to the requested dtype, so at most one float32 copy of the model is ever held. The tokenizer is
rebuilt from the metadata (`gguf_tokenizer`). Everything is written into a hidden folder beside
OUT and renamed into place at the end: an error or Ctrl-C leaves no partial folder behind.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np

from specmlx.errors import SpecmlxError, UsageError
from specmlx.io.gguf_tensors import ArchSpec, GGUFFile

DTYPES = ("float32", "bfloat16", "float16")
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)


def _config(gguf: GGUFFile, spec: ArchSpec) -> dict:
    """The mlx-lm config.json for this file, from its metadata and tensor table."""
    from specmlx.io.gguf_tokenizer import stop_token_ids

    meta = gguf.meta
    arch = meta["general.architecture"]

    def get(key: str, default: object = None) -> object:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise SpecmlxError(f"the GGUF metadata has no {arch}.{key}")
        return value

    names = {t.name for t in gguf.tensors}
    embed = next((t for t in gguf.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise SpecmlxError(f"{gguf.path} has no token_embd.weight tensor")
    n_head = int(get("attention.head_count"))
    config: dict = {
        "model_type": spec.model_type,
        "hidden_size": int(get("embedding_length")),
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(get("attention.head_count_kv", n_head)),
        "rms_norm_eps": _float32(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32(get("rope.freq_base", 10000.0)),
        "vocab_size": embed.shape[0],
        "tie_word_embeddings": "output.weight" not in names,
    }
    if f"{arch}.context_length" in meta:
        config["max_position_embeddings"] = int(meta[f"{arch}.context_length"])
    if f"{arch}.attention.key_length" in meta:
        config["head_dim"] = int(meta[f"{arch}.attention.key_length"])
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif scaling != "none":
        raise SpecmlxError(f"rope scaling {scaling!r} is not supported (only linear)")
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in names
        config["mlp_bias"] = "blk.0.ffn_up.bias" in names
    if arch == "gemma3":
        head_dim = int(get("attention.key_length", 256))
        config["head_dim"] = head_dim
        config["sliding_window"] = int(get("attention.sliding_window", 512))
        # llama.cpp hard-codes these for gemma3 when the file does not say: every 6th layer
        # is global, local layers rotate with base 10000, and queries are scaled by
        # 1/sqrt(head_dim) except on the 27B (62 layers), which uses hidden/heads.
        pattern = get("attention.sliding_window_pattern", 6)
        config["sliding_window_pattern"] = _swa_pattern(pattern, config["num_hidden_layers"])
        config["rope_local_base_freq"] = _float32(get("rope.freq_base_swa", 10000.0))
        big = config["num_hidden_layers"] == 62
        config["query_pre_attn_scalar"] = config["hidden_size"] // n_head if big else head_dim
    stops = stop_token_ids(meta)
    if stops:
        config["eos_token_id"] = stops if len(stops) > 1 else stops[0]
    if "tokenizer.ggml.bos_token_id" in meta:
        config["bos_token_id"] = int(meta["tokenizer.ggml.bos_token_id"])
    return config


def _swa_pattern(pattern: object, n_layers: int) -> int:
    """mlx-lm's `sliding_window_pattern` (every n-th layer is global) from the GGUF value.

    llama.cpp writes either that period, or one flag per layer (True: sliding window).
    """
    if isinstance(pattern, int):
        return pattern
    flags = [bool(f) for f in pattern]  # type: ignore[attr-defined]
    period = flags.index(False) + 1 if False in flags else n_layers + 1
    if flags != [(i + 1) % period != 0 for i in range(len(flags))]:
        raise SpecmlxError("the GGUF's sliding-window layers do not repeat with a fixed period")
    return period


def _check_options(dtype: str, quantize: int | None, group_size: int) -> None:
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if quantize is not None and quantize not in BITS:
        raise UsageError(f"--quantize must be 4 or 8, not {quantize}")
    if group_size not in GROUP_SIZES:
        raise UsageError(f"--group-size must be 32, 64 or 128, not {group_size}")


def _write(
    src: Path, folder: Path, dtype: str, quantize: int | None, group_size: int, progress: bool
) -> None:
    """Convert `src` into the (empty, fresh) `folder`."""
    import mlx.core as mx
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specmlx.io.gguf_tensors import architecture, check_tensors, open_gguf, weights
    from specmlx.io.gguf_tokenizer import build_tokenizer

    gguf = open_gguf(src)
    spec = architecture(gguf)
    check_tensors(gguf, spec)
    config = _config(gguf, spec)
    tokenizer, tokenizer_config = build_tokenizer(gguf.meta)

    target = getattr(mx, dtype)
    converted: dict[str, mx.array] = {}
    columns = (TextColumn("converting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    console = Console(stderr=True)
    with Progress(*columns, console=console, disable=not progress, transient=True) as bar:
        task = bar.add_task("tensors", total=len(gguf.tensors))
        n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
        for name, values in weights(gguf, spec, n_head, n_kv):
            array = mx.array(values).astype(target)
            mx.eval(array)  # materialize now, so the float32 numpy copy can go
            converted[name] = array
            del values
            bar.advance(task)

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    if hasattr(model, "sanitize"):
        converted = model.sanitize(converted)
    try:
        model.load_weights(list(converted.items()), strict=True)
    except ValueError as exc:
        reason = " ".join(str(exc).split())
        raise SpecmlxError(
            f"{src}: tensors do not fit an mlx-lm {spec.model_type} model: {reason}"
        ) from None
    del converted
    if quantize is not None:
        with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints bits-per-weight
            model, config = quantize_model(model, config, group_size, quantize)
    save_model(folder, model, donate_model=True)
    save_config(config, folder / "config.json")
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _float32(value: object) -> float:
    """A float32 metadata value as the shortest decimal that reads back the same (1e-05)."""
    return float(str(np.float32(value)))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def convert_gguf(
    src: Path,
    out: Path,
    *,
    dtype: str = "float32",
    quantize: int | None = None,
    group_size: int = 64,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Convert the GGUF file `src` into the mlx-lm model folder `out`; return `out`.

    Weights are written in `dtype`, or quantized to `quantize` bits in groups of `group_size`.
    `out` must not exist unless `force`, in which case it is replaced only once the new folder
    is complete. Every bad input raises SpecmlxError with a one-line message.
    """
    src, out = Path(src), Path(out)
    _check_options(dtype, quantize, group_size)
    if (out.exists() or out.is_symlink()) and not force:
        raise SpecmlxError(f"{out} already exists (use --force to replace it)")
    if not src.is_file():
        raise SpecmlxError(f"{src}: no such file")
    out.parent.mkdir(parents=True, exist_ok=True)
    # The temporary folder sits beside OUT so the final rename stays on one filesystem.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the result should not be
        _write(src, tmp, dtype, quantize, group_size, progress)
        if out.exists() or out.is_symlink():
            old = out.parent / f".{out.name}.{uuid.uuid4().hex[:8]}.old"
            out.rename(old)
            try:
                tmp.rename(out)
            except BaseException:
                old.rename(out)  # put the previous folder back
                raise
            _remove(old)
        else:
            tmp.rename(out)
    except BaseException:
        _remove(tmp)
        raise
    return out
