"""Turn whatever the user typed as a model into a local mlx-lm model folder.

A reference is tried as, in order: an existing path (an mlx-lm folder, or a `.gguf` file that
is converted once into a cache keyed by its sha256), a registry alias (its offline copy in
`<models>/local/<alias>` when fetched, else its Hugging Face repo), and a Hugging Face repo id
`org/name` (the local Hub cache first, so cached repos work offline, then a download). Every
failure is one line that says what to do, above all when the Hub cannot be reached.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

from specmlx.errors import SpecmlxError
from specmlx.io.fetch import sha256_file
from specmlx.io.files import write_atomic
from specmlx.io.registry import ModelEntry, load_registry, local_model_dir, user_cache_dir

# What mlx-lm needs from a Hub repo. `model*.safetensors`, as mlx-lm loads, skips duplicate
# checkpoints some repos also carry (consolidated.safetensors) and any GGUF or PyTorch files.
HUB_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "tokenizer*",
    "*.tiktoken",
    "*.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]
# A Hugging Face repo id: `org/name`.
HUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def resolve_model(ref: str, *, progress: bool = True) -> Path:
    """A local mlx-lm model folder (one with config.json) for `ref`."""
    path = Path(ref).expanduser()
    if path.exists():
        return _from_path(path, progress=progress)
    registry = load_registry()
    if ref in registry.models:
        return _from_alias(registry.get(ref), progress=progress)
    if looks_like_path(ref):
        raise SpecmlxError(f"no such file or folder: {ref}")
    if HUB_REPO.match(ref):
        return _from_hub(ref, progress=progress)
    raise SpecmlxError(
        f"unknown model {ref!r}: not a local folder or .gguf file, not a registry alias "
        f"({', '.join(registry.aliases)}), not a Hugging Face repo id (org/name)"
    )


def looks_like_path(ref: str) -> bool:
    """Whether `ref` can only be meant as a path (so a missing one is not tried on the Hub)."""
    if ref.startswith((".", "/", "~")) or ref.lower().endswith(".gguf") or ref.count("/") > 1:
        return True
    head, slash, _ = ref.partition("/")
    return bool(slash) and Path(head).is_dir()  # "models/x" when ./models exists


def _from_path(path: Path, *, progress: bool) -> Path:
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecmlxError(f"{path} is not an mlx-lm model folder (it has no config.json)")
        return path.resolve()
    if path.suffix.lower() == ".gguf":
        return _from_gguf(path.resolve(), progress=progress)
    raise SpecmlxError(f"{path} is neither an mlx-lm model folder nor a .gguf file")


def _from_gguf(path: Path, *, progress: bool) -> Path:
    """Convert a GGUF once into `<cache>/gguf/<sha256[:16]>/`, then reuse that folder."""
    out = user_cache_dir() / "gguf" / gguf_sha256(path, progress=progress)[:16]
    if (out / "config.json").is_file():
        return out
    from specmlx.io.convert import convert_gguf

    return convert_gguf(path, out, force=True, progress=progress)


def gguf_sha256(path: Path, *, progress: bool = True) -> str:
    """The file's sha256, remembered by (path, size, mtime) so a 1 GB file is hashed once."""
    index_path = user_cache_dir() / "gguf" / "hashes.json"
    stat = path.stat()
    key = str(path.resolve())
    stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    if not isinstance(index, dict):
        index = {}
    known = index.get(key)
    if isinstance(known, dict) and {k: known.get(k) for k in stamp} == stamp:
        return known["sha256"]
    digest = sha256_file(path, progress=progress, label=f"hashing {path.name}")
    index[key] = {**stamp, "sha256": digest}
    index_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(index_path, json.dumps(index, indent=1) + "\n")
    return digest


def _from_alias(entry: ModelEntry, *, progress: bool) -> Path:
    local = local_model_dir(entry.alias)
    if (local / "config.json").is_file():
        return local
    return _from_hub(entry.hf_repo, alias=entry.alias, progress=progress)


def _from_hub(repo: str, *, alias: str | None = None, progress: bool) -> Path:
    """The repo's snapshot folder: from the Hub cache when there, else downloaded."""
    import huggingface_hub
    from huggingface_hub import errors

    try:
        found = huggingface_hub.snapshot_download(
            repo, allow_patterns=HUB_PATTERNS, local_files_only=True
        )
        return _checked(Path(found), repo)
    except errors.LocalEntryNotFoundError:
        pass  # not cached (or cached partially): ask the Hub
    except errors.HFValidationError as exc:
        raise SpecmlxError(f"{repo!r} is not a valid Hugging Face repo id: {exc}") from None
    try:
        with _hub_progress_bars(progress):
            found = huggingface_hub.snapshot_download(repo, allow_patterns=HUB_PATTERNS)
    except errors.RepositoryNotFoundError:
        raise SpecmlxError(
            f"{repo} was not found on the Hugging Face Hub (or it is gated or private: "
            "accept its license and log in with `hf auth login`)"
        ) from None
    except unreachable_errors() as exc:
        raise SpecmlxError(_offline_message(repo, alias, exc)) from None
    return _checked(Path(found), repo)


def _checked(folder: Path, repo: str) -> Path:
    if not (folder / "config.json").is_file():
        raise SpecmlxError(f"{repo} has no config.json, so it is not an mlx-lm model repo")
    return folder


def unreachable_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "no Hub today", from whichever HTTP client the hub uses."""
    from huggingface_hub import errors

    kinds: list[type[BaseException]] = [
        errors.LocalEntryNotFoundError,  # what snapshot_download raises once it gives up
        errors.OfflineModeIsEnabled,
        errors.HfHubHTTPError,  # 5xx: the Hub is down
        ConnectionError,
        TimeoutError,
    ]
    for client in ("httpx2", "httpx", "requests"):
        try:
            module = __import__(client)
        except ImportError:
            continue
        for name in ("TransportError", "ConnectionError", "Timeout"):
            kind = getattr(module, name, None)
            if isinstance(kind, type) and issubclass(kind, BaseException):
                kinds.append(kind)
    return tuple(kinds)


def _offline_message(repo: str, alias: str | None, exc: BaseException) -> str:
    from huggingface_hub.constants import is_offline_mode

    if is_offline_mode():
        why = "HF_HUB_OFFLINE is set"
    else:  # the hub wraps the network error; its own class says more
        why = type(exc.__cause__ or exc).__name__
    alias = alias or next(
        (e.alias for e in load_registry().models.values() if repo in (e.hf_repo, *e.mlx_repos)),
        None,
    )
    fetch = f"`specmlx fetch {alias}`" if alias else "`specmlx fetch ALIAS` (see `specmlx models`)"
    return (
        f"cannot reach the Hugging Face Hub ({why}) and {repo} is not in its local cache; "
        f"offline, run `make models` or {fetch}, or pass a local mlx-lm folder or a .gguf file"
    )


@contextlib.contextmanager
def _hub_progress_bars(enabled: bool) -> Iterator[None]:
    """Silence the Hub's tqdm bars for the duration when progress is off."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    silence = not enabled and not are_progress_bars_disabled()
    if silence:
        disable_progress_bars()
    try:
        yield
    finally:
        if silence:
            enable_progress_bars()
