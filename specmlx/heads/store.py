"""Heads on disk: our folders written and read, published layouts found, Hub repos fetched.

Ours (`save_heads`): `config.json` (the HeadsConfig) and `model.safetensors` (the trainable
weights, and "d2t" when the draft vocabulary is a subset), written all or nothing.
`load_heads` reads them, or a published layout (Medusa, EAGLE, EAGLE-3) where it is, through
`specmlx.heads.formats`; either way the heads are checked against the target first.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from specmlx.errors import SpecmlxError
from specmlx.heads.base import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    Heads,
    HeadsConfig,
    check_target,
    check_weights,
)
from specmlx.heads.kinds import head_kind, published_titles

HUB_PATTERNS = ["*.json", "*.safetensors"]


def save_heads(heads: Heads, out_dir: str | Path, dtype: mx.Dtype | None = None) -> Path:
    """Write `heads` to `out_dir` (config.json, model.safetensors), all or nothing; `dtype`
    stores the floating-point weights in it (bfloat16: half the file), read back in the
    heads' own dtype.

    The files go to a temporary folder beside `out_dir` that is renamed into place, so an
    error or a Ctrl-C midway leaves `out_dir` as it was. An existing heads folder there is
    replaced; any other existing folder is refused.
    """
    out_dir = Path(out_dir).expanduser()
    if out_dir.exists() and not _replaceable(out_dir):
        raise SpecmlxError(f"{out_dir} exists and is not a heads folder: not overwriting it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(heads.trainable_parameters()))
    if dtype is not None:
        weights = {
            k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in weights.items()
        }
    if heads.d2t is not None:
        weights["d2t"] = heads.d2t.astype(mx.int32)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.saving-", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would become the folder's own
    old = None
    try:
        mx.save_safetensors(str(staging / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
        config = json.dumps(heads.config.to_dict(), indent=2)
        (staging / CONFIG_FILE).write_text(config + "\n")
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{staging.name.rsplit('-', 1)[-1]}")
            out_dir.rename(old)
        staging.rename(out_dir)
    except BaseException:
        if old is not None and not out_dir.exists():
            old.rename(out_dir)  # put the previous heads back
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out_dir


def _replaceable(folder: Path) -> bool:
    if not folder.is_dir():
        return False
    entries = {p.name for p in folder.iterdir()}
    return not entries or (entries <= {CONFIG_FILE, WEIGHTS_FILE} and _is_ours(folder))


def _is_ours(folder: Path) -> bool:
    try:
        data = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "kind" in data and "draft_vocab" in data


def load_heads(ref: str | Path, model: nn.Module, tokenizer: Any | None) -> Heads:
    """The heads in `ref` (a folder, or a Hugging Face repo id), checked against `model`.

    Our own folders are recognised by their config; Medusa, EAGLE and EAGLE-3 layouts as
    published are read by `specmlx.heads.formats`.
    """
    folder = _resolve(str(ref))
    if _is_ours(folder):
        return _load_ours(folder, model, tokenizer)
    from specmlx.heads.formats import read_published

    heads = read_published(folder, model, tokenizer)
    if heads is None:
        raise SpecmlxError(
            f"{ref} holds no heads: neither a specmlx heads folder nor a {published_titles()} "
            "checkpoint in safetensors"
        )
    return heads


def _load_ours(folder: Path, model: nn.Module, tokenizer: Any | None) -> Heads:
    config = HeadsConfig.from_dict(json.loads((folder / CONFIG_FILE).read_text()))
    check_target(config.fingerprint, model, tokenizer)
    if not (folder / WEIGHTS_FILE).is_file():
        raise SpecmlxError(f"{folder} has no {WEIGHTS_FILE}")
    weights = mx.load(str(folder / WEIGHTS_FILE))
    d2t = weights.pop("d2t", None)
    if (d2t is None) != (config.draft_vocab == config.target_vocab) or (
        d2t is not None and d2t.shape != (config.draft_vocab,)
    ):
        raise SpecmlxError(f"{folder}: the draft vocabulary does not match its config")
    module = head_kind(config.kind).module_class()
    # Full vocabulary: the plain two-argument create every kind has.
    heads = module.create(config, model) if d2t is None else module.create(config, model, d2t=d2t)
    expected = dict(tree_flatten(heads.trainable_parameters()))
    check_weights(expected, weights, str(folder / WEIGHTS_FILE))
    # Stored narrower (`save_heads(dtype=...)`): computed in the heads' own dtype.
    weights = {k: v.astype(expected[k].dtype) for k, v in weights.items()}
    heads.load_weights(list(weights.items()), strict=False)
    mx.eval(heads.parameters())
    return heads


def _resolve(ref: str) -> Path:
    """A local folder for `ref`: itself, or the Hub snapshot of repo `ref` (cache first)."""
    from specmlx.io.resolve import HUB_REPO, looks_like_path

    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise SpecmlxError(f"{ref} is a file; heads are a folder (config.json and weights)")
    if looks_like_path(ref) or not HUB_REPO.match(ref):
        raise SpecmlxError(f"no heads folder at {ref}")
    return _from_hub(ref)


def _from_hub(repo: str) -> Path:
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:
        raise SpecmlxError(
            f"fetching heads {repo} needs huggingface_hub (pip install huggingface_hub)"
        ) from None
    from specmlx.io.resolve import unreachable_errors

    try:
        return Path(
            huggingface_hub.snapshot_download(
                repo, allow_patterns=HUB_PATTERNS, local_files_only=True
            )
        )
    except errors.LocalEntryNotFoundError:
        pass  # not cached: ask the Hub (which says no itself when HF_HUB_OFFLINE is set)
    except errors.HFValidationError as exc:
        raise SpecmlxError(f"{repo!r} is not a valid Hugging Face repo id: {exc}") from None
    try:
        return Path(huggingface_hub.snapshot_download(repo, allow_patterns=HUB_PATTERNS))
    except errors.RepositoryNotFoundError:
        raise SpecmlxError(f"heads {repo} were not found on the Hugging Face Hub") from None
    except unreachable_errors() as exc:
        from huggingface_hub.constants import is_offline_mode

        why = "HF_HUB_OFFLINE is set" if is_offline_mode() else type(exc).__name__
        raise SpecmlxError(
            f"cannot reach the Hugging Face Hub ({why}) and heads {repo} are not in its "
            "local cache; pass a local heads folder"
        ) from None
